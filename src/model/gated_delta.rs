//! Gated DeltaNet, the linear-attention layer of the hybrid Qwen families
//! (Qwen3-Next, Qwen3.5): a short causal depthwise convolution over the
//! projected queries, keys and values, then the gated delta rule
//!
//! ```text
//! S = g · S;   S += k ⊗ (v − S k) · β;   y = S q
//! ```
//!
//! per value head, with a decay `g = exp(−exp(A_log) · softplus(a + dt_bias))`
//! and a write strength `β = sigmoid(b)` per token and head; the output is
//! RMS-normed per head and gated by `silu(z)`. The layer's cache
//! ([`StateCache`]) keeps the last `kernel − 1` convolution inputs and `S`.
//! The recurrence runs as a loop of array ops over the time steps (mlx-lm's
//! `gated_delta_ops`).

use anyhow::{anyhow, bail, Result};
use mlx_rs::fast::rms_norm;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::ops::{
    broadcast_to, concatenate, conv1d, exp, expand_dims_axes, sigmoid, stack, zeros_dtype,
};
use mlx_rs::{Array, Dtype};

use super::layers::{Linear, RmsNorm};
use super::weights::Weights;
use crate::cache::{KvCache, StateCache};

/// The sizes of a gated DeltaNet layer (`linear_*` fields of config.json).
#[derive(Clone, Copy, Debug)]
pub struct DeltaDims {
    /// Number of query/key heads (`linear_num_key_heads`).
    pub num_k_heads: i32,
    /// Number of value heads (`linear_num_value_heads`); a multiple of the key heads.
    pub num_v_heads: i32,
    /// Width of a query/key head (`linear_key_head_dim`).
    pub head_k_dim: i32,
    /// Width of a value head (`linear_value_head_dim`).
    pub head_v_dim: i32,
    /// Width of the causal convolution, in steps (`linear_conv_kernel_dim`).
    pub conv_kernel: i32,
}

impl DeltaDims {
    fn key_dim(&self) -> i32 {
        self.num_k_heads * self.head_k_dim
    }

    fn value_dim(&self) -> i32 {
        self.num_v_heads * self.head_v_dim
    }

    /// Channels of the convolution: queries, keys and values.
    fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }

    pub(crate) fn check(&self) -> Result<()> {
        let all = [
            self.num_k_heads,
            self.num_v_heads,
            self.head_k_dim,
            self.head_v_dim,
            self.conv_kernel,
        ];
        if all.iter().any(|&d| d < 1) {
            bail!("the linear_* sizes of a gated DeltaNet layer must be positive, got {self:?}");
        }
        if self.num_v_heads % self.num_k_heads != 0 {
            bail!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                self.num_v_heads,
                self.num_k_heads
            );
        }
        Ok(())
    }
}

/// The input projections, as each family stores them.
#[derive(Clone)]
pub enum InProj {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, their rows grouped per
    /// key head (each group: q, k, then that group's value heads of v, z;
    /// its value heads of b, a).
    Grouped(Box<GroupedProj>),
    /// Qwen3.5: `in_proj_qkv` (all q, all k, all v), `in_proj_z`,
    /// `in_proj_b`, `in_proj_a`.
    Split(Box<SplitProj>),
}

/// Qwen3-Next's two fused input projections.
#[derive(Clone)]
pub struct GroupedProj {
    /// `in_proj_qkvz`: queries, keys, values and the output gate `z`.
    pub qkvz: Linear,
    /// `in_proj_ba`: the write strength `b` and decay input `a` per value head.
    pub ba: Linear,
}

/// Qwen3.5's four input projections.
#[derive(Clone)]
pub struct SplitProj {
    /// `in_proj_qkv`: all queries, keys, then values.
    pub qkv: Linear,
    /// `in_proj_z`: the output gate per value channel.
    pub z: Linear,
    /// `in_proj_b`: the write strength's logit per value head.
    pub b: Linear,
    /// `in_proj_a`: the decay's input per value head.
    pub a: Linear,
}

/// A gated DeltaNet layer (mlx-lm's `GatedDeltaNet`): short convolution,
/// then the gated delta rule over a running state.
#[derive(Clone)]
pub struct GatedDeltaNet {
    /// Projects the hidden states to q, k, v, `z`, `b` and `a`.
    pub in_proj: InProj,
    /// Depthwise convolution weights `[channels, kernel, 1]` (no bias).
    pub conv1d: Array,
    /// Added to `a` before the softplus of the decay, per value head.
    pub dt_bias: Array,
    /// `log A` per value head, float32.
    pub a_log: Array,
    /// The per-head RMS norm before the `silu(z)` gate.
    pub norm: RmsNorm,
    /// Projects the gated output back to the hidden size.
    pub out_proj: Linear,
    /// The layer's sizes.
    pub dims: DeltaDims,
}

impl GatedDeltaNet {
    /// Loads the layer at `prefix` (`...layers.{i}.linear_attn`); `grouped`
    /// picks Qwen3-Next's fused projections. Also says whether the
    /// convolution was stored in the Hugging Face layout (and converted).
    pub(crate) fn load(
        w: &mut Weights,
        prefix: &str,
        dims: DeltaDims,
        eps: f32,
        grouped: bool,
    ) -> Result<(Self, bool)> {
        // mlx-lm's construction draws twice per layer: the convolution's
        // initial weight and the initial `A` (seeded sampling counts draws).
        w.count_init_draws(2);
        let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{prefix}.{name}"));
        let in_proj = if grouped {
            InProj::Grouped(Box::new(GroupedProj {
                qkvz: lin(w, "in_proj_qkvz")?,
                ba: lin(w, "in_proj_ba")?,
            }))
        } else {
            InProj::Split(Box::new(SplitProj {
                qkv: lin(w, "in_proj_qkv")?,
                z: lin(w, "in_proj_z")?,
                b: lin(w, "in_proj_b")?,
                a: lin(w, "in_proj_a")?,
            }))
        };
        let name = format!("{prefix}.conv1d.weight");
        let (conv, hugging_face) = conv_weight_for_mlx(w.take(&name)?)?;
        let want = [dims.conv_dim(), dims.conv_kernel, 1];
        if conv.shape() != want {
            bail!(
                "tensor {name:?} has shape {:?}, expected {want:?} (2 × linear_num_key_heads × \
                 linear_key_head_dim + linear_num_value_heads × linear_value_head_dim, \
                 linear_conv_kernel_dim, 1)",
                conv.shape()
            );
        }
        let layer = Self {
            in_proj,
            conv1d: conv,
            dt_bias: w.take(&format!("{prefix}.dt_bias"))?,
            a_log: w
                .take(&format!("{prefix}.A_log"))?
                .as_dtype(Dtype::Float32)?,
            norm: RmsNorm::load(w, &format!("{prefix}.norm"), eps)?,
            out_proj: lin(w, "out_proj")?,
            dims,
        };
        Ok((layer, hugging_face))
    }

    /// The convolution input `[B, S, channels]`, the gate `z` `[B, S, Hv, Dv]`
    /// and the per-head `b`, `a` `[B, S, Hv]`.
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Array)> {
        let d = self.dims;
        let (bsz, s) = (x.shape()[0], x.shape()[1]);
        match &self.in_proj {
            InProj::Grouped(p) => {
                let per = d.num_v_heads / d.num_k_heads;
                let (dk, nk) = (d.head_k_dim, d.num_k_heads);
                let qkvz = p.qkvz.forward(x)?.reshape(&[bsz, s, nk, -1])?;
                let ba = p.ba.forward(x)?.reshape(&[bsz, s, nk, -1])?;
                let vz = per * d.head_v_dim;
                let q = qkvz.index((Ellipsis, ..dk));
                let k = qkvz.index((Ellipsis, dk..2 * dk));
                let v = qkvz.index((Ellipsis, 2 * dk..2 * dk + vz));
                let z = qkvz.index((Ellipsis, 2 * dk + vz..));
                let flat = |t: Array| t.reshape(&[bsz, s, -1]);
                let mixed = concatenate(&[flat(q)?, flat(k)?, flat(v)?], -1)?;
                let z = z.reshape(&[bsz, s, d.num_v_heads, d.head_v_dim])?;
                let b = ba
                    .index((Ellipsis, ..per))
                    .reshape(&[bsz, s, d.num_v_heads])?;
                let a = ba
                    .index((Ellipsis, per..))
                    .reshape(&[bsz, s, d.num_v_heads])?;
                Ok((mixed, z, b, a))
            }
            InProj::Split(p) => Ok((
                p.qkv.forward(x)?,
                p.z.forward(x)?
                    .reshape(&[bsz, s, d.num_v_heads, d.head_v_dim])?,
                p.b.forward(x)?,
                p.a.forward(x)?,
            )),
        }
    }

    /// The layer's output `[B, L, hidden]` for `x` `[B, L, hidden]`, advancing
    /// the convolution inputs and state in `cache` (a state cache).
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let kind = cache.kind();
        let state = cache.as_state_mut().ok_or_else(|| {
            anyhow!("a gated DeltaNet layer keeps a recurrent state, not a {kind} cache")
        })?;
        let d = self.dims;
        let (bsz, s) = (x.shape()[0], x.shape()[1]);
        let (mixed, z, b, a) = self.project(x)?;

        // The short causal convolution over this step's inputs and the
        // last `kernel - 1` ones.
        let (conv, kept) = causal_conv1d(state.conv(), &mixed, &self.conv1d)?;
        let conv = &conv * &sigmoid(&conv)?;

        let kd = d.key_dim();
        let q = conv.index((Ellipsis, ..kd));
        let k = conv.index((Ellipsis, kd..2 * kd));
        let v = conv.index((Ellipsis, 2 * kd..));
        let (q, k) = normalize_qk(
            &q.reshape(&[bsz, s, d.num_k_heads, d.head_k_dim])?,
            &k.reshape(&[bsz, s, d.num_k_heads, d.head_k_dim])?,
            d.head_k_dim,
        )?;
        let v = v.reshape(&[bsz, s, d.num_v_heads, d.head_v_dim])?;

        let beta = sigmoid(&b)?;
        let decay = {
            let rate = mlx_rs::nn::softplus(&(&a + &self.dt_bias))?;
            exp(&(&(-&exp(&self.a_log)?) * &rate))?
        };
        let initial = match state.recurrent() {
            Some(r) => r.clone(),
            None => zeros_dtype(
                &[bsz, d.num_v_heads, d.head_v_dim, d.head_k_dim],
                Dtype::Float32,
            )?,
        };
        let (y, recurrent) = delta_rule(&q, &k, &v, &decay, &beta, initial, d)?;
        state.advance(kept, recurrent, s as usize);

        let normed = rms_norm(&y, Some(&self.norm.weight), self.norm.eps)?;
        let gate = z.as_dtype(Dtype::Float32)?;
        let gated = &(&gate * &sigmoid(&gate)?) * &normed.as_dtype(Dtype::Float32)?;
        let out = gated.as_dtype(y.dtype())?.reshape(&[bsz, s, -1])?;
        self.out_proj.forward(&out)
    }
}

/// The short causal depthwise convolution of `x` `[B, S, channels]` with
/// `weight` `[channels, kernel, 1]` (no bias), continuing from `earlier`,
/// the last `kernel - 1` inputs before `x` (zeros when `None`): the output
/// `[B, S, channels]` and the last `kernel - 1` inputs, the next call's
/// `earlier`. Shared by the gated DeltaNet and LFM2's short convolution.
/// A depthwise convolution weight in MLX's `[channels, kernel, 1]`, and
/// whether it came in Hugging Face's `[channels, 1, kernel]`.
pub(crate) fn conv_weight_for_mlx(conv: Array) -> Result<(Array, bool)> {
    let hugging_face = conv.ndim() == 3 && conv.shape()[2] != 1;
    if hugging_face {
        return Ok((conv.swap_axes(1, 2)?, true));
    }
    Ok((conv, false))
}

pub(crate) fn causal_conv1d(
    earlier: Option<&Array>,
    x: &Array,
    weight: &Array,
) -> Result<(Array, Array)> {
    let (channels, kernel) = (weight.shape()[0], weight.shape()[1]);
    let (bsz, s) = (x.shape()[0], x.shape()[1]);
    let earlier = match earlier {
        Some(c) => c.clone(),
        None => zeros_dtype(&[bsz, kernel - 1, channels], x.dtype())?,
    };
    let input = concatenate(&[earlier, x.clone()], 1)?;
    let kept = input.index((.., s.., ..));
    let out = conv1d(&input, weight, 1, 0, 1, channels)?;
    Ok((out, kept))
}

/// L2-normalized queries and keys (epsilon 1e-6 on the sum of squares),
/// the queries also scaled by `1 / head_dim` and the keys by
/// `1 / sqrt(head_dim)`, written as mlx-lm does with a scaled RMS norm.
fn normalize_qk(q: &Array, k: &Array, head_dim: i32) -> Result<(Array, Array)> {
    let inv = (head_dim as f32).powf(-0.5);
    let eps = 1e-6 * inv * inv;
    let scale = |f: f32| Array::from_f32(f).as_dtype(q.dtype());
    let q = &rms_norm(q, None, eps)? * &scale(inv * inv)?;
    let k = &rms_norm(k, None, eps)? * &scale(inv)?;
    Ok((q, k))
}

/// `t` `[B, S, Hk, D]` with each key head repeated for its value heads.
fn repeat_heads(t: &Array, heads: i32) -> Result<Array> {
    let sh = t.shape();
    let per = heads / sh[2];
    if per == 1 {
        return Ok(t.clone());
    }
    let wide = broadcast_to(
        &expand_dims_axes(t, &[3])?,
        &[sh[0], sh[1], sh[2], per, sh[3]],
    )?;
    Ok(wide.reshape(&[sh[0], sh[1], heads, sh[3]])?)
}

/// The gated delta rule over the `S` steps of `q`, `k` `[B, S, Hk, Dk]`,
/// `v` `[B, S, Hv, Dv]`, `decay`, `beta` `[B, S, Hv]`, from `state`
/// `[B, Hv, Dv, Dk]` (float32): the outputs `[B, S, Hv, Dv]` and the final state.
fn delta_rule(
    q: &Array,
    k: &Array,
    v: &Array,
    decay: &Array,
    beta: &Array,
    mut state: Array,
    d: DeltaDims,
) -> Result<(Array, Array)> {
    let q = repeat_heads(q, d.num_v_heads)?;
    let k = repeat_heads(k, d.num_v_heads)?;
    let steps = q.shape()[1];
    let mut ys = Vec::with_capacity(steps as usize);
    for t in 0..steps {
        let (q_t, k_t, v_t) = (q.index((.., t)), k.index((.., t)), v.index((.., t)));
        let g_t = expand_dims_axes(decay.index((.., t)), &[-1, -2])?;
        let beta_t = expand_dims_axes(beta.index((.., t)), &[-1])?;
        let k_row = expand_dims_axes(&k_t, &[-2])?;
        state = &state * &g_t;
        let remembered = (&state * &k_row).sum_axis(-1, false)?;
        let delta = &(&v_t - &remembered) * &beta_t;
        state = &state + &(&k_row * &expand_dims_axes(&delta, &[-1])?);
        let y = (&state * &expand_dims_axes(&q_t, &[-2])?).sum_axis(-1, false)?;
        ys.push(y.as_dtype(q.dtype())?);
    }
    Ok((stack(&ys, 1)?, state))
}

/// The state cache a gated DeltaNet layer starts from.
pub(crate) fn new_cache() -> Box<dyn KvCache> {
    Box::new(StateCache::new())
}
