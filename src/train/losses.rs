//! Token log-probabilities through the output head (chunked over tokens so
//! the `[tokens, vocab]` logits stay bounded) and the SFT loss built on them.

use anyhow::{Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, expand_dims};
use mlx_rs::Array;

use super::batches::SftBatch;
use crate::autodiff::forward::TrainForward;
use crate::autodiff::remat::checkpointed;
use crate::model::decoder::Decoder;
use crate::model::layers::{Embedding, Linear};

/// The output projection, detached from the decoder so a checkpointed chunk
/// can own it.
#[derive(Clone)]
pub struct Head {
    lm_head: Option<Linear>,
    embed: Embedding,
    logits_map: crate::model::decoder::LogitsMap,
}

impl Head {
    /// The output projection of `decoder` (its LM head, or the tied embedding).
    pub fn of(decoder: &Decoder) -> Self {
        Self {
            lm_head: decoder.lm_head.clone(),
            embed: decoder.embed_tokens.clone(),
            logits_map: decoder.logits_map,
        }
    }

    /// Logits `[..., vocab]` of final-norm hidden states `[..., hidden]`.
    pub fn logits(&self, hidden: &Array) -> Result<Array> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed.as_linear(hidden)?,
        };
        self.logits_map.apply(logits)
    }

    /// `log p(target)` per row of `hidden` `[n, H]`.
    fn logprobs(&self, hidden: &Array, targets: &Array) -> Result<Array> {
        let logits = self.logits(hidden)?;
        let picked = logits.take_along_axis(expand_dims(targets, -1)?, -1)?;
        let lse = logits.logsumexp_axis(-1, true)?;
        Ok((&picked - &lse).reshape(&[-1])?)
    }
}

/// `log p(targets[i])` for each row `i` of `hidden` `[n, H]`, computed
/// `chunk` rows at a time. With `remat`, each chunk's logits are recomputed
/// in the backward pass instead of being kept.
pub(crate) fn target_logprobs(
    head: &Head,
    hidden: &Array,
    targets: &[i32],
    chunk: usize,
    remat: bool,
) -> Result<Array> {
    let n = targets.len();
    let mut parts = Vec::with_capacity(n.div_ceil(chunk.max(1)));
    let mut start = 0;
    while start < n {
        let end = (start + chunk).min(n);
        let rows = hidden.index(start as i32..end as i32);
        let t = Array::from_slice(&targets[start..end], &[(end - start) as i32]);
        let part = if remat {
            let head = head.clone();
            let body = move |args: &[Array]| -> Result<Vec<Array>> {
                Ok(vec![head.logprobs(&args[0], &t)?])
            };
            checkpointed(body, &[rows])?.remove(0)
        } else {
            head.logprobs(&rows, &t)?
        };
        parts.push(part);
        start = end;
    }
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    concatenate(&parts, 0).context("joining log-prob chunks")
}

/// Rows `indices` of `hidden` flattened to `[B * L, H]`.
pub(crate) fn gather_rows(hidden: &Array, indices: &[i32]) -> Result<Array> {
    let shape = hidden.shape();
    let h = shape[shape.len() - 1];
    let flat = hidden.reshape(&[-1, h])?;
    let idx = Array::from_slice(indices, &[indices.len() as i32]);
    Ok(flat.take_axis(&idx, 0)?)
}

/// The SFT loss of a batch: mean cross-entropy over its supervised
/// positions. Returns `(loss, number of supervised tokens)`.
pub fn sft_loss(
    fwd: &TrainForward,
    batch: &SftBatch,
    chunk: usize,
    remat: bool,
) -> Result<(Array, usize)> {
    let (rows, width) = (batch.rows as i32, batch.width as i32);
    let all = Array::from_slice(&batch.tokens, &[rows, width]);
    let inputs = all.index((.., ..width - 1));
    let (hidden, _) = fwd.hidden(&inputs, None, false)?;
    let positions = batch.supervised();
    let cols = (batch.width - 1) as i32;
    let indices: Vec<i32> = positions
        .iter()
        .map(|&(r, t)| r as i32 * cols + t as i32)
        .collect();
    let targets: Vec<i32> = positions
        .iter()
        .map(|&(r, t)| batch.tokens[r * batch.width + t + 1])
        .collect();
    let picked = gather_rows(&hidden, &indices)?;
    let head = Head::of(fwd.decoder);
    let logp = target_logprobs(&head, &picked, &targets, chunk, remat)?;
    let n = targets.len();
    // As mlx-lm: per-token losses in the logits' dtype, summed in float32.
    let logp = logp.as_dtype(mlx_rs::Dtype::Float32)?;
    let loss = logp.sum(None)?.negative()? / Array::from_f32(n as f32);
    Ok((loss, n))
}
