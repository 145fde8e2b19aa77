//! Perplexity as `mlx_lm.perplexity` computes it. Its `load_data`: each
//! row of the dataset is tokenized as mlx-lm's datasets do (chat
//! `messages` through the chat template, `prompt`/`completion` as a user
//! and an assistant turn, `text` encoded with EOS appended), rows are taken
//! in the order of `np.random.permutation` under the seed and concatenated
//! until `num_samples x sequence_length` tokens, then cut into rows of
//! `sequence_length`. Each row is scored on its own (next-token
//! cross-entropy over its `sequence_length - 1` targets); perplexity is
//! `exp` of the mean token loss, with the delta-method standard error
//! mlx-lm prints.

use anyhow::{bail, Context, Result};
use mlx_rs::ops::expand_dims;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};

use crate::eval::data::Record;
use crate::eval::pyrandom::NumpyRandomState;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// How rows are cut from the documents.
#[derive(Clone, Debug)]
pub struct RowOptions {
    /// Tokens per row (`--sequence-length`).
    pub sequence_length: usize,
    /// Rows to keep; `None` keeps every complete row.
    pub num_samples: Option<usize>,
    /// `np.random.seed` of the document order (0 ..= 2^32 - 1).
    pub seed: u64,
}

/// The kind of a dataset, told by its first row as mlx-lm's
/// `create_dataset` tells it: `prompt` and `completion`, else `messages`,
/// else `text`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    /// Rows with `prompt` and `completion`.
    Completions,
    /// Rows with `messages`, rendered through the chat template.
    Chat,
    /// Rows with `text`.
    Text,
}

impl RowFormat {
    /// The format of a dataset whose first row is `first`; an error if it has none of the keys.
    pub fn of(first: &Record) -> Result<Self> {
        let has = |k: &str| first.value.get(k).is_some();
        if has("prompt") && has("completion") {
            Ok(Self::Completions)
        } else if has("messages") {
            Ok(Self::Chat)
        } else if has("text") {
            Ok(Self::Text)
        } else {
            let keys: Vec<&str> = first
                .value
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            bail!(
                "{}: unsupported row (fields: {}); expected \"messages\", \"prompt\" and \"completion\", or \"text\"",
                first.at,
                keys.join(", ")
            )
        }
    }
}

/// The tokens of one row of a `format` dataset (mlx-lm's `process` of its
/// `TextDataset`, `ChatDataset` or `CompletionsDataset`, no prompt mask).
fn record_tokens(tok: &Tokenizer, eos: u32, format: RowFormat, rec: &Record) -> Result<Vec<i32>> {
    let at = &rec.at;
    let field = |k: &str| rec.value.get(k).filter(|v| !v.is_null());
    let tools = field("tools").cloned().unwrap_or(Value::Null);
    let row = match format {
        RowFormat::Text => {
            let text = field("text")
                .and_then(Value::as_str)
                .with_context(|| format!("{at}: no string field \"text\""))?;
            return encode_document(tok, eos, text);
        }
        RowFormat::Chat => {
            let messages = field("messages")
                .filter(|m| m.is_array())
                .with_context(|| format!("{at}: no field \"messages\" holding a list"))?;
            json!({ "messages": messages, "tools": tools })
        }
        RowFormat::Completions => {
            let text = |k: &str| {
                field(k)
                    .and_then(Value::as_str)
                    .with_context(|| format!("{at}: no string field \"{k}\""))
            };
            json!({ "prompt": text("prompt")?, "completion": text("completion")?, "tools": tools })
        }
    };
    let ex = crate::dataset_rows::sft_row(&row, tok, false)
        .map_err(|e| anyhow::anyhow!("{at}: {e:#}"))?;
    Ok(ex.tokens.into_iter().map(|t| t as i32).collect())
}

/// The end-of-sequence id the data pipeline appends (the tokenizer's
/// `eos_token`, as Hugging Face's `eos_token_id`).
pub fn eos_id(tok: &Tokenizer) -> Result<u32> {
    tok.eos_token
        .as_deref()
        .and_then(|t| tok.token_to_id(t))
        .or_else(|| tok.eos_ids.iter().next().copied())
        .context("the tokenizer has no end-of-sequence token")
}

/// Encodes `text` and appends EOS unless it already ends with it (mlx-lm's
/// `TextDataset.process`).
pub fn encode_document(tok: &Tokenizer, eos: u32, text: &str) -> Result<Vec<i32>> {
    let mut ids = tok.encode(text)?;
    if ids.last() != Some(&eos) {
        ids.push(eos);
    }
    Ok(ids.into_iter().map(|t| t as i32).collect())
}

/// Token rows `[n][sequence_length]` from the dataset `records`, as
/// `mlx_lm.perplexity`'s `load_data` builds them.
pub fn token_rows(tok: &Tokenizer, records: &[Record], opts: &RowOptions) -> Result<Vec<Vec<i32>>> {
    let len = opts.sequence_length;
    if len < 2 {
        bail!("sequence length must be at least 2 (got {len})");
    }
    let Some(first) = records.first() else {
        bail!("the data holds no rows");
    };
    let seed = u32::try_from(opts.seed)
        .with_context(|| format!("seed must be at most 2^32 - 1 (got {})", opts.seed))?;
    let format = RowFormat::of(first)?;
    let eos = eos_id(tok)?;
    let order = NumpyRandomState::new(seed).permutation(records.len());
    let wanted = opts.num_samples.map(|n| n * len);
    let mut data: Vec<i32> = Vec::new();
    for i in order {
        if wanted.is_some_and(|w| data.len() >= w) {
            break;
        }
        data.extend(record_tokens(tok, eos, format, &records[i])?);
    }
    let mut rows: Vec<Vec<i32>> = data.chunks_exact(len).map(<[i32]>::to_vec).collect();
    if let Some(n) = opts.num_samples {
        rows.truncate(n);
    }
    if rows.is_empty() {
        bail!(
            "the data holds {} tokens, fewer than one row of {len}",
            data.len()
        );
    }
    Ok(rows)
}

/// The result of scoring token rows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Perplexity {
    /// `exp(mean_loss)`.
    pub perplexity: f64,
    /// Standard error of the perplexity (delta method, as mlx-lm).
    pub standard_error: f64,
    /// Mean next-token cross-entropy over the scored tokens, in nats.
    pub mean_loss: f64,
    /// Rows scored.
    pub rows: usize,
    /// Tokens per row.
    pub sequence_length: usize,
    /// Scored (predicted) tokens: rows × (sequence_length − 1).
    pub tokens: usize,
}

/// Next-token losses of every position of every row, in row order.
pub(crate) fn token_losses(
    model: &Model,
    rows: &[Vec<i32>],
    batch_size: usize,
    on_batch: &mut dyn FnMut(usize, usize),
) -> Result<Vec<f32>> {
    if batch_size == 0 {
        bail!("batch size must be at least 1");
    }
    let width = rows.first().map_or(0, Vec::len);
    if width < 2 || rows.iter().any(|r| r.len() != width) {
        bail!("rows must all have the same length, at least 2");
    }
    let batches = rows.len().div_ceil(batch_size);
    let mut out = Vec::with_capacity(rows.len() * (width - 1));
    for (b, chunk) in rows.chunks(batch_size).enumerate() {
        let n = chunk.len() as i32;
        let flat: Vec<i32> = chunk.iter().flatten().copied().collect();
        let all = Array::from_slice(&flat, &[n, width as i32]);
        let inputs = all.index((.., ..width as i32 - 1));
        let targets = all.index((.., 1..));
        let mut caches = model.make_caches();
        let hidden = model.decoder.hidden(&inputs, &mut caches)?;
        // One row's logits at a time keep the [L, vocab] block bounded.
        for r in 0..n {
            let logits = model
                .decoder
                .project(&hidden.index(r))?
                .as_dtype(Dtype::Float32)?;
            let t = targets.index(r);
            let losses = row_losses(&logits, &t)?;
            eval([&losses])?;
            out.extend_from_slice(losses.as_slice::<f32>());
        }
        on_batch(b + 1, batches);
    }
    Ok(out)
}

/// Cross-entropy of `targets` `[L]` under `logits` `[L, vocab]`.
fn row_losses(logits: &Array, targets: &Array) -> Result<Array> {
    let lse = logits.logsumexp_axis(-1, false)?;
    let picked = logits
        .take_along_axis(expand_dims(targets, -1)?, -1)?
        .squeeze_axes(&[-1])?;
    Ok(lse.subtract(&picked)?)
}

/// Perplexity and its standard error from per-token losses (mlx-lm's
/// `eval_ppl`: sample variance with one degree of freedom removed).
pub(crate) fn summarize(losses: &[f32], rows: usize, sequence_length: usize) -> Result<Perplexity> {
    let n = losses.len();
    if n < 2 {
        bail!("at least two scored tokens are needed (got {n})");
    }
    let mean = losses.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let var = losses
        .iter()
        .map(|&x| (x as f64 - mean).powi(2))
        .sum::<f64>()
        / (n - 1) as f64;
    let ppl = mean.exp();
    Ok(Perplexity {
        perplexity: ppl,
        standard_error: ppl * var.sqrt() / (n as f64).sqrt(),
        mean_loss: mean,
        rows,
        sequence_length,
        tokens: n,
    })
}

/// Scores `rows` with `model`, `batch_size` rows per forward pass;
/// `on_batch(done, total)` after each batch.
pub fn perplexity(
    model: &Model,
    rows: &[Vec<i32>],
    batch_size: usize,
    on_batch: &mut dyn FnMut(usize, usize),
) -> Result<Perplexity> {
    for row in rows {
        let ids: Vec<u32> = row.iter().map(|&t| t as u32).collect();
        model.check_token_ids(&ids)?;
    }
    let losses = token_losses(model, rows, batch_size, on_batch)?;
    summarize(&losses, rows.len(), rows.first().map_or(0, Vec::len))
}
