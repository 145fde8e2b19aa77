//! Merging LoRA adapters into the base weights: `W' = W + scale·(A·B)ᵀ`
//! for a linear layer (Phi-3's fused projections included, as stored), and
//! `W'[e] = W[e] + scale·B[e]·A[e]` for each expert of a sparse layer,
//! dequantizing quantized layers first and quantizing them back with the
//! same group size and bits (or leaving the whole model dense).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::ops::{dequantize, matmul, quantize};
use mlx_rs::{Array, Dtype};

use crate::adapters;
use crate::model::decoder::FeedForward;
use crate::model::layers::QuantSpec;
use crate::model::Model;
use crate::train::lora::{Site, SiteKind};

#[derive(Clone, Debug, serde::Serialize)]
pub struct FuseReport {
    pub fused_layers: usize,
    pub dequantized: bool,
    pub output: std::path::PathBuf,
}

/// Fuses the adapter in `adapter_dir` into the model in `model_dir` and
/// writes a complete model directory to `out`.
pub fn fuse(
    model_dir: &Path,
    adapter_dir: &Path,
    out: &Path,
    dequantize_all: bool,
) -> Result<FuseReport> {
    if out.exists() && out.canonicalize().ok() == model_dir.canonicalize().ok() {
        bail!("the output directory must differ from the model directory");
    }
    let model = Model::load(model_dir)?;
    let layout = adapters::read_layout(&model, adapter_dir)?;
    let params = adapters::load_params(
        &model,
        &layout,
        &adapter_dir.join(adapters::WEIGHTS_FILE),
        None,
    )?;
    let (_, mut config) = crate::model::read_config(model_dir)?;
    let quantization = config.get("quantization").cloned();
    let mut tensors = read_tensors(model_dir)?;

    for (site, ab) in layout.sites.iter().zip(params.chunks(2)) {
        let prefix = site.path();
        let wkey = format!("{prefix}.weight");
        if !tensors.contains_key(&wkey) {
            if let Some((experts, count)) = per_expert_source(&model, site) {
                stack_experts(&mut tensors, &experts, &prefix, count)?;
            }
        }
        let base = tensors
            .remove(&wkey)
            .ok_or_else(|| anyhow!("the model has no tensor {wkey}"))?;
        let quant = tensors.contains_key(&format!("{prefix}.scales"));
        let (dense, dtype, spec) = if quant {
            let spec = quant_spec(quantization.as_ref(), &prefix).ok_or_else(|| {
                anyhow!("{prefix} is quantized but config.json has no quantization")
            })?;
            let scales = tensors
                .remove(&format!("{prefix}.scales"))
                .expect("checked");
            let biases = tensors
                .remove(&format!("{prefix}.biases"))
                .ok_or_else(|| anyhow!("{prefix} has scales but no biases"))?;
            let dtype = scales.dtype();
            let w = dequantize(
                &base,
                scales.as_dtype(Dtype::Float32)?,
                &biases.as_dtype(Dtype::Float32)?,
                spec.group_size,
                spec.bits,
            )?;
            (w, dtype, Some(spec))
        } else {
            let dtype = base.dtype();
            (base.as_dtype(Dtype::Float32)?, dtype, None)
        };
        // (x·A)·B·scale == x·(scale·(A·B)); the weight is stored [out, in]
        // (experts: [experts, out, in], a [experts, r, in], b [experts, out, r]).
        // The same operation order as mlx-lm, so re-quantization rounds alike.
        let delta = match site.kind {
            SiteKind::Experts(_) => matmul(&(&ab[1] * layout.scale), &ab[0])?,
            SiteKind::Linear | SiteKind::Fused(_) => {
                matmul(&(&ab[1].t() * layout.scale), ab[0].t())?
            }
        };
        let fused = &dense + &delta;
        match spec {
            Some(spec) if !dequantize_all => {
                let (w, s, b) = quantize(&fused, spec.group_size, spec.bits)?;
                tensors.insert(wkey, w);
                tensors.insert(format!("{prefix}.scales"), s.as_dtype(dtype)?);
                tensors.insert(format!("{prefix}.biases"), b.as_dtype(dtype)?);
            }
            _ => {
                tensors.insert(wkey, fused.as_dtype(dtype)?);
            }
        }
    }

    drop(model);
    if dequantize_all {
        dequantize_rest(&mut tensors, quantization.as_ref())?;
        if let Some(obj) = config.as_object_mut() {
            obj.remove("quantization");
            obj.remove("quantization_config");
        }
    }
    write_model_dir(model_dir, out, &tensors, &config)?;
    Ok(FuseReport {
        fused_layers: layout.sites.len(),
        dequantized: dequantize_all,
        output: out.to_path_buf(),
    })
}

/// For an experts' site of a checkpoint that keeps each expert apart
/// (Hugging Face's `{parent}.experts.{e}.{name}`): that prefix without the
/// expert index and name, as `(format of "{parent}.experts", name)`, and the count.
fn per_expert_source(model: &Model, site: &Site) -> Option<((String, String), i32)> {
    let SiteKind::Experts(i) = site.kind else {
        return None;
    };
    let FeedForward::Sparse(moe) = &model.decoder.layers[site.layer].mlp else {
        return None;
    };
    let parent = moe.router_key.rsplit_once('.')?.0;
    let count = moe.switch_mlp.proj(i)?.shape().0;
    Some((
        (
            format!("model.layers.{}.{parent}.experts", site.layer),
            moe.hf_names[i].to_string(),
        ),
        count,
    ))
}

/// Stacks `{experts}.{e}.{name}.{weight,scales,biases}` into `{target}.*`.
fn stack_experts(
    tensors: &mut HashMap<String, Array>,
    (experts, name): &(String, String),
    target: &str,
    count: i32,
) -> Result<()> {
    for part in ["weight", "scales", "biases", "bias"] {
        if !tensors.contains_key(&format!("{experts}.0.{name}.{part}")) {
            continue;
        }
        let each = (0..count)
            .map(|e| {
                let key = format!("{experts}.{e}.{name}.{part}");
                tensors
                    .remove(&key)
                    .ok_or_else(|| anyhow!("the model has no tensor {key}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let stacked = mlx_rs::ops::stack(&each, 0)
            .with_context(|| format!("stacking the experts of {experts}.*.{name}"))?;
        tensors.insert(format!("{target}.{part}"), stacked);
    }
    Ok(())
}

/// The affine quantization of `prefix` from the config's `quantization`.
fn quant_spec(q: Option<&serde_json::Value>, prefix: &str) -> Option<QuantSpec> {
    let read = |v: &serde_json::Value| -> Option<QuantSpec> {
        Some(QuantSpec {
            group_size: v.get("group_size")?.as_i64()? as i32,
            bits: v.get("bits")?.as_i64()? as i32,
        })
    };
    let q = q?;
    match q.get(prefix) {
        Some(v) if v.is_object() => read(v),
        _ => read(q),
    }
}

fn dequantize_rest(
    tensors: &mut HashMap<String, Array>,
    quantization: Option<&serde_json::Value>,
) -> Result<()> {
    let prefixes: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".scales").map(String::from))
        .collect();
    for prefix in prefixes {
        let spec = quant_spec(quantization, &prefix)
            .ok_or_else(|| anyhow!("{prefix} is quantized but config.json has no quantization"))?;
        let w = tensors.remove(&format!("{prefix}.weight"));
        let s = tensors.remove(&format!("{prefix}.scales"));
        let b = tensors.remove(&format!("{prefix}.biases"));
        let (Some(w), Some(s), Some(b)) = (w, s, b) else {
            bail!("{prefix}: incomplete quantized tensor (weight, scales, biases)");
        };
        let dtype = s.dtype();
        let dense = dequantize(&w, &s, &b, spec.group_size, spec.bits)?;
        tensors.insert(format!("{prefix}.weight"), dense.as_dtype(dtype)?);
    }
    Ok(())
}

fn read_tensors(dir: &Path) -> Result<HashMap<String, Array>> {
    let mut tensors = HashMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if name.ends_with(".safetensors") && !name.starts_with("adapters") {
            crate::model::weights::check_safetensors_file(&path)?;
            let loaded = Array::load_safetensors(&path)
                .map_err(|e| anyhow!("loading {}: {e}", path.display()))?;
            tensors.extend(loaded);
        }
    }
    if tensors.is_empty() {
        bail!("no *.safetensors weights in {}", dir.display());
    }
    Ok(tensors)
}

/// Writes `tensors` as `model.safetensors`, the config, and a copy of every
/// other file of the source directory (tokenizer, templates).
fn write_model_dir(
    src: &Path,
    out: &Path,
    tensors: &HashMap<String, Array>,
    config: &serde_json::Value,
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().to_string()) else {
            continue;
        };
        let skip = name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == "config.json"
            || !path.is_file();
        if !skip {
            std::fs::copy(&path, out.join(&name))
                .with_context(|| format!("copying {name} to {}", out.display()))?;
        }
    }
    let metadata: HashMap<String, String> = [("format".to_string(), "mlx".to_string())].into();
    let file = out.join("model.safetensors");
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    Array::save_safetensors(
        names.iter().map(|n| (n.as_str(), &tensors[*n])),
        &metadata,
        &file,
    )
    .map_err(|e| anyhow!("writing {}: {e}", file.display()))?;
    let text = serde_json::to_string_pretty(config)?;
    std::fs::write(out.join("config.json"), text)
        .with_context(|| format!("writing {}", out.join("config.json").display()))
}
