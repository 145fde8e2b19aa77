//! Model conversion (`mlx-bun convert`): a GGUF file into an mlx-lm model
//! directory (here), and a Hugging Face checkpoint or an mlx-lm directory into
//! a quantized, dequantized or re-typed mlx-lm copy (`hf`).

pub mod card;
pub mod dynamic;
pub mod family;
mod fp8;
pub mod gguf;
pub mod gguf_llama;
pub mod gguf_tokenizer;
pub mod hf;
pub mod output;
pub mod quantize;
pub mod safetensors_out;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::io::GgufFile;
use mlx_rs::Dtype;
use serde_json::{json, Map, Value};

use crate::mlx_ext::dtype_name;
use crate::quant::QuantSpec;
use gguf::{GgmlType, GgufHeader};
use output::{Commit, StagingDir};
use quantize::TensorSet;

/// What to produce.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// The directory the converted model is written to (`--mlx-path`).
    pub output: PathBuf,
    /// The dtype of every floating tensor written (norms, scales, biases, dense weights).
    pub dtype: Dtype,
    /// Store every quantized layer as a dense `dtype` weight.
    pub dequantize: bool,
    /// Quantize every linear layer and embedding with this spec.
    pub quantize: Option<QuantSpec>,
}

/// What a conversion wrote.
#[derive(Debug)]
pub struct Summary {
    /// The directory the model was written to.
    pub output: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: usize,
    /// The `quantization` entry written to `config.json`, if the model is quantized.
    pub quantization: Option<Value>,
    /// `AlreadyThere` when a concurrent conversion placed the output first.
    pub commit: Commit,
}

impl ConvertOptions {
    fn validate(&self) -> Result<()> {
        if self.dequantize && self.quantize.is_some() {
            bail!("--dequantize and --quantize exclude each other");
        }
        if let Some(spec) = self.quantize {
            quantize::validate_spec(spec)?;
        }
        if !matches!(
            self.dtype,
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
        ) {
            bail!("the output dtype must be float32, float16 or bfloat16");
        }
        Ok(())
    }
}

/// The affine spec MLX's GGUF loader produces for a tensor type; None for float
/// tensors; an error for types it cannot read.
fn gguf_quant_spec(name: &str, t: GgmlType) -> Result<Option<QuantSpec>> {
    Ok(match t {
        GgmlType::F32 | GgmlType::F16 => None,
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some(QuantSpec::affine(32, 4)),
        GgmlType::Q8_0 => Some(QuantSpec::affine(32, 8)),
        other => bail!(
            "tensor {name:?} has type {}, which convert cannot read (supported: F32, F16, Q4_0, Q4_1, Q8_0)",
            other.name()
        ),
    })
}

/// Applies the requested dequantization, quantization and dtype, then
/// evaluates tensor by tensor, reporting each one.
fn finish(
    set: &mut TensorSet,
    opts: &ConvertOptions,
    report: &mut dyn FnMut(hf::Event),
) -> Result<()> {
    if opts.dequantize {
        set.dequantize_all(opts.dtype)?;
    }
    if let Some(spec) = opts.quantize {
        for prefix in set.matrix_layers() {
            set.quantize_layer(&prefix, spec, opts.dtype)?;
        }
    }
    set.cast(opts.dtype)?;
    let bytes = set.tensors.values().map(|a| a.nbytes() as u64).sum();
    report(hf::Event::Start {
        tensors: set.tensors.len(),
        bytes,
    });
    for (name, array) in &set.tensors {
        array.eval().with_context(|| format!("computing {name}"))?;
        report(hf::Event::Wrote {
            name,
            bytes: array.nbytes() as u64,
        });
    }
    Ok(())
}

fn insert_quantization(config: &mut Map<String, Value>, set: &TensorSet) {
    config.remove("quantization");
    config.remove("quantization_config");
    if let Some(q) = set.quantization_config() {
        config.insert("quantization".into(), q.clone());
        config.insert("quantization_config".into(), q);
    }
}

/// MLX's message without the C++ source location it appends.
fn mlx_message(raw: &str) -> String {
    let text = raw.split(" at /").next().unwrap_or(raw);
    text.trim().trim_matches('"').to_string()
}

/// Opens the GGUF tensors with MLX, whose loader insists on a `.gguf` name.
fn load_gguf_arrays(
    path: &Path,
    staging: &Path,
) -> Result<std::collections::HashMap<String, mlx_rs::Array>> {
    let readable = if path.extension().is_some_and(|e| e == "gguf") {
        path.to_path_buf()
    } else {
        let link = staging.join("input.gguf");
        let absolute = std::fs::canonicalize(path)?;
        std::os::unix::fs::symlink(&absolute, &link)
            .with_context(|| format!("linking {}", absolute.display()))?;
        link
    };
    let file = GgufFile::load(&readable)
        .map_err(|e| anyhow!(mlx_message(&e.to_string())))
        .with_context(|| format!("loading the tensors of {}", path.display()))?;
    let arrays = file
        .arrays()
        .map_err(|e| anyhow!(mlx_message(&e.to_string())))?;
    if readable != path {
        std::fs::remove_file(&readable)?;
    }
    Ok(arrays)
}

/// Converts a GGUF file (LLaMA architecture, byte-level BPE tokenizer) into an
/// mlx-lm model directory.
pub fn from_gguf(
    path: &Path,
    opts: &ConvertOptions,
    report: &mut dyn FnMut(hf::Event),
) -> Result<Summary> {
    opts.validate()?;
    if !path.is_file() {
        bail!("GGUF file {} does not exist", path.display());
    }
    let header = GgufHeader::read(path)?;
    let arch = header
        .string("general.architecture")
        .context("the GGUF metadata lacks general.architecture")?;
    if arch != gguf_llama::ARCH {
        bail!("unsupported GGUF architecture {arch:?} (supported: llama)");
    }
    let heads = gguf_llama::Heads::read(&header)?;
    let mut plan = Vec::with_capacity(header.tensors.len());
    for info in &header.tensors {
        let spec = gguf_quant_spec(&info.name, info.ggml_type)?;
        let hf = gguf_llama::hf_name(&info.name)?;
        plan.push((info, spec, hf));
    }
    let tokenizer = gguf_tokenizer::build(&header)?;

    let staging = StagingDir::new(&opts.output)?;
    let mut arrays = load_gguf_arrays(path, staging.path())?;
    let mut set = TensorSet::default();
    for (info, spec, hf) in &plan {
        let parts: &[&str] = if spec.is_some() {
            &["weight", "scales", "biases"]
        } else {
            &[""]
        };
        let gguf_stem = info.name.strip_suffix(".weight").unwrap_or(&info.name);
        let hf_stem = hf.strip_suffix(".weight").unwrap_or(hf);
        for part in parts {
            let (from, to) = if part.is_empty() {
                (info.name.clone(), hf.clone())
            } else {
                (format!("{gguf_stem}.{part}"), format!("{hf_stem}.{part}"))
            };
            let mut array = arrays
                .remove(&from)
                .with_context(|| format!("MLX did not load tensor {from:?}"))?;
            if let Some(n_head) = gguf_llama::permuted_heads(&info.name, heads) {
                array = gguf_llama::unpermute_rows(&array, n_head)
                    .with_context(|| format!("restoring the row order of {from}"))?;
            }
            set.insert(to, array);
        }
        if let Some(spec) = spec {
            set.quantized.insert(hf_stem.to_string(), *spec);
        }
    }
    finish(&mut set, opts, report)?;

    let tied = !set.tensors.contains_key("lm_head.weight");
    let attention_bias = set
        .tensors
        .contains_key("model.layers.0.self_attn.q_proj.bias");
    let mut config = gguf_llama::config(
        &header,
        &tokenizer,
        tied,
        attention_bias,
        dtype_name(opts.dtype),
    )?;
    insert_quantization(&mut config, &set);
    let mut generation = Map::new();
    if let Some(id) = tokenizer.bos_id {
        generation.insert("bos_token_id".into(), json!(id));
    }
    if let Some(id) = tokenizer.eos_id {
        generation.insert("eos_token_id".into(), json!(id));
    }

    let dir = staging.path();
    output::write_weights(dir, &set)?;
    output::write_json(dir, "config.json", &Value::Object(config))?;
    output::write_json(dir, "generation_config.json", &Value::Object(generation))?;
    output::write_json(dir, "tokenizer.json", &tokenizer.tokenizer_json)?;
    output::write_json(dir, "tokenizer_config.json", &tokenizer.tokenizer_config)?;
    output::write_json(
        dir,
        "special_tokens_map.json",
        &tokenizer.special_tokens_map,
    )?;
    summarize(set, staging, opts)
}

fn summarize(set: TensorSet, staging: StagingDir, opts: &ConvertOptions) -> Result<Summary> {
    let summary = Summary {
        output: opts.output.clone(),
        tensors: set.tensors.len(),
        bytes: set.nbytes(),
        quantization: set.quantization_config(),
        commit: Commit::Placed,
    };
    drop(set);
    let commit = staging.commit()?;
    Ok(Summary { commit, ..summary })
}
