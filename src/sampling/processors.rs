//! mlx-lm's logits processors (`make_logits_processors`), in its order:
//! logit bias, then the repetition, presence and frequency penalties, each
//! over the last tokens of its own context window.

use std::collections::HashMap;

use anyhow::Result;
use mlx_rs::ops::indexing::scatter_add_single;
use mlx_rs::ops::{lt, select};
use mlx_rs::Array;

use super::filters::weak_scalar;
use super::SamplingParams;

/// Applies the processors `params` asks for to `logits` `[1, vocab]`;
/// `history` is every token before the one being sampled.
pub(crate) fn process(params: &SamplingParams, logits: Array, history: &[u32]) -> Result<Array> {
    let vocab = logits.shape()[logits.ndim() - 1] as usize;
    let mut logits = logits;
    if !params.logit_bias.is_empty() {
        logits = add_bias(&logits, &params.logit_bias, vocab)?;
    }
    if let Some(penalty) = params.repetition_penalty.filter(|&p| p != 0.0) {
        let window = last(history, params.repetition_context_size, vocab);
        if !window.is_empty() {
            logits = repetition(&logits, &window, penalty, vocab)?;
        }
    }
    if params.presence_penalty != 0.0 {
        let window = last(history, params.presence_context_size, vocab);
        if !window.is_empty() {
            logits = presence(&logits, &window, params.presence_penalty, vocab)?;
        }
    }
    if params.frequency_penalty != 0.0 {
        let window = last(history, params.frequency_context_size, vocab);
        if !window.is_empty() {
            logits = frequency(&logits, &window, params.frequency_penalty)?;
        }
    }
    Ok(logits)
}

/// The last `n` tokens of `history` that index the vocabulary.
fn last(history: &[u32], n: usize, vocab: usize) -> Vec<u32> {
    history[history.len().saturating_sub(n)..]
        .iter()
        .copied()
        .filter(|&t| (t as usize) < vocab)
        .collect()
}

fn membership(tokens: &[u32], vocab: usize) -> Array {
    let mut mask = vec![false; vocab];
    for &t in tokens {
        mask[t as usize] = true;
    }
    Array::from_slice(&mask, &[1, vocab as i32])
}

/// `logits.at[:, ids].add(values)`: one addend per listed token, zero elsewhere.
fn add_bias(logits: &Array, bias: &HashMap<u32, f32>, vocab: usize) -> Result<Array> {
    let mut add = vec![0f32; vocab];
    for (&id, &b) in bias {
        if (id as usize) < vocab {
            add[id as usize] += b;
        }
    }
    let add = Array::from_slice(&add, &[1, vocab as i32]).as_dtype(logits.dtype())?;
    Ok(logits + &add)
}

/// Sign-aware: negative logits of seen tokens are multiplied by `penalty`,
/// positive ones divided by it.
fn repetition(logits: &Array, window: &[u32], penalty: f32, vocab: usize) -> Result<Array> {
    let penalty = weak_scalar(penalty as f64, logits)?;
    let negative = lt(logits, weak_scalar(0.0, logits)?)?;
    let penalized = select(&negative, &(logits * &penalty), &(logits / &penalty))?;
    Ok(select(membership(window, vocab), &penalized, logits)?)
}

/// `logits[:, window] -= penalty`: once per distinct token.
fn presence(logits: &Array, window: &[u32], penalty: f32, vocab: usize) -> Result<Array> {
    let lowered = logits - weak_scalar(penalty as f64, logits)?;
    Ok(select(membership(window, vocab), &lowered, logits)?)
}

/// `logits.at[:, window].subtract(penalty)`: once per occurrence, in order.
fn frequency(logits: &Array, window: &[u32], penalty: f32) -> Result<Array> {
    let ids: Vec<i32> = window.iter().map(|&t| t as i32).collect();
    let n = ids.len() as i32;
    let ids = Array::from_slice(&ids, &[n]);
    let updates = mlx_rs::ops::broadcast_to(weak_scalar(-(penalty as f64), logits)?, &[n, 1, 1])?;
    Ok(scatter_add_single(logits, &ids, &updates, 1)?)
}
