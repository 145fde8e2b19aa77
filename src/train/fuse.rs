//! Merging LoRA adapters into the base weights: `W' = W + scale·(A·B)ᵀ`
//! for a linear layer (Phi-3's fused projections included, as stored), and
//! `W'[e] = W[e] + scale·B[e]·A[e]` for each expert of a sparse layer,
//! dequantizing quantized layers first and quantizing them back with the
//! same group size and bits (or leaving the whole model dense).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::ops::matmul;
use mlx_rs::{Array, Dtype};

use crate::adapters;
use crate::convert::quantize::quantize_with_mode;
use crate::lora::{LayerPart, Site, SiteKind};
use crate::mlx_ext::cast_float;
use crate::model::decoder::FeedForward;
use crate::model::weights::{layer_quant_spec, stack_expert_tensors};
use crate::model::Model;
use crate::quant::{dequantize, Quantization};

/// What [`fuse`] did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FuseReport {
    /// Adapted modules folded into their base weights.
    pub fused_layers: usize,
    /// Whether every quantized layer was written dequantized (`--dequantize`).
    pub dequantized: bool,
    /// The directory of the fused model.
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
    let (args, mut config) = crate::model::read_config(model_dir)?;
    let quantization = args.quantization;
    // The dtype a float-mode layer dequantizes to (its scales are 8-bit).
    let float_dtype = args
        .torch_dtype
        .as_deref()
        .and_then(crate::mlx_ext::parse_dtype)
        .unwrap_or(Dtype::Float32);
    let mut tensors = read_tensors(model_dir)?;
    // mlx-lm writes the model's parameters: a Mistral 3 checkpoint's vision
    // tensors are not among them.
    if model.args.model_type == "mistral3" {
        tensors.retain(|name, _| !crate::model::mistral3::is_vision(name));
    }

    for (site, ab) in layout.sites.iter().zip(params.chunks(2)) {
        let prefix = site.path();
        let wkey = format!("{prefix}.weight");
        if !tensors.contains_key(&wkey) {
            if let Some((experts, count)) = per_expert_source(&model, site) {
                let (experts, name) = &experts;
                stack_expert_tensors(&mut tensors, experts, name, &prefix, count)?;
            }
        }
        if !tensors.contains_key(&wkey) {
            bail!("the model has no tensor {wkey}");
        }
        let spec = layer_quant_spec(&tensors, quantization.as_ref(), &prefix)?;
        let base = tensors.remove(&wkey).expect("checked above");
        let (dense, dtype, spec) = if let Some(spec) = spec {
            let (scales, biases) = take_quant_params(&mut tensors, &prefix, spec.mode)?;
            let dtype = biases.as_ref().map_or(float_dtype, Array::dtype);
            let w = dequantize(&base, &float_scales(scales)?, biases.as_ref(), spec)?;
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
                let parts = quantize_with_mode(&fused, spec.group_size, spec.bits, spec.mode)?;
                let mut parts = parts.into_iter();
                let (Some(w), Some(s)) = (parts.next(), parts.next()) else {
                    bail!("quantizing {prefix} gave no scales");
                };
                tensors.insert(wkey, w);
                tensors.insert(format!("{prefix}.scales"), cast_float(s, dtype)?);
                if let Some(b) = parts.next() {
                    tensors.insert(format!("{prefix}.biases"), b.as_dtype(dtype)?);
                }
            }
            _ => {
                tensors.insert(wkey, fused.as_dtype(dtype)?);
            }
        }
    }

    drop(model);
    if dequantize_all {
        dequantize_rest(&mut tensors, quantization.as_ref(), float_dtype)?;
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
    if let LayerPart::Mlp(_) = site.part {
        return nemotron_h_per_expert_source(model, site, i);
    }
    let FeedForward::Sparse(moe) = &model.decoder.layers[site.block].mlp else {
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

/// `per_expert_source` for projection `i` of a Nemotron-H experts layer:
/// Hugging Face keeps `fc1` / `fc2` as `mixer.experts.{e}.up_proj` / `down_proj`.
fn nemotron_h_per_expert_source(
    model: &Model,
    site: &Site,
    i: usize,
) -> Option<((String, String), i32)> {
    let (Some(count), _, _) = crate::lora::site_dims(model, site) else {
        return None;
    };
    let name = ["up_proj", "down_proj"].get(i)?;
    let parent = format!("{}.{}.mixer.experts", site.layers_path, site.layer);
    Some(((parent, name.to_string()), count))
}

/// Takes the scales (and, in affine mode, the biases) of `prefix`.
fn take_quant_params(
    tensors: &mut HashMap<String, Array>,
    prefix: &str,
    mode: crate::quant::QuantMode,
) -> Result<(Array, Option<Array>)> {
    let scales = tensors
        .remove(&format!("{prefix}.scales"))
        .ok_or_else(|| anyhow!("{prefix} has no scales"))?;
    let biases = if mode.has_biases() {
        Some(
            tensors
                .remove(&format!("{prefix}.biases"))
                .ok_or_else(|| anyhow!("{prefix} has scales but no biases"))?,
        )
    } else {
        None
    };
    Ok((scales, biases))
}

/// Affine scales in float32 (dequantizing in float32 keeps float16 scales
/// from rounding the result); the 8-bit scales of the float modes as they are.
fn float_scales(scales: Array) -> Result<Array> {
    cast_float(scales, Dtype::Float32)
}

/// Every layer still quantized, dequantized into the dtype of its biases
/// (`float_dtype` for the float modes).
fn dequantize_rest(
    tensors: &mut HashMap<String, Array>,
    quantization: Option<&Quantization>,
    float_dtype: Dtype,
) -> Result<()> {
    let prefixes: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".scales").map(String::from))
        .collect();
    for prefix in prefixes {
        let spec = layer_quant_spec(tensors, quantization, &prefix)?
            .ok_or_else(|| anyhow!("cannot tell how {prefix} is quantized"))?;
        let w = tensors
            .remove(&format!("{prefix}.weight"))
            .ok_or_else(|| anyhow!("{prefix}: incomplete quantized tensor (no weight)"))?;
        let (s, b) = take_quant_params(tensors, &prefix, spec.mode)?;
        let dtype = b.as_ref().map_or(float_dtype, Array::dtype);
        let dense = dequantize(&w, &float_scales(s)?, b.as_ref(), spec)?;
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
