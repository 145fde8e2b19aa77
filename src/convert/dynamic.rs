//! Dynamic quantization (`convert --target-bpw`), as `mlx_lm.dynamic_quant`:
//! every quantizable layer gets a sensitivity from calibration text, and the
//! most sensitive layers get the high bit width until the model's average
//! bits per weight reaches the target; the rest get the low bit width.
//!
//! The sensitivity of a layer is a first-order estimate of how much the KL
//! divergence to the unquantized model drops when that layer moves from the
//! low to the high precision: with every quantizable weight at its low-bit
//! quantize-dequantize value, the gradient `g` of `KL(model ‖ q_model)` times
//! `(W_low − W_high)`, summed, per million weights. The threshold between
//! low and high layers is found by bisection on the model's bits per weight
//! (mlx-lm's `compute_bits_per_weight`), and the folder is written by
//! `convert` with the high layers named in the config's `quantization`.
//!
//! The same gradients predict the quantized model's perplexity (see
//! `predicted_kl`): the unquantized model's cross-entropy plus the predicted
//! KL. The measured perplexity of the written model on the same text is
//! reported beside it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::error::Exception;
use mlx_rs::ops::exp;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{eval, value_and_grad_with_argnums};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use super::hf::{self, HfOptions, HfSummary, LayerOverrides, QuantRecipe};
use crate::autodiff::forward::TrainForward;
use crate::lora::{block_linear, block_linear_mut, BLOCK_LINEARS};
use crate::model::decoder::FeedForward;
use crate::model::layers::LinearWeight;
use crate::model::Model;
use crate::quant::{QuantMode, QuantSpec};
use crate::tokenizer::Tokenizer;

/// Options, with `mlx_lm.dynamic_quant`'s defaults.
#[derive(Clone, Debug)]
pub struct DynamicOptions {
    /// The directory the quantized model is written to (`--mlx-path`, default `mlx_model`).
    pub output: PathBuf,
    /// The bits per weight to aim for (`--target-bpw`, default 5.0).
    pub target_bpw: f64,
    /// The quantization of the less sensitive layers (`--low-bits`/`--low-group-size`, default 4 bits, group 64).
    pub low: QuantSpec,
    /// The quantization of the most sensitive layers (`--high-bits`/`--high-group-size`, default 5 bits, group 64).
    pub high: QuantSpec,
    /// Calibration text: a file, folder or dataset id (`eval::data`); None:
    /// mlx-lm's own calibration file when it is in `~/.cache/mlx-lm`.
    pub data: Option<String>,
    /// Rows of this many tokens are cut from the tokenized text.
    pub sequence_length: usize,
    /// Use this many rows (after the seeded shuffle); None: all.
    pub num_samples: Option<usize>,
    /// Rows per batch when estimating sensitivities and perplexity (`--batch-size`, default 4).
    pub batch_size: usize,
    /// Seed of the row shuffle (`--seed`, default 123).
    pub seed: u64,
    /// Read the sensitivities from this JSON file instead of estimating them.
    pub sensitivities: Option<PathBuf>,
    /// Where estimated sensitivities are saved (mlx-lm's file format).
    pub save_sensitivities: Option<PathBuf>,
    /// The dtype the gradients are summed in (float32 or bfloat16).
    pub accumulation_dtype: Dtype,
    /// Dtype of the written floating tensors; None: config.json's `torch_dtype`.
    pub dtype: Option<Dtype>,
    /// The Hub repo the model came from (the card's `base_model`).
    pub base_model: Option<String>,
}

impl Default for DynamicOptions {
    fn default() -> Self {
        Self {
            output: PathBuf::from("mlx_model"),
            target_bpw: 5.0,
            low: QuantSpec::affine(64, 4),
            high: QuantSpec::affine(64, 5),
            data: None,
            sequence_length: 512,
            num_samples: None,
            batch_size: 4,
            seed: 123,
            sensitivities: None,
            save_sensitivities: None,
            accumulation_dtype: Dtype::Float32,
            dtype: None,
            base_model: None,
        }
    }
}

/// What the run reports as it goes.
pub enum Event<'a> {
    /// A phase starts: `sensitivities`, `perplexity (original)`,
    /// `perplexity (quantized)`; `total` batches.
    Phase {
        /// The phase's name.
        name: &'a str,
        /// Batches it will process.
        total: usize,
    },
    /// One batch of the current phase is done.
    Progress {
        /// Batches of the phase done so far.
        done: usize,
    },
    /// The output is being written.
    Convert(hf::Event<'a>),
}

/// Sensitivities, and what the estimate learned on the way.
#[derive(Clone, Debug)]
pub struct Sensitivities {
    /// `(layer, sensitivity)` in model order (mlx-lm's JSON list).
    pub layers: Vec<(String, f64)>,
    /// Mean KL of the all-low-bit model to the original, per token.
    pub kl_low: Option<f64>,
    /// Per layer, `g · (W_low − W)`: twice its share of the KL under a
    /// quadratic model of the KL around the original weights.
    pub kl_terms: BTreeMap<String, f64>,
    /// Mean next-token cross-entropy of the original model on the rows.
    pub original_loss: Option<f64>,
}

/// What a run produced.
#[derive(Debug, serde::Serialize)]
pub struct DynamicSummary {
    /// The directory the model was written to.
    pub output: PathBuf,
    /// The bits per weight asked for.
    pub target_bpw: f64,
    /// Bits per weight of the written model (mlx-lm's `compute_bits_per_weight`).
    pub bits_per_weight: f64,
    /// Layers with a sensitivity above this are kept at the high bit width.
    pub threshold: f64,
    /// mlx-lm's threshold would have exceeded the target; it was raised to
    /// the next sensitivity that meets it.
    pub threshold_raised: bool,
    /// Layers at the high and at the low bit width.
    pub high_layers: Vec<String>,
    /// Number of layers at the low bit width.
    pub low_layers: usize,
    /// Calibration rows used.
    pub rows: usize,
    /// Tokens per row.
    pub sequence_length: usize,
    /// Perplexity of the original model on the rows.
    pub original_perplexity: f64,
    /// First-order prediction; None when the sensitivities were read from a file.
    pub predicted_perplexity: Option<f64>,
    /// Measured perplexity of the written model on the rows.
    pub quantized_perplexity: f64,
    /// Seconds spent estimating (or reading) the sensitivities.
    pub sensitivity_seconds: f64,
    /// Seconds the whole run took.
    pub seconds: f64,
    /// What the conversion wrote.
    #[serde(skip)]
    pub convert: HfSummary,
}

impl DynamicOptions {
    /// Checks the bit widths, group sizes, target and batch settings; errors name the flag at fault.
    pub fn validate(&self) -> Result<()> {
        for (what, spec) in [("--low", self.low), ("--high", self.high)] {
            super::quantize::validate_spec(spec)
                .with_context(|| format!("{what}-bits / {what}-group-size"))?;
        }
        if !(self.target_bpw.is_finite() && self.target_bpw > 0.0) {
            bail!("--target-bpw must be a positive number");
        }
        if self.sequence_length < 2 || self.batch_size == 0 {
            bail!("--sequence-length must be at least 2 and --batch-size positive");
        }
        if self.num_samples == Some(0) {
            bail!("--num-samples must be positive");
        }
        if !matches!(self.accumulation_dtype, Dtype::Float32 | Dtype::Bfloat16) {
            bail!("--accumulation-dtype must be float32 or bfloat16");
        }
        Ok(())
    }
}

/// mlx-lm's calibration file (`mlx_lm.quant.utils.load_data` downloads it there).
fn default_calibration_file() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".cache/mlx-lm/calibration_v5.txt");
    path.is_file().then_some(path)
}

/// The calibration text: a plain-text file as it is (mlx-lm reads its file
/// whole), the documents of a JSONL file or folder joined by newlines.
fn calibration_text(data: Option<&str>) -> Result<String> {
    let spec = match data {
        Some(d) => d.to_string(),
        None => default_calibration_file()
            .context(
                "no calibration text: give --data FILE (text or JSONL, or a folder of them); \
                 mlx-lm's default, ~/.cache/mlx-lm/calibration_v5.txt, is not there",
            )?
            .to_string_lossy()
            .into_owned(),
    };
    let path = Path::new(&spec);
    if path.is_file() && !spec.ends_with(".jsonl") {
        return std::fs::read_to_string(path)
            .with_context(|| format!("reading calibration text {}", path.display()));
    }
    Ok(crate::eval::data::load_documents(&spec)?.join("\n"))
}

/// `mx.random.seed(seed); mx.random.permutation(n)`.
fn permutation(n: usize, seed: u64) -> Result<Vec<u32>> {
    let key = mlx_rs::random::key(seed)?;
    let (_, sub) = mlx_rs::random::split(&key, 2)?;
    let stream = mlx_rs::StreamOrDevice::default();
    // SAFETY: the key and stream handles are valid for the call; the result
    // is owned by the returned Array on success and freed on failure.
    let perm = unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let rc = mlx_sys::mlx_random_permutation_arange(
            &mut res,
            n as i32,
            sub.as_ptr(),
            AsRef::<mlx_rs::Stream>::as_ref(&stream).as_ptr(),
        );
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            bail!("MLX could not draw a permutation of {n}");
        }
        Array::from_ptr(res)
    };
    perm.eval()?;
    Ok(perm.as_slice::<u32>().to_vec())
}

/// The calibration rows, as `mlx_lm.quant.utils.load_data`: the whole text
/// tokenized (special tokens added as the tokenizer says), cut into rows of
/// `sequence_length`, shuffled with `seed`, the first `num_samples` kept.
fn calibration_rows(tok: &Tokenizer, opts: &DynamicOptions) -> Result<Vec<Vec<i32>>> {
    let text = calibration_text(opts.data.as_deref())?;
    let ids = tok
        .inner()
        .encode(text.as_str(), true)
        .map_err(|e| anyhow!("tokenizing the calibration text: {e}"))?;
    let l = opts.sequence_length;
    let n = ids.get_ids().len() / l;
    if n == 0 {
        bail!(
            "the calibration text has {} tokens, fewer than one row of --sequence-length {l}",
            ids.get_ids().len()
        );
    }
    let rows: Vec<Vec<i32>> = ids.get_ids()[..n * l]
        .chunks(l)
        .map(|c| c.iter().map(|&t| t as i32).collect())
        .collect();
    let mut order = permutation(n, opts.seed)?;
    if let Some(k) = opts.num_samples {
        order.truncate(k);
    }
    Ok(order
        .into_iter()
        .map(|i| rows[i as usize].clone())
        .collect())
}

/// The quantizable layers of `model` in mlx-lm's order: the embedding,
/// each block's linear layers, the untied head.
fn quantizable_layers(model: &Model) -> Result<Vec<String>> {
    let d = &model.decoder;
    let mut names = vec!["model.embed_tokens".to_string()];
    for (i, block) in d.layers.iter().enumerate() {
        if matches!(block.mlp, FeedForward::Sparse(_)) {
            bail!("dynamic quantization does not support mixture-of-experts models yet");
        }
        let mut keys: Vec<&str> = BLOCK_LINEARS
            .into_iter()
            .filter(|k| block_linear(block, k).is_some())
            .collect();
        keys.sort();
        names.extend(keys.into_iter().map(|k| format!("model.layers.{i}.{k}")));
    }
    if d.lm_head.is_some() {
        names.push("lm_head".to_string());
    }
    Ok(names)
}

fn weight_slot<'m>(model: &'m mut Model, prefix: &str) -> Result<&'m mut LinearWeight> {
    let d = &mut model.decoder;
    let slot = match prefix {
        "model.embed_tokens" => Some(&mut d.embed_tokens.weight),
        "lm_head" => d.lm_head.as_mut().map(|l| &mut l.weight),
        _ => prefix
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(i, key)| {
                let block = d.layers.get_mut(i.parse::<usize>().ok()?)?;
                block_linear_mut(block, key).map(|l| &mut l.weight)
            }),
    };
    slot.with_context(|| format!("the model has no layer {prefix}"))
}

fn dense_weight(model: &Model, prefix: &str) -> Result<Array> {
    let mut m = model.clone();
    match weight_slot(&mut m, prefix)? {
        LinearWeight::Dense(w) => Ok(w.clone()),
        LinearWeight::Quantized { .. } => bail!(
            "{prefix} is already quantized; dynamic quantization starts from a float checkpoint"
        ),
    }
}

fn set_weights(model: &mut Model, names: &[String], weights: &[Array]) -> Result<()> {
    for (name, w) in names.iter().zip(weights) {
        *weight_slot(model, name)? = LinearWeight::Dense(w.clone());
    }
    Ok(())
}

/// `mx.dequantize(*mx.quantize(w, ...))`.
fn qdq(w: &Array, spec: QuantSpec) -> Result<Array> {
    let (q, s, b) = mlx_rs::ops::quantize(w, spec.group_size, spec.bits)?;
    Ok(mlx_rs::ops::dequantize(
        &q,
        &s,
        &b,
        spec.group_size,
        spec.bits,
    )?)
}

fn log_softmax(x: &Array) -> Result<Array> {
    Ok(x - &x.logsumexp_axis(-1, true)?)
}

/// mlx-lm's `kl_div_loss(q_model(batch), targets).mean()`: the mean over
/// positions of `KL(softmax(targets) ‖ softmax(q logits))`.
fn kl_loss(
    q_model: &Model,
    names: &[String],
    weights: &[Array],
    batch: &Array,
    targets: &Array,
) -> Result<Array> {
    let mut m = q_model.clone();
    set_weights(&mut m, names, weights)?;
    let fwd = TrainForward {
        decoder: &m.decoder,
        checkpoint_from: None,
    };
    let (hidden, _) = fwd.hidden(batch, None, false)?;
    let logits = m.decoder.project(&hidden)?;
    let lq = log_softmax(&logits)?;
    let lp = log_softmax(targets)?;
    let kl = (&exp(&lp)? * &(&lp - &lq)).sum_axis(-1, false)?;
    Ok(kl.mean(None)?)
}

/// Next-token cross-entropy summed over a batch `[B, L]` with logits `[B, L, V]`.
fn loss_sum(logits: &Array, batch: &Array) -> Result<(f64, usize)> {
    let l = batch.shape()[1];
    let x = logits.index((.., ..l - 1, ..)).as_dtype(Dtype::Float32)?;
    let t = batch.index((.., 1..));
    let lse = x.logsumexp_axis(-1, false)?;
    let picked = x
        .take_along_axis(&mlx_rs::ops::expand_dims(&t, -1)?, -1)?
        .squeeze_axes(&[-1])?;
    let sum = (&lse - &picked).sum(None)?;
    sum.eval()?;
    Ok((sum.item_cast::<f32>() as f64, t.size()))
}

fn batches(rows: &[Vec<i32>], batch_size: usize) -> Vec<Array> {
    rows.chunks(batch_size)
        .map(|c| {
            let flat: Vec<i32> = c.iter().flatten().copied().collect();
            Array::from_slice(&flat, &[c.len() as i32, c[0].len() as i32])
        })
        .collect()
}

/// Estimates the sensitivity of every quantizable layer of `model` on
/// `rows`, as mlx-lm's `estimate_sensitivities`.
fn estimate_sensitivities(
    model: &Model,
    rows: &[Vec<i32>],
    opts: &DynamicOptions,
    on_event: &mut dyn FnMut(Event) -> Result<()>,
) -> Result<Sensitivities> {
    let names = quantizable_layers(model)?;
    let original: Vec<Array> = names
        .iter()
        .map(|n| dense_weight(model, n))
        .collect::<Result<_>>()?;
    let low: Vec<Array> = original
        .iter()
        .map(|w| qdq(w, opts.low))
        .collect::<Result<_>>()?;
    eval(low.iter())?;
    let mut q_model = model.clone();
    set_weights(&mut q_model, &names, &low)?;

    let batches = batches(rows, opts.batch_size);
    on_event(Event::Phase {
        name: "sensitivities",
        total: batches.len(),
    })?;
    let mut accum: Vec<Array> = original
        .iter()
        .map(|w| {
            Ok(mlx_rs::ops::zeros_dtype(
                w.shape(),
                opts.accumulation_dtype,
            )?)
        })
        .collect::<Result<_>>()?;
    let (mut kl_sum, mut ce_sum, mut ce_n) = (0.0f64, 0.0f64, 0usize);
    let argnums: Vec<i32> = (0..names.len() as i32).collect();
    for (i, batch) in batches.iter().enumerate() {
        let targets = model.forward(batch, &mut model.make_caches())?;
        targets.eval()?;
        let (ce, n) = loss_sum(&targets, batch)?;
        ce_sum += ce;
        ce_n += n;
        let f = |p: &[Array]| -> Result<Vec<Array>, Exception> {
            let loss = kl_loss(&q_model, &names, p, batch, &targets)
                .map_err(|e| Exception::custom(format!("{e:#}")))?;
            Ok(vec![loss])
        };
        let mut vg = value_and_grad_with_argnums(f, &argnums[..]);
        let (loss, grads) = vg(&low).map_err(|e| anyhow!("{}", e.what()))?;
        accum = accum
            .iter()
            .zip(&grads)
            .map(|(a, g)| Ok(a + g))
            .collect::<Result<_>>()?;
        drop(grads);
        let mut outs: Vec<&Array> = accum.iter().collect();
        outs.push(&loss[0]);
        eval(outs)?;
        kl_sum += loss[0].item_cast::<f32>() as f64 * batch.shape()[0] as f64;
        on_event(Event::Progress { done: i + 1 })?;
    }
    let n_batches = batches.len() as f32;
    let mut layers = Vec::with_capacity(names.len());
    let mut kl_terms = BTreeMap::new();
    for (((name, g), wl), w) in names.iter().zip(&accum).zip(&low).zip(&original) {
        let g = g / n_batches;
        let high = qdq(w, opts.high)?;
        let param_size = (w.size() as f64 / 1e6) as f32;
        let alignment = (&g * &(wl - &high)).sum(None)?;
        let s = &alignment / param_size;
        let term = (&g * &(wl - w)).sum(None)?;
        eval([&s, &term])?;
        layers.push((name.clone(), s.item_cast::<f32>() as f64));
        kl_terms.insert(name.clone(), term.item_cast::<f32>() as f64);
    }
    Ok(Sensitivities {
        layers,
        kl_terms,
        kl_low: Some(kl_sum / rows.len() as f64),
        original_loss: Some(ce_sum / ce_n.max(1) as f64),
    })
}

/// Reads a sensitivities file (mlx-lm's: a JSON list of `[layer, value]`).
fn read_sensitivities(path: &Path) -> Result<Sensitivities> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading sensitivities {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing sensitivities {}", path.display()))?;
    let bad = || {
        anyhow!(
            "sensitivities {} must be a JSON list of [layer, number] pairs",
            path.display()
        )
    };
    let mut layers = Vec::new();
    for pair in v.as_array().ok_or_else(bad)? {
        match pair.as_array().map(Vec::as_slice) {
            Some([Value::String(n), x]) => layers.push((n.clone(), x.as_f64().ok_or_else(bad)?)),
            _ => return Err(bad()),
        }
    }
    Ok(Sensitivities {
        layers,
        kl_terms: BTreeMap::new(),
        kl_low: None,
        original_loss: None,
    })
}

/// Writes sensitivities in mlx-lm's format.
fn write_sensitivities(path: &Path, s: &Sensitivities) -> Result<()> {
    let list: Vec<Value> = s
        .layers
        .iter()
        .map(|(n, x)| serde_json::json!([n, x]))
        .collect();
    std::fs::write(path, Value::Array(list).to_string())
        .with_context(|| format!("writing sensitivities {}", path.display()))
}

/// The sizes that decide the bits per weight of the written model.
#[derive(Clone, Debug)]
pub struct Inventory {
    /// Quantizable layers: prefix, `(rows, cols)`, bytes per float.
    pub layers: Vec<(String, (u64, u64), u64)>,
    /// Bytes and parameters of every other tensor.
    pub other_bytes: u64,
    /// Parameters of every other tensor.
    pub other_params: u64,
}

impl Inventory {
    /// The tensors `convert` would write from the model folder `dir`.
    pub fn of(dir: &Path, dtype: Option<Dtype>) -> Result<Self> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let config: Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", config_path.display()))?;
        let family = super::family::of_config(&config)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let tied = family.tied(&config)?;
        let dtype = dtype.or_else(|| {
            config
                .get("torch_dtype")
                .and_then(Value::as_str)
                .filter(|n| ["float16", "bfloat16", "float32"].contains(n))
                .and_then(crate::mlx_ext::parse_dtype)
        });
        let mut inv = Self {
            layers: Vec::new(),
            other_bytes: 0,
            other_params: 0,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with("model") && n.ends_with(".safetensors")
            })
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("{} has no model*.safetensors weight files", dir.display());
        }
        for file in files {
            let tensors = Array::load_safetensors(&file)
                .map_err(|e| anyhow!("opening {}: {e}", file.display()))?;
            for (name, a) in tensors {
                if name.ends_with(".scales") {
                    bail!(
                        "{} is already quantized ({name}); dynamic quantization starts from a \
                         float checkpoint",
                        dir.display()
                    );
                }
                if !family.keeps(&name, tied) {
                    continue;
                }
                let float = crate::mlx_ext::is_float(a.dtype());
                let bytes_per = match dtype {
                    Some(d) if float => dtype_bytes(d),
                    _ => dtype_bytes(a.dtype()),
                };
                let size = a.size() as u64;
                match name.strip_suffix(".weight") {
                    Some(prefix) if family.quantizable(&name, a.ndim()) && a.ndim() == 2 => {
                        let s = a.shape();
                        inv.layers.push((
                            prefix.to_string(),
                            (s[0] as u64, s[1] as u64),
                            bytes_per,
                        ));
                    }
                    _ => {
                        inv.other_bytes += size * bytes_per;
                        inv.other_params += size;
                    }
                }
            }
        }
        Ok(inv)
    }

    /// Bits per weight with the layers in `high` at `high_spec` and the rest
    /// at `low` (a layer whose columns `low`'s group size does not divide
    /// stays dense, as mlx-lm's `quantize_model` leaves it).
    pub fn bits_per_weight(
        &self,
        low: QuantSpec,
        high_spec: QuantSpec,
        high: &dyn Fn(&str) -> bool,
    ) -> f64 {
        let (mut bytes, mut params) = (self.other_bytes, self.other_params);
        for (name, (rows, cols), per) in &self.layers {
            params += rows * cols;
            if cols % low.group_size as u64 != 0 {
                bytes += rows * cols * per;
                continue;
            }
            let spec = if high(name) { high_spec } else { low };
            let packed = rows * (cols * spec.bits as u64 / 32) * 4;
            let groups = rows * (cols / spec.group_size as u64);
            bytes += packed + 2 * groups * per;
        }
        (bytes * 8) as f64 / params as f64
    }
}

fn dtype_bytes(d: Dtype) -> u64 {
    match d {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        _ => 8,
    }
}

/// The threshold above which a layer gets the high bits, by mlx-lm's
/// bisection: narrowed until within 1e-3 of the sensitivities' range.
fn estimate_threshold(
    inv: &Inventory,
    sens: &BTreeMap<String, f64>,
    target_bpw: f64,
    low: QuantSpec,
    high: QuantSpec,
) -> f64 {
    let vals: Vec<f64> = sens.values().copied().collect();
    let mut min = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let mut max = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if vals.is_empty() {
        return 0.0;
    }
    let tolerance = 1e-3 * (max - min);
    while (max - min) > tolerance {
        let mid = (max + min) / 2.0;
        let bpw = inv.bits_per_weight(low, high, &|n| sens.get(n).is_some_and(|&s| s > mid));
        if bpw > target_bpw {
            min = mid;
        } else {
            max = mid;
        }
    }
    (max + min) / 2.0
}

/// mlx-lm's threshold, unless it puts the model over the target: its
/// bisection returns the middle of its last interval, which can sit below a
/// layer whose high bits break the target. Then the threshold moves up to
/// the lowest sensitivity that meets the target. Returns whether it moved.
fn choose_threshold(
    inv: &Inventory,
    sens: &BTreeMap<String, f64>,
    opts: &DynamicOptions,
) -> (f64, bool) {
    let bpw = |t: f64| {
        inv.bits_per_weight(opts.low, opts.high, &|n| {
            sens.get(n).is_some_and(|&s| s > t)
        })
    };
    let threshold = estimate_threshold(inv, sens, opts.target_bpw, opts.low, opts.high);
    if bpw(threshold) <= opts.target_bpw {
        return (threshold, false);
    }
    let mut above: Vec<f64> = sens.values().copied().filter(|&s| s >= threshold).collect();
    above.sort_by(f64::total_cmp);
    let raised = above
        .into_iter()
        .find(|&s| bpw(s) <= opts.target_bpw)
        .unwrap_or(f64::INFINITY);
    (raised, true)
}

/// Runs dynamic quantization of the model folder `dir` as `opts` says.
pub fn run(
    dir: &Path,
    opts: &DynamicOptions,
    on_event: &mut dyn FnMut(Event) -> Result<()>,
) -> Result<DynamicSummary> {
    let started = Instant::now();
    opts.validate()?;
    super::output::require_absent(&opts.output)?;
    let inv = Inventory::of(dir, opts.dtype)?;
    let floor = inv.bits_per_weight(opts.low, opts.high, &|_| false);
    if floor > opts.target_bpw {
        bail!(
            "--target-bpw {} is below {floor:.4}, the bits per weight with every layer at \
             {} bits (group size {}); lower --low-bits or raise --low-group-size or the target",
            opts.target_bpw,
            opts.low.bits,
            opts.low.group_size
        );
    }
    let tok = Tokenizer::load(dir)?;
    let rows = calibration_rows(&tok, opts)?;
    let model = Model::load(dir)?;
    model.refuse_recurrent_layers("dynamic quantization (--target-bpw)")?;

    let sens_started = Instant::now();
    let sens = match &opts.sensitivities {
        Some(path) => read_sensitivities(path)?,
        None => {
            let s = estimate_sensitivities(&model, &rows, opts, on_event)?;
            if let Some(path) = &opts.save_sensitivities {
                write_sensitivities(path, &s)?;
            }
            s
        }
    };
    let sensitivity_seconds = sens_started.elapsed().as_secs_f64();
    let map: BTreeMap<String, f64> = sens.layers.iter().cloned().collect();
    for (name, _, _) in &inv.layers {
        if !map.contains_key(name) {
            bail!("the sensitivities have no entry for layer {name}");
        }
    }
    let (threshold, raised) = choose_threshold(&inv, &map, opts);
    let overrides: LayerOverrides = inv
        .layers
        .iter()
        .filter(|(n, (_, cols), _)| map[n] > threshold && cols % opts.low.group_size as u64 == 0)
        .map(|(n, _, _)| (n.clone(), (opts.high.group_size, opts.high.bits)))
        .collect();

    let original_loss = match sens.original_loss {
        Some(l) => l,
        None => mean_loss(&model, &rows, "perplexity (original)", on_event)?,
    };
    drop(model);
    let predicted_perplexity = sens
        .kl_low
        .map(|kl_low| (original_loss + predicted_kl(&sens, kl_low, &overrides, opts)).exp());

    let convert = hf::convert_with_overrides(
        dir,
        &HfOptions {
            output: opts.output.clone(),
            dtype: opts.dtype,
            quantize: Some(QuantRecipe {
                mode: QuantMode::Affine,
                group_size: Some(opts.low.group_size),
                bits: Some(opts.low.bits),
                mixed: None,
            }),
            dequantize: false,
            base_model: opts.base_model.clone(),
        },
        &overrides,
        &mut |e| {
            let _ = on_event(Event::Convert(e));
        },
    )?;
    let quantized = Model::load(&opts.output)?;
    let quantized_loss = mean_loss(&quantized, &rows, "perplexity (quantized)", on_event)?;
    Ok(DynamicSummary {
        output: opts.output.clone(),
        target_bpw: opts.target_bpw,
        bits_per_weight: convert.bits_per_weight,
        threshold,
        threshold_raised: raised,
        high_layers: overrides.keys().cloned().collect(),
        low_layers: inv.layers.len() - overrides.len(),
        rows: rows.len(),
        sequence_length: opts.sequence_length,
        original_perplexity: original_loss.exp(),
        predicted_perplexity,
        quantized_perplexity: quantized_loss.exp(),
        sensitivity_seconds,
        seconds: started.elapsed().as_secs_f64(),
        convert,
    })
}

/// The KL of the written model to the original, predicted from the
/// estimate: under a quadratic model of the KL around the original weights
/// (`KL ≈ ½ δᵀHδ`, `g = Hδ` at the all-low point), layer `l` holds a share
/// proportional to `g_l · δ_l`; quantization noise shrinks about 2× per
/// extra bit, so a layer moved up keeps `4^-(high − low)` of its share. The
/// shares are scaled to the measured all-low KL.
fn predicted_kl(
    sens: &Sensitivities,
    kl_low: f64,
    high: &LayerOverrides,
    opts: &DynamicOptions,
) -> f64 {
    let shrink = 0.25f64.powi(opts.high.bits - opts.low.bits);
    let total: f64 = sens.kl_terms.values().map(|t| t.max(0.0)).sum();
    if total <= 0.0 {
        return kl_low;
    }
    let kept: f64 = sens
        .kl_terms
        .iter()
        .map(|(n, t)| t.max(0.0) * if high.contains_key(n) { shrink } else { 1.0 })
        .sum();
    kl_low * kept / total
}

/// Mean next-token loss of `model` on `rows` (mlx-lm's `eval_ppl`, batches of 8).
fn mean_loss(
    model: &Model,
    rows: &[Vec<i32>],
    phase: &str,
    on_event: &mut dyn FnMut(Event) -> Result<()>,
) -> Result<f64> {
    on_event(Event::Phase {
        name: phase,
        total: rows.len().div_ceil(8),
    })?;
    let mut failed = None;
    let losses = crate::eval::perplexity::token_losses(model, rows, 8, &mut |done, _| {
        if let Err(e) = on_event(Event::Progress { done }) {
            failed.get_or_insert(e);
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(losses.iter().map(|&x| x as f64).sum::<f64>() / losses.len().max(1) as f64)
}
