//! LoRA adapters in mlx-lm's format: a directory with `adapters.safetensors`
//! (tensors `model.layers.N.<module>.lora_a` `[in, r]` and `.lora_b` `[r, out]`;
//! for experts `[experts, r, in]` and `[experts, out, r]`; module names as
//! mlx-lm's, see `lora`) and `adapter_config.json` (`fine_tune_type`, `num_layers`,
//! `lora_parameters {rank, scale, dropout, keys?}` and the training options).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::Array;

use crate::lora::{AdapterLayout, LoraParameters};
use crate::model::Model;

pub(crate) const WEIGHTS_FILE: &str = "adapters.safetensors";
pub(crate) const CONFIG_FILE: &str = "adapter_config.json";

/// Attaches the adapter in `dir` to `model`.
pub fn apply(model: &mut Model, dir: &Path) -> Result<()> {
    let layout = read_layout(model, dir)?;
    let params = load_params(model, &layout, &dir.join(WEIGHTS_FILE), None)?;
    layout.set_params(model, &params)
}

/// The adapter layout an `adapter_config.json` describes, checked against `model`.
pub(crate) fn read_layout(model: &Model, dir: &Path) -> Result<AdapterLayout> {
    if !dir.is_dir() {
        bail!("adapter directory {} does not exist", dir.display());
    }
    let path = dir.join(CONFIG_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let cfg: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let kind = cfg
        .get("fine_tune_type")
        .and_then(|v| v.as_str())
        .unwrap_or("lora");
    if kind != "lora" {
        bail!(
            "{}: fine_tune_type {kind:?} is not supported (only \"lora\")",
            path.display()
        );
    }
    let num_layers = cfg
        .get("num_layers")
        .and_then(|v| v.as_i64())
        .ok_or_else(|| anyhow!("{}: missing integer num_layers", path.display()))?;
    let params = lora_parameters(&cfg)
        .with_context(|| format!("{}: invalid lora_parameters", path.display()))?;
    AdapterLayout::new(model, num_layers, &params)
        .with_context(|| format!("adapter {} does not fit the model", dir.display()))
}

fn lora_parameters(cfg: &serde_json::Value) -> Result<LoraParameters> {
    let p = cfg
        .get("lora_parameters")
        .ok_or_else(|| anyhow!("missing lora_parameters"))?;
    let rank = p
        .get("rank")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| anyhow!("missing integer rank"))? as usize;
    let scale = match p.get("scale").and_then(|v| v.as_f64()) {
        Some(s) => s as f32,
        None if p.get("alpha").is_some() => {
            bail!("missing scale (found alpha; the format stores scale, not alpha)")
        }
        None => bail!("missing scale"),
    };
    let dropout = p.get("dropout").and_then(|v| v.as_f64()).unwrap_or(0.0) as f32;
    let keys = match p.get("keys") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value::<Vec<String>>(v.clone())
                .context("keys must be a list of module names")?,
        ),
    };
    Ok(LoraParameters {
        rank,
        scale,
        dropout,
        keys,
    })
}

/// Reads adapter tensors for `layout` from `file`, checking names and shapes.
/// Without `fallback` every site must be present; with it (a resume file),
/// the file may hold a subset and missing sites keep the fallback arrays.
pub(crate) fn load_params(
    model: &Model,
    layout: &AdapterLayout,
    file: &Path,
    fallback: Option<&[Array]>,
) -> Result<Vec<Array>> {
    crate::model::weights::check_safetensors_file(file)?;
    let mut loaded: HashMap<String, Array> = Array::load_safetensors(file)
        .map_err(|e| anyhow!("loading adapter weights {}: {e}", file.display()))?;
    let names = layout.names();
    let shapes = layout.shapes(model);
    let mut errors = Vec::new();
    let known: std::collections::HashSet<&String> = names.iter().collect();
    let mut extra: Vec<&String> = loaded.keys().filter(|k| !known.contains(k)).collect();
    extra.sort();
    for k in extra {
        errors.push(format!("  {k}: not an adapter parameter of this model"));
    }
    let mut params = Vec::with_capacity(names.len());
    for (i, (name, shape)) in names.iter().zip(&shapes).enumerate() {
        match loaded.remove(name) {
            Some(a) if a.shape() == shape.as_slice() => {
                params.push(crate::mlx_ext::cast_float(a, mlx_rs::Dtype::Float32)?)
            }
            Some(a) => errors.push(format!(
                "  {name}: shape {:?} does not match the model's {:?}",
                a.shape(),
                shape
            )),
            None => match fallback {
                Some(f) => params.push(f[i].clone()),
                None => errors.push(format!("  {name}: missing")),
            },
        }
    }
    if !errors.is_empty() {
        bail!(
            "adapter weights {} do not fit the model:\n{}",
            file.display(),
            errors.join("\n")
        );
    }
    Ok(params)
}

/// Writes `params` (in `layout` order) to `file` under mlx-lm's tensor names.
pub fn save_params(layout: &AdapterLayout, params: &[Array], file: &Path) -> Result<()> {
    let names = layout.names();
    if names.len() != params.len() {
        bail!(
            "expected {} adapter arrays, got {}",
            names.len(),
            params.len()
        );
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Array::save_safetensors(names.iter().zip(params.iter()), None, file)
        .map_err(|e| anyhow!("writing {}: {e}", file.display()))
}

/// Writes `adapter_config.json`: the options as a JSON object with sorted
/// keys, as mlx-lm writes it.
pub(crate) fn write_config(dir: &Path, options: &serde_json::Value) -> Result<()> {
    let serde_json::Value::Object(map) = options else {
        bail!("adapter options must be a JSON object");
    };
    let sorted: std::collections::BTreeMap<_, _> = map.iter().collect();
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    serde::Serialize::serialize(&sorted, &mut ser)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))
}
