//! The Mamba-2 mixer (the `M` layers of Nemotron-H; also the recurrent
//! layers of other hybrid families): `in_proj` yields a gate `z`, the
//! convolution input `xBC` and a step size `dt` per head; a depthwise causal
//! convolution (plus bias, then SiLU) runs over `xBC`, which then splits into
//! the heads' inputs `x` and the groups' `B` and `C`; the selective state
//! space scan
//!
//! ```text
//! dt = clip(softplus(dt + dt_bias));   A = −exp(A_log)
//! S = exp(dt·A) · S + dt · x ⊗ B;      y = S C + D · x
//! ```
//!
//! runs per head (state `[head_dim, state_size]`, `B` and `C` shared by the
//! heads of a group), and the output, gated by `silu(z)`, is RMS-normed per
//! group of channels before `out_proj`.
//!
//! The scan is mlx-lm's `ssm_attn` (state space duality): chunks of up to
//! 256 steps, each as a masked, decaying attention-like product, with the
//! state carried across chunks. Its dtypes follow mlx-lm's: the step sizes,
//! decays and state in float32, the output in the input's dtype. The cache
//! ([`crate::cache::StateCache`], mlx-lm's `ArraysCache` of size 2) keeps the
//! last `conv_kernel − 1` convolution inputs and the state
//! `[rows, heads, head_dim, state_size]`.

use anyhow::{anyhow, bail, Result};
use mlx_rs::fast::rms_norm;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::ops::{
    broadcast_to, concatenate, cumsum, exp, expand_dims_axes, matmul, maximum, minimum, sigmoid,
    tril,
};
use mlx_rs::{Array, Dtype};

use super::decoder::rms_norm_across_ranks;
use super::gated_delta::causal_conv1d;
use super::layers::{Linear, RmsNorm};
use super::weights::Weights;
use crate::cache::KvCache;

/// The steps one chunk of the scan covers (mlx-lm's `step`).
const CHUNK: i32 = 256;

/// The sizes of a Mamba-2 mixer.
#[derive(Clone, Copy, Debug)]
pub struct Mamba2Dims {
    /// Number of SSM heads (`mamba_num_heads`).
    pub heads: i32,
    /// Channels per head (`mamba_head_dim`).
    pub head_dim: i32,
    /// Number of groups sharing one `B` and `C` (`n_groups`).
    pub groups: i32,
    /// Size of each head's state per channel (`ssm_state_size`).
    pub state_size: i32,
    /// Width of the causal convolution, in steps (`conv_kernel`).
    pub conv_kernel: i32,
}

impl Mamba2Dims {
    /// Channels of the heads' inputs (and of the gate and the output).
    pub fn inner(&self) -> i32 {
        self.heads * self.head_dim
    }

    /// Channels of the convolution: the heads' inputs, `B` and `C`.
    pub fn conv_dim(&self) -> i32 {
        self.inner() + 2 * self.groups * self.state_size
    }

    pub(crate) fn check(&self) -> Result<()> {
        let all = [
            self.heads,
            self.head_dim,
            self.groups,
            self.state_size,
            self.conv_kernel,
        ];
        if all.iter().any(|&d| d < 1) {
            bail!("the sizes of a Mamba-2 layer must be positive, got {self:?}");
        }
        if self.heads % self.groups != 0 {
            bail!(
                "the Mamba-2 heads ({}) must be a multiple of its groups ({})",
                self.heads,
                self.groups
            );
        }
        Ok(())
    }
}

/// Where the step sizes are clipped to (`time_step_limit`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepLimit {
    /// The smallest step size.
    pub min: f32,
    /// The largest step size.
    pub max: f32,
}

impl Default for StepLimit {
    fn default() -> Self {
        Self {
            min: 0.0,
            max: f32::INFINITY,
        }
    }
}

/// A Mamba-2 mixer (mlx-lm's `Mamba2Mixer`): gated selective state space
/// scan behind a depthwise causal convolution.
#[derive(Clone)]
pub struct Mamba2 {
    /// Projects the hidden states to `z`, `xBC` and `dt`.
    pub in_proj: Linear,
    /// Depthwise convolution weights `[conv_dim, kernel, 1]`.
    pub conv1d: Array,
    /// The convolution's bias `[conv_dim]`, if the checkpoint has one.
    pub conv_bias: Option<Array>,
    /// Added to `dt` before the softplus, per head.
    pub dt_bias: Array,
    /// `log A` per head, as stored (mlx-lm does not cast it).
    pub a_log: Array,
    /// The skip connection `D` per head: `y += D · x`.
    pub d: Array,
    /// The gated norm's scale `[inner]`.
    pub norm_weight: Array,
    /// The gated norm's epsilon.
    pub norm_eps: f32,
    /// The groups of channels the gated norm normalizes apart (`n_groups`
    /// for Nemotron-H; 1, all channels at once, for Granite 4).
    pub norm_groups: i32,
    /// Set when the norm's one group of channels is split across ranks.
    pub norm_across_ranks: Option<NormAcrossRanks>,
    /// Projects the gated, normed output back to the hidden size.
    pub out_proj: Linear,
    /// The mixer's sizes.
    pub dims: Mamba2Dims,
    /// Where the step sizes are clipped to.
    pub limit: StepLimit,
}

/// A gated norm over all channels when each rank holds part of them
/// (tensor parallel Granite 4): the sums of squares are summed across
/// `group` and averaged over `width`, the channels of all ranks.
#[derive(Clone)]
pub struct NormAcrossRanks {
    /// The ranks that hold the channels.
    pub group: crate::collective::Group,
    /// The channels of all ranks.
    pub width: i32,
}

impl Mamba2 {
    /// Loads the mixer at `prefix` (`...layers.{i}.mixer`). A convolution
    /// stored in the Hugging Face layout `[channels, 1, kernel]` is turned to
    /// MLX's `[channels, kernel, 1]`, as mlx-lm's `sanitize` does.
    pub(crate) fn load(
        w: &mut Weights,
        prefix: &str,
        dims: Mamba2Dims,
        eps: f32,
        limit: StepLimit,
    ) -> Result<Self> {
        dims.check()?;
        // mlx-lm's `nn.Conv1d` draws its initial weight (its bias is zeros).
        w.count_init_draws(1);
        let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{prefix}.{name}"));
        let name = format!("{prefix}.conv1d.weight");
        let mut conv = w.take(&name)?;
        if conv.ndim() == 3 && conv.shape()[2] != 1 {
            conv = conv.swap_axes(1, 2)?;
        }
        let want = [dims.conv_dim(), dims.conv_kernel, 1];
        if conv.shape() != want {
            bail!(
                "tensor {name:?} has shape {:?}, expected {want:?} (mamba_num_heads × \
                 mamba_head_dim + 2 × n_groups × ssm_state_size, conv_kernel, 1)",
                conv.shape()
            );
        }
        let per_head = |w: &mut Weights, name: &str| -> Result<Array> {
            let full = format!("{prefix}.{name}");
            let a = w.take(&full)?;
            if a.shape() != [dims.heads] {
                bail!(
                    "tensor {full:?} has shape {:?}, expected [{}] (mamba_num_heads)",
                    a.shape(),
                    dims.heads
                );
            }
            Ok(a)
        };
        let norm_name = format!("{prefix}.norm.weight");
        let norm_weight = w.take(&norm_name)?;
        if norm_weight.shape() != [dims.inner()] {
            bail!(
                "tensor {norm_name:?} has shape {:?}, expected [{}] (mamba_num_heads × \
                 mamba_head_dim)",
                norm_weight.shape(),
                dims.inner()
            );
        }
        let in_proj = lin(w, "in_proj")?;
        let rows = in_proj.shape().0;
        let want_rows = dims.inner() + dims.conv_dim() + dims.heads;
        if rows != want_rows {
            bail!(
                "tensor \"{prefix}.in_proj.weight\" has {rows} rows, expected {want_rows} (gate, \
                 convolution input and one step size per head)"
            );
        }
        Ok(Self {
            in_proj,
            conv_bias: w.take_opt(&format!("{prefix}.conv1d.bias"))?,
            conv1d: conv,
            dt_bias: per_head(w, "dt_bias")?,
            a_log: per_head(w, "A_log")?,
            d: per_head(w, "D")?,
            norm_weight,
            norm_eps: eps,
            norm_groups: dims.groups,
            norm_across_ranks: None,
            out_proj: lin(w, "out_proj")?,
            dims,
            limit,
        })
    }

    /// The mixer's output `[B, L, hidden]` for `x` `[B, L, hidden]`, advancing
    /// the convolution inputs and scan state in `cache` (a state cache).
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let kind = cache.kind();
        let state = cache.as_state_mut().ok_or_else(|| {
            anyhow!("a Mamba-2 layer keeps a convolution and a scan state, not a {kind} cache")
        })?;
        let d = self.dims;
        let (bsz, s) = (x.shape()[0], x.shape()[1]);
        let (inner, conv_dim) = (d.inner(), d.conv_dim());
        let projected = self.in_proj.forward(x)?;
        let gate = projected.index((Ellipsis, ..inner));
        let conv_in = projected.index((Ellipsis, inner..inner + conv_dim));
        let dt = projected.index((Ellipsis, inner + conv_dim..));

        let (conv, kept) = causal_conv1d(state.conv(), &conv_in, &self.conv1d)?;
        let conv = match &self.conv_bias {
            Some(b) => &conv + b,
            None => conv,
        };
        let conv = &conv * &sigmoid(&conv)?;
        let bc = d.groups * d.state_size;
        let xs = conv
            .index((Ellipsis, ..inner))
            .reshape(&[bsz, s, d.heads, d.head_dim])?;
        let b =
            conv.index((Ellipsis, inner..inner + bc))
                .reshape(&[bsz, s, d.groups, d.state_size])?;
        let c = conv
            .index((Ellipsis, inner + bc..))
            .reshape(&[bsz, s, d.groups, d.state_size])?;

        let (y, next) = self.scan(&xs, &b, &c, &dt, state.recurrent().cloned())?;
        state.advance(kept, next, s as usize);
        let y = y.reshape(&[bsz, s, inner])?;
        self.out_proj.forward(&self.gated_norm(&y, &gate)?)
    }

    /// `silu(gate) · y`, RMS-normed per group of `inner / norm_groups` channels,
    /// times the norm's scale (mlx-lm's `MambaRMSNormGated`).
    fn gated_norm(&self, y: &Array, gate: &Array) -> Result<Array> {
        let gated = &(gate * &sigmoid(gate)?) * y;
        if let Some(span) = &self.norm_across_ranks {
            let norm = RmsNorm {
                weight: self.norm_weight.clone(),
                eps: self.norm_eps,
            };
            return rms_norm_across_ranks(&norm, &gated, &span.group, span.width);
        }
        let shape = gated.shape().to_vec();
        let mut grouped = shape.clone();
        let last = grouped.len() - 1;
        grouped[last] = self.norm_groups;
        grouped.push(-1);
        let normed = rms_norm(&gated.reshape(&grouped)?, None, self.norm_eps)?;
        Ok(&self.norm_weight * &normed.reshape(&shape)?)
    }

    /// The scan over `x` `[B, L, heads, head_dim]` with `b`, `c`
    /// `[B, L, groups, state]` and the raw step sizes `dt` `[B, L, heads]`,
    /// from `state` `[B, heads, head_dim, state]` (zeros when `None`): the
    /// outputs `[B, L, heads, head_dim]` in `x`'s dtype and the last state.
    fn scan(
        &self,
        x: &Array,
        b: &Array,
        c: &Array,
        dt: &Array,
        mut state: Option<Array>,
    ) -> Result<(Array, Array)> {
        let (bsz, l, h) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let dt = self.step_sizes(dt)?;
        let a = -&exp(&self.a_log)?.as_dtype(Dtype::Float32)?;
        let dt_a = &dt * &a;
        let dtx = &dt.reshape(&[bsz, l, h, 1])? * x;
        let mut ys = Vec::new();
        let mut start = 0;
        while start < l {
            let end = (start + CHUNK).min(l);
            let (y, next) = self.chunk(
                &dtx.index((.., start..end)),
                &dt_a.index((.., start..end)),
                &b.index((.., start..end)),
                &c.index((.., start..end)),
                state.as_ref(),
            )?;
            ys.push(y.as_dtype(x.dtype())?);
            state = Some(next);
            start = end;
        }
        let y = match ys.len() {
            1 => ys.pop().unwrap(),
            _ => concatenate(&ys, 1)?,
        };
        let skip = self.d.as_dtype(x.dtype())?.reshape(&[1, 1, h, 1])?;
        let state = state.ok_or_else(|| anyhow!("a Mamba-2 scan over no positions"))?;
        Ok((&y + &(x * &skip), state))
    }

    /// `clip(softplus(dt + dt_bias), limit)` in float32 (mlx-lm's `compute_dt`).
    fn step_sizes(&self, dt: &Array) -> Result<Array> {
        let dt = mlx_rs::nn::softplus(&(&dt.as_dtype(Dtype::Float32)? + &self.dt_bias))?;
        let dt = maximum(&dt, Array::from_f32(self.limit.min))?;
        Ok(match self.limit.max.is_finite() {
            true => minimum(&dt, Array::from_f32(self.limit.max))?,
            false => dt,
        })
    }

    /// One chunk of `S` steps: `dtx` `[B, S, H, Dh]` (float32), `dt_a`
    /// `[B, S, H]`, `b`, `c` `[B, S, G, N]`, the state before it
    /// `[B, H, Dh, N]`; its outputs (float32) and the state after it.
    fn chunk(
        &self,
        dtx: &Array,
        dt_a: &Array,
        b: &Array,
        c: &Array,
        state: Option<&Array>,
    ) -> Result<(Array, Array)> {
        let (bsz, s, h, dh) = (
            dtx.shape()[0],
            dtx.shape()[1],
            dtx.shape()[2],
            dtx.shape()[3],
        );
        let (g, n) = (self.dims.groups, self.dims.state_size);
        let per = h / g;
        // `[B, G, ...]` → `[B, H, ...]`, each group's rows for its heads.
        let heads = |t: &Array| -> Result<Array> {
            let sh = t.shape().to_vec();
            let mut wide = sh.clone();
            wide.insert(2, per);
            let mut out = sh.clone();
            out[1] = h;
            Ok(broadcast_to(&expand_dims_axes(t, &[2])?, &wide)?.reshape(&out)?)
        };
        let b_t = b.transpose_axes(&[0, 2, 3, 1])?; // [B, G, N, S]
        let cb = heads(&matmul(&c.swap_axes(1, 2)?, &b_t)?)?; // [B, H, S, S]
        let decay = exp(&segsum(&dt_a.swap_axes(1, 2)?)?)?; // [B, H, S, S]
        let mixing = tril(&(&cb * &decay), 0)?;
        let mut y = matmul(&mixing, &dtx.swap_axes(1, 2)?)?.swap_axes(1, 2)?; // [B, S, H, Dh]

        // What each step leaves in the state at the chunk's end.
        let last = decay
            .index((.., .., s - 1..s, ..))
            .transpose_axes(&[0, 3, 1, 2])?; // [B, S, H, 1]
        let b_h = heads(&b_t)?.swap_axes(2, 3)?; // [B, H, S, N]
        let weighted = (dtx * &last).swap_axes(1, 2)?.swap_axes(2, 3)?; // [B, H, Dh, S]
        let mut next = matmul(&weighted, &b_h)?; // [B, H, Dh, N]

        if let Some(state) = state {
            let carried = exp(&cumsum(dt_a, -2, None, None)?)?; // [B, S, H]
            let kept = carried.index((.., s - 1, ..)).reshape(&[bsz, h, 1, 1])?;
            next = &next + &(&kept * state);
            let c_col = c.reshape(&[bsz, s, g, 1, n, 1])?;
            let from_state = matmul(&state.reshape(&[bsz, 1, g, per, dh, n])?, &c_col)?
                .reshape(&[bsz, s, h, dh])?;
            y = &y + &(&expand_dims_axes(&carried, &[-1])? * &from_state);
        }
        Ok((y, next))
    }
}

/// `out[..., i, j] = x[..., j+1] + … + x[..., i]` for `j < i`, zero on and
/// above the diagonal, for `x` `[..., S]` (mlx-lm's `segsum` without a mask).
fn segsum(x: &Array) -> Result<Array> {
    let s = x.shape()[x.ndim() - 1];
    let mut wide = x.shape().to_vec();
    wide.push(s);
    let rows = broadcast_to(&expand_dims_axes(x, &[-1])?, &wide)?;
    Ok(cumsum(&tril(&rows, -1)?, -2, None, None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::abs;
    use mlx_rs::random::normal;
    use std::collections::HashMap;

    fn randn(shape: &[i32], key: u64) -> Array {
        let key = mlx_rs::random::key(key).unwrap();
        normal::<f32>(shape, None, None, &key).unwrap()
    }

    /// More steps than one chunk in one call equal the steps one at a time
    /// (the plain recurrence, each from the state the last one left).
    #[test]
    fn chunked_scan_equals_the_step_by_step_recurrence() {
        let dims = Mamba2Dims {
            heads: 4,
            head_dim: 3,
            groups: 2,
            state_size: 5,
            conv_kernel: 4,
        };
        let (inner, conv) = (dims.inner(), dims.conv_dim());
        let tensors: HashMap<String, Array> = [
            ("in_proj.weight", randn(&[inner + conv + 4, 8], 0)),
            ("conv1d.weight", randn(&[conv, 4, 1], 1)),
            ("dt_bias", randn(&[4], 2)),
            ("A_log", &randn(&[4], 3) * &Array::from_f32(0.5)),
            ("D", randn(&[4], 4)),
            ("norm.weight", randn(&[inner], 5)),
            ("out_proj.weight", randn(&[8, inner], 6)),
        ]
        .into_iter()
        .map(|(k, v)| (format!("m.{k}"), v))
        .collect();
        let mut w = Weights::from_map(tensors, None, Dtype::Float32).unwrap();
        let m = Mamba2::load(&mut w, "m", dims, 1e-5, StepLimit::default()).unwrap();
        let l = CHUNK + 44;
        let x = randn(&[2, l, 4, 3], 6);
        let b = randn(&[2, l, 2, 5], 7);
        let c = randn(&[2, l, 2, 5], 8);
        let dt = randn(&[2, l, 4], 9);
        let (y, last) = m.scan(&x, &b, &c, &dt, None).unwrap();
        let mut state = None;
        let mut ys = Vec::new();
        for t in 0..l {
            let at = |a: &Array| a.index((.., t..t + 1));
            let (y, s) = m
                .scan(&at(&x), &at(&b), &at(&c), &at(&dt), state.take())
                .unwrap();
            ys.push(y);
            state = Some(s);
        }
        let steps = concatenate(&ys, 1).unwrap();
        let diff = |a: &Array, b: &Array| {
            let scale = abs(b).unwrap().max(None).unwrap().item_cast::<f32>();
            abs(&(a - b)).unwrap().max(None).unwrap().item_cast::<f32>() / scale
        };
        assert!(
            diff(&y, &steps) < 1e-4,
            "outputs differ by {}",
            diff(&y, &steps)
        );
        let state = state.unwrap();
        assert!(
            diff(&last, &state) < 1e-4,
            "states differ by {}",
            diff(&last, &state)
        );
    }
}
