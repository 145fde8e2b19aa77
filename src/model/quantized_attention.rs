//! Attention over a quantized KV cache, as mlx-lm's
//! `quantized_scaled_dot_product_attention`: scores and outputs come from
//! `quantized_matmul` against the packed keys and values, grouped-query
//! heads folded into a repeat axis.

use anyhow::Result;
use mlx_rs::ops::{arange, expand_dims, ge, quantized_matmul, select, softmax_axis};
use mlx_rs::{Array, Dtype};

use crate::cache::{Mask, QuantizedState};

/// The most negative finite value of `dtype` (masked scores).
fn finfo_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

/// Scaled dot-product attention of `queries` `[B, heads, L, D]` over a
/// quantized cache's contents `kv` (`[B, kv_heads, S, *]` triples, as
/// [`crate::cache::KvCache::update_quantized`] returns them), op for op as
/// mlx-lm's `quantized_scaled_dot_product_attention`: the queries scaled,
/// grouped-query heads folded into a repeat axis, scores and outputs by
/// `quantized_matmul`, a precise softmax in between. `mask` is the cache's
/// mask for the `L` queries ([`crate::cache::KvCache::mask`]). Returns
/// `[B, heads, L, D]`.
pub fn quantized_sdpa(
    queries: &Array,
    kv: &QuantizedState,
    scale: f32,
    mask: Mask,
) -> Result<Array> {
    let s = queries.shape();
    let (b, n_heads, l, d) = (s[0], s[1], s[2], s[3]);
    let n_kv = kv.keys[0].shape()[1];
    let repeats = n_heads / n_kv;
    let mut q = queries * Array::from_f32(scale).as_dtype(queries.dtype())?;
    let fold = |a: &[Array; 3]| -> Result<[Array; 3]> {
        if repeats > 1 {
            let [x, y, z] = a;
            Ok([
                expand_dims(x, -3)?,
                expand_dims(y, -3)?,
                expand_dims(z, -3)?,
            ])
        } else {
            Ok(a.clone())
        }
    };
    let (keys, values) = (fold(&kv.keys)?, fold(&kv.values)?);
    if repeats > 1 {
        q = q.reshape(&[b, n_kv, repeats, l, d])?;
    }
    let (g, bits) = (kv.group_size, kv.bits);
    let mut scores = quantized_matmul(&q, &keys[0], &keys[1], &keys[2], true, g, bits)?;
    let mask = match mask {
        Mask::None => None,
        Mask::Causal => {
            let sh = scores.shape();
            let (ql, kl) = (sh[sh.len() - 2], sh[sh.len() - 1]);
            let qi = expand_dims(&arange::<_, i32>(kl - ql, kl, None)?, 1)?;
            let ki = expand_dims(&arange::<_, i32>(0, kl, None)?, 0)?;
            Some(ge(&qi, &ki)?)
        }
        Mask::Array(m) if repeats > 1 && m.ndim() > 3 => Some(expand_dims(&m, -3)?),
        Mask::Array(m) => Some(m),
    };
    if let Some(m) = mask {
        if m.dtype() == Dtype::Bool {
            let floor = Array::from_f32(finfo_min(scores.dtype())).as_dtype(scores.dtype())?;
            scores = select(&m, &scores, &floor)?;
        } else {
            scores = &scores + &m;
        }
    }
    let scores = softmax_axis(&scores, -1, true)?;
    let out = quantized_matmul(&scores, &values[0], &values[1], &values[2], false, g, bits)?;
    if repeats > 1 {
        return Ok(out.reshape(&[b, n_heads, l, d])?);
    }
    Ok(out)
}
