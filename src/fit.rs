//! Will it fit? Memory arithmetic for a model at a context and batch size,
//! from `config.json` and the safetensors headers alone (no weights are
//! read): the weights as they sit in memory after the device's dtype policy,
//! the KV cache, a draft model's share, and the activation peaks of a prefill
//! chunk and a decode step. `mlx-bun fit` prints it; `serve` and `generate`
//! refuse at start-up what cannot fit.
//!
//! The model mirrors what the engine allocates: float tensors are held in
//! the compute dtype (float32 on CPU), the standard KV cache grows in blocks
//! of 256 positions, prefill runs in chunks without logits except for the
//! last row, and quantized layers fed 16 or more rows are dequantized to a
//! dense float matrix for one matmul.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::model::config::ModelArgs;

/// The KV cache grows in blocks of this many positions.
pub(crate) const KV_BLOCK: usize = 256;
/// Group size of a quantized KV cache (as mlx-lm's `QuantizedKVCache`).
pub(crate) const KV_GROUP: usize = 64;
/// Rows from which a quantized layer runs through a dequantized dense matrix.
const DENSE_ROWS: usize = 16;
/// Arrays of the attention scores' size that a prefill chunk holds at once
/// where MLX computes the attention: its unfused attention keeps the scores,
/// the masked scores and their softmax (measured on the CPU: the peak grew by
/// three times the scores with the prompt's square).
const SCORE_COPIES: u64 = 3;
/// Copies of a prompt row's residual stream, q/k/v and MLP arrays alive at
/// once where the attention runs in tiles (no scores): measured on the CPU,
/// the peak grows by 85-89 KB per prompt row of SmolLM2-135M, against 31 KB
/// for one copy of each.
const TILED_ROW_COPIES: u64 = 3;

/// What the arithmetic needs to know about one model.
#[derive(Clone, Debug, Serialize)]
pub struct Footprint {
    /// The model's directory, as given.
    pub dir: String,
    /// Bytes of the weights in memory (floats in the compute dtype).
    pub weight_bytes: u64,
    /// Bytes of the weight files on disk.
    pub file_bytes: u64,
    /// Decoder layers (`num_hidden_layers`).
    pub layers: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Hidden size (width of the residual stream).
    pub hidden: usize,
    /// Intermediate size of the MLP.
    pub intermediate: usize,
    /// Vocabulary size (width of the logits).
    pub vocab: usize,
    /// `max_position_embeddings` of `config.json`, if given.
    pub max_context: Option<usize>,
    /// `sliding_window` of `config.json`, if given.
    pub sliding_window: Option<usize>,
    /// Bytes per float in the compute dtype.
    pub dtype_bytes: u64,
    /// One decoder layer's quantized weights dequantized (the largest
    /// layer): the transient of the dense path, which a forward pass over 16
    /// or more rows holds for a whole layer at once.
    pub dense_layer_bytes: u64,
    /// A quantized LM head dequantized: the dense path's transient when 16 or more rows get logits.
    pub lm_head_dense_bytes: u64,
    /// The attention runs as mlx-bun's CPU primitive (float32 with the CPU
    /// kernels on; no soft-capping or sinks), in tiles of queries: the
    /// scores are never materialized.
    pub tiled_attention: bool,
}

fn dtype_size(dtype: &str) -> Option<(u64, bool)> {
    Some(match dtype {
        "F64" => (8, true),
        "F32" => (4, true),
        "F16" | "BF16" => (2, true),
        "I64" | "U64" => (8, false),
        "I32" | "U32" => (4, false),
        "I16" | "U16" => (2, false),
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => (1, false),
        _ => return None,
    })
}

/// `(name, dtype, shape)` of every tensor in a safetensors file, from its header.
/// A file the header cannot be read from gets the loader's error for it.
fn safetensors_header(path: &Path) -> Result<Vec<(String, String, Vec<u64>)>> {
    read_safetensors_header(path).or_else(|e| {
        crate::model::weights::check_safetensors_file(path)?;
        Err(e)
    })
}

fn read_safetensors_header(path: &Path) -> Result<Vec<(String, String, Vec<u64>)>> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .with_context(|| format!("{} is too short for a safetensors file", path.display()))?;
    let len = u64::from_le_bytes(len);
    let file_len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > 100 << 20 || len > file_len.saturating_sub(8) {
        bail!(
            "invalid safetensors file {}: the header claims {len} bytes, the file has {file_len}",
            path.display()
        );
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)
        .with_context(|| format!("{}: truncated safetensors header", path.display()))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .with_context(|| format!("{}: the safetensors header is not JSON", path.display()))?;
    let mut out = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"]
            .as_str()
            .with_context(|| format!("{}: tensor {name} has no dtype", path.display()))?;
        let shape = info["shape"]
            .as_array()
            .with_context(|| format!("{}: tensor {name} has no shape", path.display()))?
            .iter()
            .map(|d| d.as_u64().context("shape"))
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("{}: tensor {name} has a bad shape", path.display()))?;
        out.push((name, dtype.to_string(), shape));
    }
    Ok(out)
}

impl Footprint {
    /// Reads `dir/config.json` and the headers of its weight files, counting
    /// floats at `dtype_bytes` each (4 on CPU: see `mlx_ext::compute_dtype`).
    pub fn read(dir: &Path, dtype_bytes: u64) -> Result<Self> {
        let (args, raw) = crate::model::read_config(dir)?;
        let mut sinks = false;
        let files = crate::model::weights::weight_files(dir)?;
        let (mut weight_bytes, mut file_bytes) = (0u64, 0u64);
        let mut per_layer: std::collections::HashMap<String, u64> = Default::default();
        let mut lm_head_dense = 0u64;
        let bits = quant_bits(&args);
        for file in &files {
            file_bytes += std::fs::metadata(file)?.len();
            for (name, dtype, shape) in safetensors_header(file)? {
                let (size, is_float) = dtype_size(&dtype).with_context(|| {
                    format!(
                        "{}: tensor {name} has unknown dtype {dtype}",
                        file.display()
                    )
                })?;
                sinks |= name.ends_with(".sinks");
                let numel: u64 = shape.iter().product();
                weight_bytes += numel * if is_float { dtype_bytes } else { size };
                // A packed uint32 weight [out, in * bits / 32] of a quantized layer.
                if name.ends_with(".weight") && dtype == "U32" && shape.len() == 2 {
                    let dense = shape[0] * shape[1] * 32 / bits.unwrap_or(4) * dtype_bytes;
                    if name.contains("embed_tokens") || name.contains("lm_head") {
                        lm_head_dense = lm_head_dense.max(dense);
                    } else if let Some(i) = name.find("layers.") {
                        let layer = name[i..].split('.').take(2).collect::<Vec<_>>().join(".");
                        *per_layer.entry(layer).or_default() += dense;
                    }
                }
            }
        }
        let heads = args.num_attention_heads.max(1) as usize;
        let hidden = args.hidden_size.max(1) as usize;
        Ok(Self {
            dir: dir.display().to_string(),
            weight_bytes,
            file_bytes,
            layers: args.num_hidden_layers.max(0) as usize,
            heads,
            kv_heads: args
                .num_key_value_heads
                .unwrap_or(args.num_attention_heads)
                .max(1) as usize,
            head_dim: args.head_dim.map(|d| d as usize).unwrap_or(hidden / heads),
            hidden,
            intermediate: args.intermediate_size.max(0) as usize,
            vocab: args.vocab_size.max(0) as usize,
            max_context: args.max_position_embeddings,
            sliding_window: args.sliding_window,
            dtype_bytes,
            dense_layer_bytes: per_layer.values().copied().max().unwrap_or(0),
            lm_head_dense_bytes: lm_head_dense,
            tiled_attention: dtype_bytes == 4
                && crate::kernels::enabled()
                && !sinks
                && raw
                    .get("attn_logit_softcapping")
                    .is_none_or(serde_json::Value::is_null),
        })
    }

    /// KV bytes per token per sequence, all layers, keys and values.
    pub fn kv_bytes_per_token(&self, kv_bits: Option<u8>) -> f64 {
        let elems = (2 * self.layers * self.kv_heads * self.head_dim) as f64;
        match kv_bits {
            None => elems * self.dtype_bytes as f64,
            // Packed values plus a scale and a bias per group.
            Some(b) => elems * (b as f64 / 8.0 + 2.0 * self.dtype_bytes as f64 / KV_GROUP as f64),
        }
    }

    /// KV bytes held for `batch` sequences of `context` positions: the cache
    /// grows in blocks of 256 positions.
    pub fn kv_bytes(&self, context: usize, batch: usize, kv_bits: Option<u8>) -> u64 {
        let positions = context.div_ceil(KV_BLOCK) * KV_BLOCK;
        (self.kv_bytes_per_token(kv_bits) * positions as f64 * batch as f64) as u64
    }

    /// Copies of a layer's attention scores alive at once in a prefill chunk.
    fn score_copies(&self) -> u64 {
        if self.tiled_attention {
            0
        } else {
            SCORE_COPIES
        }
    }

    /// The transient arrays of one prefill chunk of `rows` tokens ending at
    /// position `end` (`TILED_ROW_COPIES` of the per-row ones where the
    /// attention runs in tiles): the residual stream and its norm, q/k/v, the
    /// attention scores (rows × positions, `SCORE_COPIES` of them, where MLX
    /// computes the attention: see [`Footprint::tiled_attention`]) or the
    /// MLP's gate, up and product, whichever is larger, one layer's
    /// dequantized weights (the dense path), and the last row's logits.
    pub(crate) fn chunk_peak(&self, rows: usize, end: usize) -> ActivationPeak {
        let f = self.dtype_bytes;
        let s = rows as u64;
        let copies = if self.tiled_attention {
            TILED_ROW_COPIES
        } else {
            1
        };
        let residual = copies * 4 * s * self.hidden as u64 * f;
        let qkv = copies * s * ((self.heads + 2 * self.kv_heads) * self.head_dim) as u64 * f;
        let scores = self.score_copies() * self.heads as u64 * s * end as u64 * f;
        let mlp = copies * 3 * s * self.intermediate as u64 * f;
        let dense = if rows >= DENSE_ROWS {
            self.dense_layer_bytes
        } else {
            0
        };
        let logits = 2 * self.vocab as u64 * f;
        ActivationPeak {
            rows,
            end,
            attention_scores_bytes: scores,
            mlp_bytes: mlp,
            logits_bytes: logits,
            other_bytes: residual + qkv + dense,
            total_bytes: residual + qkv + scores.max(mlp) + dense + logits,
        }
    }

    /// The prefill of `context` tokens in chunks of `step`: chunks are full
    /// but the last, so the candidates for the peak are the last full chunk
    /// and the partial one ending at `context` (`(rows, end)` pairs).
    pub(crate) fn prefill_chunks(step: usize, context: usize) -> Vec<(usize, usize)> {
        let step = step.max(1).min(context.max(1));
        let (full, rest) = (context / step, context % step);
        let mut out = Vec::new();
        if full > 0 {
            out.push((step, full * step));
        }
        if rest > 0 {
            out.push((rest, context));
        }
        out
    }

    /// The largest transient of any prefill chunk (without the KV cache).
    pub(crate) fn prefill_peak(&self, step: usize, context: usize) -> ActivationPeak {
        Self::prefill_chunks(step, context)
            .into_iter()
            .map(|(rows, end)| self.chunk_peak(rows, end))
            .max_by_key(|p| p.total_bytes)
            .unwrap_or_else(|| self.chunk_peak(1, 1))
    }

    /// Peak of one decode (or verify) step over `rows` tokens for `batch`
    /// sequences at `context`: as a prefill chunk, but every row has logits
    /// (plus the sampler's copies: log-softmax and sorting).
    pub(crate) fn decode_peak(&self, rows: usize, batch: usize, context: usize) -> ActivationPeak {
        let f = self.dtype_bytes;
        let n = (rows * batch) as u64;
        let t = context as u64;
        let residual = 4 * n * self.hidden as u64 * f;
        let qkv = n * ((self.heads + 2 * self.kv_heads) * self.head_dim) as u64 * f;
        let scores = self.score_copies().min(1) * self.heads as u64 * n * t * f;
        let mlp = 3 * n * self.intermediate as u64 * f;
        let logits = 3 * n * self.vocab as u64 * f;
        let dense = if rows * batch >= DENSE_ROWS {
            self.dense_layer_bytes + self.lm_head_dense_bytes
        } else {
            0
        };
        ActivationPeak {
            rows: rows * batch,
            end: context,
            attention_scores_bytes: scores,
            mlp_bytes: mlp,
            logits_bytes: logits,
            other_bytes: residual + qkv + dense,
            total_bytes: residual + qkv + scores.max(mlp) + dense + logits,
        }
    }
}

fn quant_bits(args: &ModelArgs) -> Option<u64> {
    args.quantization.as_ref().map(|q| q.default.bits as u64)
}

/// The arrays alive at once in one forward pass, beside weights and KV.
#[derive(Clone, Debug, Serialize)]
pub struct ActivationPeak {
    /// Rows (tokens across the batch) processed in the pass.
    pub rows: usize,
    /// Positions in the cache at the end of the pass.
    pub end: usize,
    /// The attention scores of one layer.
    pub attention_scores_bytes: u64,
    /// The MLP's gate, up and product (reuses the scores' memory: the larger counts).
    pub mlp_bytes: u64,
    /// The logits (and, in a decode step, the sampler's copies).
    pub logits_bytes: u64,
    /// Residual stream, q/k/v and the dense path's dequantized weight.
    pub other_bytes: u64,
    /// All of the pass's transients together.
    pub total_bytes: u64,
}

/// One question: this model (and draft) at this context and batch.
#[derive(Clone, Debug, Serialize)]
pub struct FitRequest {
    /// Context length in tokens (prompt and generation).
    pub context: usize,
    /// Sequences decoded together.
    pub batch: usize,
    /// Bits of a quantized KV cache (`--kv-bits`); None: full-precision cache.
    pub kv_bits: Option<u8>,
    /// Tokens per prefill chunk (`--prefill-step-size`).
    pub prefill_step: usize,
    /// Tokens a draft proposes per step (the verify pass has this many + 1 rows).
    pub num_draft_tokens: usize,
    /// Memory to fit into.
    pub memory_bytes: u64,
    /// Memory committed elsewhere (e.g. the server's prompt cache).
    pub reserved_bytes: u64,
}

/// The answer to a [`FitRequest`]: the memory it needs at its peak, and what would fit.
#[derive(Clone, Debug, Serialize)]
pub struct FitReport {
    /// The question asked.
    pub request: FitRequest,
    /// The model's footprint.
    pub model: Footprint,
    /// The draft model's footprint, when speculative decoding is asked for.
    pub draft: Option<Footprint>,
    /// Bytes of the model's weights in memory.
    pub weight_bytes: u64,
    /// KV cache bytes per position, over the whole batch.
    pub kv_bytes_per_token: f64,
    /// KV cache bytes of the model at the full context and batch.
    pub kv_bytes: u64,
    /// Weights plus KV of the draft model.
    pub draft_bytes: u64,
    /// The model's largest activation peak over the prefill chunks.
    pub prefill: ActivationPeak,
    /// The model's activation peak in a decode (or verify) step.
    pub decode: ActivationPeak,
    /// Transient bytes at the peak.
    pub activation_bytes: u64,
    /// The peak: weights (model and draft) + KV and transients at the
    /// worst moment + reserved.
    pub total_bytes: u64,
    /// When the peak happens and what it holds.
    pub peak: Peak,
    /// Whether the peak is within the memory available.
    pub fits: bool,
    /// The largest context that fits at the requested batch (0 if none).
    pub max_context: usize,
    /// The largest batch that fits at the requested context (0 if none).
    pub max_batch: usize,
}

/// The peak of `model` (+ `draft`) for `req`'s shape at `context` × `batch`.
/// Memory peaks either in a prefill chunk (the KV cache filled up to the
/// chunk's end, plus the chunk's transients) or in a decode step (the full
/// cache plus the step's); other sequences of a batch hold a full cache.
fn total(
    model: &Footprint,
    draft: Option<&Footprint>,
    req: &FitRequest,
    context: usize,
    batch: usize,
) -> Peak {
    let kv = |m: &Footprint, end: usize| {
        m.kv_bytes(end, 1, req.kv_bits) + m.kv_bytes(context, batch - 1, req.kv_bits)
    };
    let draft_kv = |end: usize| draft.map(|d| kv(d, end)).unwrap_or(0);
    let mut best: Option<Peak> = None;
    let mut consider = |kv_now: u64, act: ActivationPeak, phase: &'static str| {
        let bytes = kv_now + act.total_bytes;
        if best
            .as_ref()
            .is_none_or(|b| bytes > b.kv_bytes + b.activation.total_bytes)
        {
            best = Some(Peak {
                phase,
                kv_bytes: kv_now,
                activation: act,
                total_bytes: 0,
            });
        }
    };
    for (rows, end) in Footprint::prefill_chunks(req.prefill_step, context) {
        let kv_now = kv(model, end) + draft_kv(end);
        consider(kv_now, model.chunk_peak(rows, end), "prefill");
        // The draft prefills the same chunks, after the model.
        if let Some(d) = draft {
            consider(kv_now, d.chunk_peak(rows, end), "draft prefill");
        }
    }
    let rows = if draft.is_some() {
        req.num_draft_tokens + 1
    } else {
        1
    };
    let kv_full = kv(model, context) + draft_kv(context);
    consider(kv_full, model.decode_peak(rows, batch, context), "decode");
    if let Some(d) = draft {
        consider(kv_full, d.decode_peak(1, batch, context), "draft decode");
    }
    let mut peak = best.expect("at least the decode step");
    let draft_weights = draft.map(|d| d.weight_bytes).unwrap_or(0);
    peak.total_bytes = model.weight_bytes
        + draft_weights
        + peak.kv_bytes
        + peak.activation.total_bytes
        + req.reserved_bytes;
    peak
}

/// When and how large the memory peak is.
#[derive(Clone, Debug, Serialize)]
pub struct Peak {
    /// "prefill", "draft prefill", "decode" or "draft decode".
    pub phase: &'static str,
    /// KV bytes (model and draft) held at the peak.
    pub kv_bytes: u64,
    /// The transients of the pass at the peak.
    pub activation: ActivationPeak,
    /// Bytes at the peak: weights, KV, transients and reserved memory.
    pub total_bytes: u64,
}

/// Largest `x` in `1..=hi` with `ok(x)`, for monotone `ok`; 0 if none.
fn largest(hi: usize, ok: impl Fn(usize) -> bool) -> usize {
    if hi == 0 || !ok(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1usize, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The whole answer for `req`.
pub fn fit(model: Footprint, draft: Option<Footprint>, req: FitRequest) -> FitReport {
    let peak = total(&model, draft.as_ref(), &req, req.context, req.batch);
    let within = |c: usize, b: usize| {
        total(&model, draft.as_ref(), &req, c, b).total_bytes <= req.memory_bytes
    };
    let context_cap = model.max_context.unwrap_or(1 << 20).max(1);
    let max_context = largest(context_cap, |c| within(c, req.batch));
    let max_batch = largest(4096, |b| within(req.context, b));
    let draft_bytes = draft
        .as_ref()
        .map(|d| d.weight_bytes + d.kv_bytes(req.context, req.batch, req.kv_bits))
        .unwrap_or(0);
    FitReport {
        weight_bytes: model.weight_bytes,
        kv_bytes_per_token: model.kv_bytes_per_token(req.kv_bits) * req.batch as f64,
        kv_bytes: model.kv_bytes(req.context, req.batch, req.kv_bits),
        draft_bytes,
        prefill: model.prefill_peak(req.prefill_step, req.context),
        decode: model.decode_peak(
            if draft.is_some() {
                req.num_draft_tokens + 1
            } else {
                1
            },
            req.batch,
            req.context,
        ),
        activation_bytes: peak.activation.total_bytes,
        total_bytes: peak.total_bytes,
        fits: peak.total_bytes <= req.memory_bytes,
        peak,
        max_context,
        max_batch,
        request: req,
        model,
        draft,
    }
}

/// `MemAvailable` from `/proc/meminfo`: what can be allocated without swapping.
pub fn available_memory() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .context("reading /proc/meminfo (give the memory explicitly)")?;
    parse_meminfo(&text).context("no MemAvailable line in /proc/meminfo")
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes per float of `dir`'s model computed as `compute` asks on this
/// device: the dtype most of its floating tensors are stored in (read from
/// the weight files' headers), resolved as loading resolves it.
pub fn compute_dtype_bytes(dir: &Path, compute: crate::mlx_ext::ComputeDtype) -> Result<u64> {
    let mut dtypes = Vec::new();
    for file in crate::model::weights::weight_files(dir)? {
        for (_, dtype, _) in safetensors_header(&file)? {
            dtypes.extend(crate::mlx_ext::parse_safetensors_dtype(&dtype));
        }
    }
    let stored = crate::mlx_ext::stored_float_dtype(dtypes);
    Ok(match compute.resolve(stored) {
        mlx_rs::Dtype::Float64 => 8,
        mlx_rs::Dtype::Float16 | mlx_rs::Dtype::Bfloat16 => 2,
        _ => 4,
    })
}

/// The start-up check of `serve` and `generate` (run by
/// `runtime::Runtime::assemble` before loading): an error with the numbers
/// when `dir` (+ `draft`) cannot hold `context` tokens in the available
/// memory. `None` where the available memory is unknown (no /proc/meminfo).
pub(crate) fn check_fits(
    dir: &Path,
    draft: Option<&Path>,
    compute: crate::mlx_ext::ComputeDtype,
    context: usize,
    num_draft_tokens: usize,
    reserved_bytes: u64,
) -> Result<Option<FitReport>> {
    let Ok(memory_bytes) = available_memory() else {
        return Ok(None);
    };
    let model = Footprint::read(dir, compute_dtype_bytes(dir, compute)?)?;
    let draft = match draft {
        Some(d) => Some(Footprint::read(d, compute_dtype_bytes(d, compute)?)?),
        None => None,
    };
    let req = FitRequest {
        context: context.max(1),
        batch: 1,
        kv_bits: None,
        prefill_step: crate::generate::DEFAULT_PREFILL_STEP,
        num_draft_tokens,
        memory_bytes,
        reserved_bytes,
    };
    let report = fit(model, draft, req);
    if !report.fits {
        bail!("{}", report.refusal());
    }
    Ok(Some(report))
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

impl FitReport {
    /// One paragraph saying why the model does not fit.
    pub fn refusal(&self) -> String {
        let draft_weights = self.draft.as_ref().map(|d| d.weight_bytes).unwrap_or(0);
        format!(
            "{} does not fit in {} of available memory at {} tokens × batch {}: \
             needs {} at the {} peak (weights {}, draft weights {}, KV cache {}, \
             activations {}, reserved {}); the largest context that fits is {} tokens \
             (see `mlx-bun fit`; MLX_BUN_SKIP_FIT_CHECK=1 skips this check)",
            self.model.dir,
            gib(self.request.memory_bytes as f64),
            self.request.context,
            self.request.batch,
            gib(self.total_bytes as f64),
            self.peak.phase,
            gib(self.weight_bytes as f64),
            gib(draft_weights as f64),
            gib(self.peak.kv_bytes as f64),
            gib(self.activation_bytes as f64),
            gib(self.request.reserved_bytes as f64),
            self.max_context
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn footprint() -> Footprint {
        // SmolLM2-135M's shape with 100 MB of weights.
        Footprint {
            dir: "m".into(),
            weight_bytes: 100 << 20,
            file_bytes: 90 << 20,
            layers: 30,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            hidden: 576,
            intermediate: 1536,
            vocab: 49152,
            max_context: Some(8192),
            sliding_window: None,
            dtype_bytes: 4,
            dense_layer_bytes: (3 * 1536 + 2 * 576 + 2 * 192) * 576 * 4,
            lm_head_dense_bytes: 49152 * 576 * 4,
            // MLX's attention (a GPU, or the CPU kernels off).
            tiled_attention: false,
        }
    }

    fn req(context: usize, batch: usize, memory: u64) -> FitRequest {
        FitRequest {
            context,
            batch,
            kv_bits: None,
            prefill_step: 2048,
            num_draft_tokens: 3,
            memory_bytes: memory,
            reserved_bytes: 0,
        }
    }

    #[test]
    fn kv_arithmetic() {
        let m = footprint();
        // 2 × 30 layers × 3 heads × 64 × 4 bytes.
        assert_eq!(m.kv_bytes_per_token(None), 46080.0);
        assert_eq!(m.kv_bytes(1, 1, None), 46080 * 256);
        assert_eq!(m.kv_bytes(257, 2, None), 46080 * 512 * 2);
        // 4-bit: half a byte plus 8 bytes of scale and bias per 64 values.
        assert_eq!(m.kv_bytes_per_token(Some(4)), 11520.0 * (0.5 + 0.125));
    }

    #[test]
    fn limits_are_consistent_with_the_total() {
        let m = footprint();
        let r = fit(m.clone(), None, req(4096, 1, 4 << 30));
        assert!(r.fits);
        assert_eq!(r.max_context, 8192, "capped by the model's context");
        // The largest batch fits, one more does not; the same for context.
        let memory = 2 << 30;
        let at = |c, b| fit(m.clone(), None, req(c, b, memory)).total_bytes;
        let r = fit(m.clone(), None, req(4096, 1, memory));
        assert!(r.max_batch >= 1);
        assert!(at(4096, r.max_batch) <= memory && at(4096, r.max_batch + 1) > memory);
        assert!(r.max_context < 8192);
        assert!(at(r.max_context, 1) <= memory && at(r.max_context + 1, 1) > memory);
        // Too little memory: refused with the numbers, and no context fits.
        let r = fit(m.clone(), None, req(4096, 1, 50 << 20));
        assert!(!r.fits);
        assert_eq!((r.max_context, r.max_batch), (0, 0));
        assert!(r.refusal().contains("does not fit"), "{}", r.refusal());
        // A draft adds its weights and KV.
        let with = fit(m.clone(), Some(m.clone()), req(1024, 1, 1 << 30));
        let without = fit(m.clone(), None, req(1024, 1, 1 << 30));
        assert_eq!(with.draft_bytes, (100 << 20) + m.kv_bytes(1024, 1, None));
        assert!(with.total_bytes >= without.total_bytes + with.draft_bytes);
    }

    #[test]
    fn prefill_peak_takes_the_worst_chunk() {
        let m = footprint();
        // 3000 tokens in chunks of 2048: the full chunk (2048 × 2048) beats
        // the last one (952 rows × 3000 positions).
        let p = m.prefill_peak(2048, 3000);
        assert_eq!(p.attention_scores_bytes, 3 * 9 * 2048 * 2048 * 4);
        assert_eq!(p.rows, 2048);
        // 2100 tokens: the last full chunk (512 rows × 2048) beats the
        // partial one (52 rows × 2100).
        let p = m.prefill_peak(512, 2100);
        assert_eq!(p.attention_scores_bytes, 3 * 9 * 512 * 2048 * 4);
        assert_eq!(
            Footprint::prefill_chunks(512, 2100),
            vec![(512, 2048), (52, 2100)]
        );
        // mlx-bun's CPU attention keeps no scores: the MLP is the larger,
        // in `TILED_ROW_COPIES`.
        let tiled = Footprint {
            tiled_attention: true,
            ..m.clone()
        };
        let p = tiled.prefill_peak(2048, 3000);
        assert_eq!(p.attention_scores_bytes, 0);
        assert_eq!(
            p.total_bytes - p.other_bytes - p.logits_bytes,
            3 * 3 * 2048 * 1536 * 4
        );
        // Short prompts run in one chunk without the dense path below 16 rows.
        let p = m.prefill_peak(2048, 10);
        assert_eq!(p.rows, 10);
        assert_eq!(p.other_bytes, 4 * 10 * 576 * 4 + 10 * 15 * 64 * 4);
    }

    #[test]
    fn reads_meminfo() {
        let text = "MemTotal:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_meminfo(text), Some(2048 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }
}
