//! The filters of mlx-lm's sampler chain (`make_sampler`), op for op, so a
//! seeded draw on the same logits picks the same token: top-p, min-p, XTC,
//! top-k, then the categorical draw at the temperature.

use anyhow::Result;
use mlx_rs::ops::argpartition_axis;
use mlx_rs::ops::indexing::{put_along_axis, take_along_axis, IndexOp};
use mlx_rs::ops::{ge, lt, select, softmax_axis, sort_axis};
use mlx_rs::{random, Array, Dtype};

/// A Python float as MLX treats it beside an array: a weak scalar that takes
/// the array's dtype.
pub(crate) fn weak_scalar(x: f64, like: &Array) -> Result<Array> {
    Ok(Array::from_f32(x as f32).as_dtype(like.dtype())?)
}

/// The decimal a user typed for a flag or field that is stored as f32, as
/// the f64 Python would hold (0.7f32 -> 0.7, not 0.699999988).
pub(crate) fn as_typed(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

fn neg_inf(like: &Array) -> Result<Array> {
    weak_scalar(f64::NEG_INFINITY, like)
}

/// Keeps the most likely tokens whose mass reaches `top_p` of the total:
/// tokens below the first kept log-probability (ascending) drop out.
pub(crate) fn top_p(logprobs: &Array, top_p: f64) -> Result<Array> {
    let sorted = sort_axis(logprobs, -1)?;
    let probs = sorted.as_dtype(Dtype::Float32)?.exp()?;
    let mass_above = probs.cumsum(-1, true, false)?;
    let total = &mass_above.index((.., ..1)) + &probs.index((.., ..1));
    let dropped = ge(&mass_above, &(&total * weak_scalar(top_p, &total)?))?.sum_axis(-1, true)?;
    let threshold = take_along_axis(&sorted, &dropped, -1)?;
    Ok(select(
        &lt(logprobs, &threshold)?,
        &neg_inf(logprobs)?,
        logprobs,
    )?)
}

/// Drops tokens less likely than `min_p` times the most likely one, keeping
/// at least `keep` tokens.
pub(crate) fn min_p(logprobs: &Array, min_p: f64, keep: usize) -> Result<Array> {
    let top = logprobs.max_axis(-1, true)?;
    let scaled = &top + weak_scalar(min_p.ln(), &top)?;
    let mut remove = lt(logprobs, &scaled)?;
    if keep > 1 {
        let k = keep as i32;
        let top_ids = argpartition_axis(logprobs, -k, -1)?;
        let vocab = logprobs.shape()[logprobs.ndim() - 1];
        let top_ids = top_ids.index((.., vocab - k..));
        remove = put_along_axis(&remove, &top_ids, Array::from_bool(false), -1)?;
    }
    Ok(select(&remove, &neg_inf(logprobs)?, logprobs)?)
}

/// Exclude Top Choices: with probability `probability` (one uniform draw
/// from `key`), removes every token above `threshold` but the least likely
/// of them; `special` tokens are never removed.
pub(crate) fn xtc(
    logprobs: &Array,
    probability: f64,
    threshold: f64,
    special: &[u32],
    key: &Array,
) -> Result<Array> {
    let probs = softmax_axis(logprobs, -1, None)?;
    let above = mlx_rs::ops::gt(&probs, &weak_scalar(threshold, &probs)?)?;
    let inf = weak_scalar(f64::INFINITY, &probs)?;
    let least_above = select(&above, &probs, &inf)?.min_axis(-1, true)?;
    let mut mask = mlx_rs::ops::gt(&probs, &least_above)?;
    if !special.is_empty() {
        let ids: Vec<i32> = special.iter().map(|&t| t as i32).collect();
        let rows = mask.shape()[0];
        let ids = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let ids = mlx_rs::ops::broadcast_to(&ids, &[rows, special.len() as i32])?;
        mask = put_along_axis(&mask, &ids, Array::from_bool(false), -1)?;
    }
    let draw = random::uniform::<f32, f32>(0.0, 1.0, None, key)?;
    let skip = mlx_rs::ops::gt(&draw, Array::from_f32(probability as f32))?;
    let cut = select(&mask, &neg_inf(logprobs)?, logprobs)?;
    Ok(select(&skip, logprobs, &cut)?)
}

/// Keeps the `k` most likely tokens (ties broken as MLX's partition breaks
/// them); `k` at or above the vocabulary keeps everything.
pub(crate) fn top_k(logprobs: &Array, k: usize) -> Result<Array> {
    let vocab = logprobs.shape()[logprobs.ndim() - 1];
    if k == 0 || k >= vocab as usize {
        return Ok(logprobs.clone());
    }
    let k = k as i32;
    let order = argpartition_axis(&(-logprobs), k - 1, -1)?;
    let drop = order.index((.., k..));
    Ok(put_along_axis(logprobs, &drop, &neg_inf(logprobs)?, -1)?)
}

/// One categorical draw per row from `logprobs / temperature`.
pub(crate) fn categorical(logprobs: &Array, temperature: f64, key: &Array) -> Result<Array> {
    let scaled = logprobs * weak_scalar(1.0 / temperature, logprobs)?;
    Ok(random::categorical(&scaled, -1, None, key)?)
}
