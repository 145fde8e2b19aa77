//! The pre-norm decoder-only transformer that the LLaMA and Qwen families share:
//! RMS norm, grouped-query attention with RoPE, SwiGLU MLP. In the hybrid Qwen
//! families some blocks mix tokens with a gated DeltaNet (`gated_delta.rs`)
//! instead of attention. The architecture files only say which options their
//! family uses.

use anyhow::Result;
use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::sigmoid;
use mlx_rs::Array;

use super::config::ModelArgs;
use super::gated_delta::{self, GatedDeltaNet};
use super::layers::{Embedding, Linear, RmsNorm, Rope};
use super::lfm2::ShortConv;
use super::quantized_attention::quantized_sdpa;
use super::weights::Weights;
use crate::cache::{
    KvCache, KvQuantization, KvSettings, Mask, Positions, QuantizedCache, RotatingCache,
    StandardCache,
};
use crate::kernels::{AttentionHeads, AttentionMask, RopeStart};

/// What differs between the families.
#[derive(Clone, Debug, Default)]
pub struct DecoderOptions {
    /// RMS norm on queries and keys per head (Qwen3).
    pub qk_norm: bool,
    /// Per layer: the sliding attention window, or `None` for full attention.
    /// Empty means full attention everywhere.
    pub layer_windows: Vec<Option<usize>>,
}

/// Grouped-query self-attention with RoPE (mlx-lm's `Attention`), with the
/// options the families add.
#[derive(Clone)]
pub struct Attention {
    /// Projects the hidden states to the queries (and, with `output_gate`, their gates).
    pub q_proj: Linear,
    /// Projects the hidden states to the keys, `n_kv_heads × head_dim` wide.
    pub k_proj: Linear,
    /// Projects the hidden states to the values, `n_kv_heads × head_dim` wide.
    pub v_proj: Linear,
    /// Projects the concatenated heads back to the hidden size.
    pub o_proj: Linear,
    /// RMS norm on the queries (Qwen3's `q_norm`), over `qk_norm_span`.
    pub q_norm: Option<RmsNorm>,
    /// RMS norm on the keys (Qwen3's `k_norm`), over `qk_norm_span`.
    pub k_norm: Option<RmsNorm>,
    /// Number of query heads (`num_attention_heads`).
    pub n_heads: i32,
    /// Number of key/value heads (`num_key_value_heads`); divides `n_heads`.
    pub n_kv_heads: i32,
    /// Width of one head.
    pub head_dim: i32,
    /// Multiplies the attention scores: `head_dim^-0.5` unless the family says otherwise.
    pub scale: f32,
    /// `None` in layers without positional encoding (SmolLM3's NoPE layers).
    pub rope: Option<Rope>,
    /// `cap * tanh(scores / cap)` on the attention logits (Gemma 2); such
    /// attention runs outside the fused kernel.
    pub logit_softcap: Option<f32>,
    /// Per-head attention sink logits `[heads]` (GPT-OSS): a virtual key
    /// every query attends to, carrying no value.
    pub sinks: Option<Array>,
    /// What `q_norm` / `k_norm` normalize over.
    pub qk_norm_span: QkNormSpan,
    /// A position-dependent factor on the queries (Ministral 3).
    pub query_scaling: Option<QueryScaling>,
    /// `q_proj` also yields, per head, a gate on the attention output:
    /// `o_proj(out * sigmoid(gate))` (Qwen3-Next, Qwen3.5).
    pub output_gate: bool,
    /// Multi-head latent attention (DeepSeek-V3), which then runs the
    /// layer with this attention's `q_proj` (when plain), `o_proj` and
    /// `n_heads`; `k_proj` / `v_proj` are empty.
    pub latent: Option<Box<super::deepseek_v3::LatentAttention>>,
}

/// The span of the q/k RMS norms.
#[derive(Clone, Default)]
pub enum QkNormSpan {
    /// Each head on its own (Qwen3, Gemma 3).
    #[default]
    Head,
    /// All heads of the projection at once, before the split (OLMo 3).
    AllHeads,
    /// All heads at once, the heads split across the ranks of `group`
    /// (tensor parallel OLMo 3): the sums of squares are summed across
    /// ranks and averaged over the width of all ranks' heads.
    AllRanks {
        /// The ranks that hold the heads.
        group: crate::collective::Group,
        /// The query heads of all ranks.
        heads: i32,
        /// The key heads of all ranks.
        kv_heads: i32,
    },
}

/// `norm` over the full width of channels split across `group`: `y` is this
/// rank's part (and `norm.weight` its part of the scale); its sum of squares
/// is summed across ranks (in float32, as MLX's fused norm accumulates)
/// before the mean over `width`.
pub(crate) fn rms_norm_across_ranks(
    norm: &RmsNorm,
    y: &Array,
    group: &crate::collective::Group,
    width: i32,
) -> Result<Array> {
    use mlx_rs::ops::{rsqrt, sum_axis};
    let y32 = y.as_dtype(mlx_rs::Dtype::Float32)?;
    let squares = group.all_sum(&sum_axis(&(&y32 * &y32), -1, true)?)?;
    let mean = &squares / &Array::from_f32(width as f32);
    let normed = &y32 * &rsqrt(&(&mean + &Array::from_f32(norm.eps)))?;
    let scaled = &normed * &norm.weight.as_dtype(mlx_rs::Dtype::Float32)?;
    Ok(scaled.as_dtype(y.dtype())?)
}

/// Llama 4's attention temperature tuning: the query at position `p` is
/// multiplied by `1 + beta * ln(1 + floor(p / max_position))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueryScaling {
    /// The strength `beta` (Ministral 3's `rope_parameters.llama_4_scaling_beta`).
    pub beta: f32,
    /// Positions per bucket (`rope_parameters.original_max_position_embeddings`).
    pub max_position: f32,
}

impl QueryScaling {
    /// `q` `[B, H, L, D]` scaled for tokens at `positions`, in the factor's
    /// float32 arithmetic rounded to `q`'s dtype.
    fn apply(&self, q: &Array, positions: &crate::cache::Positions) -> Result<Array> {
        use mlx_rs::ops::{arange, floor, log};
        let l = q.shape()[2];
        let steps = arange::<_, f32>(0, l, None)?;
        let (pos, shape) = match positions {
            crate::cache::Positions::Shared(offset) => {
                (&steps + &Array::from_f32(*offset as f32), vec![l, 1])
            }
            crate::cache::Positions::PerRow(offsets) => (
                &offsets
                    .as_dtype(mlx_rs::Dtype::Float32)?
                    .reshape(&[-1, 1])?
                    + &steps,
                vec![-1, 1, l, 1],
            ),
        };
        let one = Array::from_f32(1.0);
        let bucket = floor(&(&pos / &Array::from_f32(self.max_position)))?;
        let factor = &one + &(&Array::from_f32(self.beta) * &log(&(&one + &bucket))?);
        Ok(q * &factor.reshape(&shape)?.as_dtype(q.dtype())?)
    }
}

impl Attention {
    pub(super) fn load(
        w: &mut Weights,
        prefix: &str,
        args: &ModelArgs,
        opts: &DecoderOptions,
    ) -> Result<Self> {
        let head_dim = args.head_dim();
        let norm = |w: &mut Weights, name: &str| -> Result<Option<RmsNorm>> {
            if opts.qk_norm {
                Ok(Some(RmsNorm::load(
                    w,
                    &format!("{prefix}.{name}"),
                    args.rms_norm_eps,
                )?))
            } else {
                Ok(None)
            }
        };
        Ok(Self {
            q_proj: Linear::load(w, &format!("{prefix}.q_proj"))?,
            k_proj: Linear::load(w, &format!("{prefix}.k_proj"))?,
            v_proj: Linear::load(w, &format!("{prefix}.v_proj"))?,
            o_proj: Linear::load(w, &format!("{prefix}.o_proj"))?,
            q_norm: norm(w, "q_norm")?,
            k_norm: norm(w, "k_norm")?,
            n_heads: args.num_attention_heads,
            n_kv_heads: args.kv_heads(),
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
            rope: Some(Rope::new(
                head_dim,
                args.rope_traditional,
                args.rope_base(),
                args.rope_scaling()?.as_ref(),
            )?),
            logit_softcap: None,
            sinks: None,
            qk_norm_span: QkNormSpan::Head,
            query_scaling: None,
            output_gate: false,
            latent: None,
        })
    }

    /// The queries `[B, L, heads, head_dim]` and, with `output_gate`, the
    /// gate `[B, L, heads × head_dim]`: each head's `q_proj` rows are its
    /// query followed by its gate.
    fn queries(&self, x: &Array) -> Result<(Array, Option<Array>)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let y = self.q_proj.forward(x)?;
        if !self.output_gate {
            return Ok((y, None));
        }
        let y = y.reshape(&[b, l, self.n_heads, 2 * self.head_dim])?;
        let q = y.index((.., .., .., ..self.head_dim));
        let gate = y
            .index((.., .., .., self.head_dim..))
            .reshape(&[b, l, -1])?;
        Ok((q, Some(gate)))
    }

    /// Queries, keys and values `[B, heads, L, head_dim]` before RoPE, and
    /// the output gate, layer by layer, of `x` after `norm` when given.
    pub(crate) fn projections(&self, x: &Array, norm: Option<&RmsNorm>) -> Result<AttentionInputs> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let mut one_launch = None;
        if let Some(weight) = norm.and_then(RmsNorm::in_kernel) {
            one_launch = self.one_launch_qkv(x, Some(weight))?;
        }
        let normed;
        let x = match norm {
            Some(norm) if one_launch.is_none() => {
                normed = norm.forward(x)?;
                &normed
            }
            _ => x,
        };
        if one_launch.is_none() {
            one_launch = self.one_launch_qkv(x, None)?;
        }
        let (q, gate, k, v) = match one_launch {
            Some([q, k, v]) => (q, None, k, v),
            None => {
                let (q, gate) = self.queries(x)?;
                (q, gate, self.k_proj.forward(x)?, self.v_proj.forward(x)?)
            }
        };
        let heads = |y: Array, n: i32, norm: &Option<RmsNorm>, all: i32| -> Result<Array> {
            let y = match (norm, &self.qk_norm_span) {
                (Some(norm), QkNormSpan::Head) => norm.forward(&y.reshape(&[b, l, n, -1])?)?,
                (Some(norm), QkNormSpan::AllHeads) => norm.forward(&y)?.reshape(&[b, l, n, -1])?,
                (Some(norm), QkNormSpan::AllRanks { group, .. }) => {
                    rms_norm_across_ranks(norm, &y, group, all * self.head_dim)?
                        .reshape(&[b, l, n, -1])?
                }
                (None, _) => y.reshape(&[b, l, n, -1])?,
            };
            Ok(y.transpose_axes(&[0, 2, 1, 3])?)
        };
        let (all_q, all_kv) = match &self.qk_norm_span {
            QkNormSpan::AllRanks {
                heads, kv_heads, ..
            } => (*heads, *kv_heads),
            _ => (self.n_heads, self.n_kv_heads),
        };
        let q = heads(q, self.n_heads, &self.q_norm, all_q)?;
        let k = heads(k, self.n_kv_heads, &self.k_norm, all_kv)?;
        let v = heads(v, self.n_kv_heads, &None, all_kv)?;
        Ok(AttentionInputs { q, k, v, gate })
    }

    /// The query, key and value projections' quantized arrays, when all
    /// three are plain quantized layers of one quantization.
    fn plain_qkv(&self) -> Option<([[&Array; 3]; 3], crate::quant::QuantSpec)> {
        let (q, spec) = self.q_proj.plain_quantized()?;
        let (k, k_spec) = self.k_proj.plain_quantized()?;
        let (v, v_spec) = self.v_proj.plain_quantized()?;
        (spec == k_spec && spec == v_spec).then_some(([q, k, v], spec))
    }

    /// The three projections of `x` (after `norm`) by one launch of the
    /// CUDA kernel, where it takes them (plain quantized layers of one
    /// quantization, no output gate, a decode-sized `x` on a GPU).
    fn one_launch_qkv(
        &self,
        x: &Array,
        norm: Option<crate::kernels::cuda::RmsNormWeight>,
    ) -> Result<Option<[Array; 3]>> {
        if self.output_gate {
            return Ok(None);
        }
        let Some(([q, k, v], spec)) = self.plain_qkv() else {
            return Ok(None);
        };
        crate::kernels::cuda::quantized_qkv(x, [q, k, v], spec, norm)
    }

    /// `inputs` with RoPE applied to the queries and keys at `positions`.
    pub(crate) fn rotated(
        &self,
        inputs: AttentionInputs,
        positions: &Positions,
    ) -> Result<AttentionInputs> {
        let Some(rope) = &self.rope else {
            return Ok(inputs);
        };
        Ok(AttentionInputs {
            q: rope.forward_at(&inputs.q, positions)?,
            k: rope.forward_at(&inputs.k, positions)?,
            ..inputs
        })
    }

    /// [`Self::projections`] and [`Self::rotated`] by one CPU primitive where the block allows it: plain
    /// quantized projections of one quantization, RoPE without pre-scaling,
    /// no query/key norms and no output gate.
    fn fused_inputs(&self, x: &Array, positions: &Positions) -> Result<Option<[Array; 3]>> {
        if self.q_norm.is_some() || self.k_norm.is_some() || self.output_gate {
            return Ok(None);
        }
        let Some(rope) = self.rope.as_ref().filter(|r| r.mscale == 1.0) else {
            return Ok(None);
        };
        let Some(([q, k, v], spec)) = self.plain_qkv() else {
            return Ok(None);
        };
        let start = match positions {
            Positions::Shared(offset) => RopeStart::Shared(*offset),
            Positions::PerRow(offsets) => RopeStart::PerRow(offsets),
        };
        let heads = AttentionHeads {
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        };
        crate::kernels::quantized_qkv_rope(x, [q, k, v], spec, heads, &rope.params(), start)
    }

    /// `o_proj` of the attention output `[B, L, heads × head_dim]`, gated,
    /// plus `residual` when given.
    pub(crate) fn output(
        &self,
        out: &Array,
        gate: Option<&Array>,
        residual: Option<&Array>,
    ) -> Result<Array> {
        let gated;
        let out = match gate {
            Some(g) => {
                gated = out * &sigmoid(g)?;
                &gated
            }
            None => out,
        };
        match residual {
            Some(r) => self.o_proj.forward_plus(out, r),
            None => self.o_proj.forward(out),
        }
    }

    /// The attention slot of a layer whose tokens another mixer mixes
    /// (`Block::linear_attn`): empty projections, never run.
    pub(super) fn absent(dtype: mlx_rs::Dtype) -> Result<Self> {
        let empty = || -> Result<Linear> {
            Ok(Linear {
                weight: super::layers::LinearWeight::Dense(mlx_rs::ops::zeros_dtype(
                    &[0, 0],
                    dtype,
                )?),
                bias: None,
                lora: None,
                all_sum: None,
            })
        };
        Ok(Self {
            q_proj: empty()?,
            k_proj: empty()?,
            v_proj: empty()?,
            o_proj: empty()?,
            q_norm: None,
            k_norm: None,
            n_heads: 0,
            n_kv_heads: 0,
            head_dim: 0,
            scale: 1.0,
            rope: None,
            logit_softcap: None,
            sinks: None,
            qk_norm_span: QkNormSpan::Head,
            query_scaling: None,
            output_gate: false,
            latent: None,
        })
    }

    /// The attention output `[B, L, hidden]` for `x` `[B, L, hidden]`, appending
    /// this step's keys and values to `cache`.
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        self.forward_with(x, cache, None)
    }

    /// `residual + self.forward(x, cache)`, the residual added in the output
    /// projection's node where the CPU kernel runs it.
    pub fn forward_plus(
        &self,
        x: &Array,
        cache: &mut dyn KvCache,
        residual: &Array,
    ) -> Result<Array> {
        self.forward_with(x, cache, Some(residual))
    }

    fn forward_with(
        &self,
        x: &Array,
        cache: &mut dyn KvCache,
        residual: Option<&Array>,
    ) -> Result<Array> {
        if let Some(latent) = &self.latent {
            let y = latent.forward(self, x, cache)?;
            return Ok(match residual {
                Some(r) => r + &y,
                None => y,
            });
        }
        let positions = cache.positions();
        let AttentionInputs { q, k, v, gate } = match self.fused_inputs(x, &positions)? {
            Some([q, k, v]) => AttentionInputs {
                q,
                k,
                v,
                gate: None,
            },
            None => {
                let inputs = self.projections(x, None)?;
                if let Some(out) = self.attend_in_place(&inputs, &positions, cache)? {
                    return self.output(&out, inputs.gate.as_ref(), residual);
                }
                self.rotated(inputs, &positions)?
            }
        };
        let out = self.attend(q, k, v, &positions, cache)?;
        self.output(&out, gate.as_ref(), residual)
    }

    /// The heads' outputs `[B, 1, heads × head_dim]` for one new token's
    /// queries, keys and values before RoPE, by one launch of the CUDA decode
    /// attention kernel (RoPE, the cache write in place, the attention) where
    /// it takes this block, step and cache; `None`, with nothing appended,
    /// elsewhere.
    pub(crate) fn attend_in_place(
        &self,
        inputs: &AttentionInputs,
        positions: &Positions,
        cache: &mut dyn KvCache,
    ) -> Result<Option<Array>> {
        let plain = self.query_scaling.is_none()
            && self.sinks.is_none()
            && self.logit_softcap.is_none()
            && self.latent.is_none();
        let (Some(rope), Positions::Shared(offset)) = (&self.rope, positions) else {
            return Ok(None);
        };
        if !plain || rope.mscale != 1.0 || *offset != cache.offset() as i32 {
            return Ok(None);
        }
        let layout = crate::kernels::cuda_attention::DecodeAttention {
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            scale: self.scale,
            rope: rope.params(),
        };
        if !crate::kernels::cuda_attention::applies(&inputs.q, &layout) {
            return Ok(None);
        }
        let Some((keys, values, start)) = cache.reserve_in_place(&inputs.k, &inputs.v, 1)? else {
            return Ok(None);
        };
        crate::kernels::cuda_attention::decode_attention(
            [&inputs.q, &inputs.k, &inputs.v],
            [&keys, &values],
            start,
            &layout,
        )
        .map(Some)
    }

    /// The heads' outputs `[B, L, heads × head_dim]` for queries, keys and
    /// values `[B, heads, L, head_dim]` (RoPE applied at `positions`, the
    /// cache's before this step), appending this step's keys and values to
    /// `cache`: what `o_proj` takes.
    pub(crate) fn attend(
        &self,
        q: Array,
        k: Array,
        v: Array,
        positions: &Positions,
        cache: &mut dyn KvCache,
    ) -> Result<Array> {
        let (b, l) = (q.shape()[0], q.shape()[2]);
        let q = match &self.query_scaling {
            Some(scaling) => scaling.apply(&q, positions)?,
            None => q,
        };
        let heads_last = |out: Array| -> Result<Array> {
            Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
        };
        if let Some(kv) = cache.update_quantized(&k, &v)? {
            if self.sinks.is_some() || self.logit_softcap.is_some() {
                anyhow::bail!(
                    "this model's attention (sinks or soft-capping) cannot run over a quantized \
                     KV cache (--kv-bits); run it without --kv-bits"
                );
            }
            let mask = cache.mask(l, kv.len())?;
            // The cache's buffers where it has them: no slice of each per step.
            let ([kw, ks, kb], [vw, vs, vb]) = match kv.buffers.as_deref() {
                Some([keys, values]) => (keys, values),
                None => (&kv.keys, &kv.values),
            };
            let fused = crate::kernels::quantized_attention(
                &q,
                [kw, ks, kb],
                [vw, vs, vb],
                (kv.bits, kv.group_size),
                self.scale,
                kernel_mask(&mask),
                Some(kv.len()),
            )?;
            if let Some(out) = fused {
                return Ok(out);
            }
            return heads_last(quantized_sdpa(&q, &kv, self.scale, mask)?);
        }
        let in_buffers = self.logit_softcap.is_none()
            && self.sinks.is_none()
            && crate::kernels::attention_takes(&q);
        let fetched = if in_buffers {
            cache.update_in_buffers(&k, &v)?
        } else {
            None
        };
        let (k, v) = match fetched {
            // The cache's buffers where it has them: no slice of each per step.
            Some((keys, values, len)) => {
                let mask = cache.mask(l, len)?;
                let out = crate::kernels::attention_over(
                    &q,
                    &keys,
                    &values,
                    self.scale,
                    kernel_mask(&mask),
                    Some(len),
                )?;
                if let Some(out) = out {
                    return Ok(out);
                }
                let live = |a: &Array| a.index((.., .., ..len, ..));
                (live(&keys), live(&values))
            }
            None => cache.update_and_fetch(&k, &v)?,
        };
        if let Some(cap) = self.logit_softcap {
            let mask = cache.mask(l, k.shape()[2])?;
            return heads_last(super::gemma2::softcapped_attention(
                &q, &k, &v, self.scale, cap, mask,
            )?);
        }
        let mask = cache.mask(l, k.shape()[2])?;
        if self.sinks.is_none() {
            if let Some(out) =
                crate::kernels::attention(&q, &k, &v, self.scale, kernel_mask(&mask))?
            {
                return Ok(out);
            }
        }
        let out = match mask {
            Mask::None => {
                scaled_dot_product_attention(&q, &k, &v, self.scale, None, self.sinks.as_ref())?
            }
            Mask::Causal => scaled_dot_product_attention(
                &q,
                &k,
                &v,
                self.scale,
                ScaledDotProductAttentionMask::Causal,
                self.sinks.as_ref(),
            )?,
            Mask::Array(m) => {
                scaled_dot_product_attention(&q, &k, &v, self.scale, &m, self.sinks.as_ref())?
            }
        };
        heads_last(out)
    }
}

/// Queries, keys and values `[B, heads, L, head_dim]` and the output gate
/// `[B, L, heads × head_dim]` of an attention block.
pub(crate) struct AttentionInputs {
    pub(crate) q: Array,
    pub(crate) k: Array,
    pub(crate) v: Array,
    pub(crate) gate: Option<Array>,
}

/// The CPU attention primitive's view of a cache's mask.
fn kernel_mask(mask: &Mask) -> AttentionMask<'_> {
    match mask {
        Mask::None => AttentionMask::None,
        Mask::Causal => AttentionMask::Causal,
        Mask::Array(m) => AttentionMask::Array(m),
    }
}

/// The gate activation of the gated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (LLaMA, Qwen).
    Silu,
    /// The tanh approximation of GELU (Gemma).
    GeluApprox,
}

/// The gated MLP: `down_proj(act(gate_proj(x)) * up_proj(x))`.
#[derive(Clone)]
pub struct Mlp {
    /// Projects the hidden states to the intermediate size; goes through `activation`.
    pub gate_proj: Linear,
    /// Projects the hidden states to the intermediate size, multiplied by the gate.
    pub up_proj: Linear,
    /// Projects the intermediate size back to the hidden size.
    pub down_proj: Linear,
    /// The gate's activation.
    pub activation: Activation,
}

impl Mlp {
    pub(super) fn load(w: &mut Weights, prefix: &str) -> Result<Self> {
        Ok(Self {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"))?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"))?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"))?,
            activation: Activation::Silu,
        })
    }

    /// The MLP output `[B, L, hidden]` for `x` `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&self.hidden(x)?)
    }

    /// `residual + self.forward(x)`, the residual added in the down
    /// projection's node where the CPU kernel runs it.
    pub fn forward_plus(&self, x: &Array, residual: &Array) -> Result<Array> {
        self.down_proj.forward_plus(&self.hidden(x)?, residual)
    }

    /// `residual + self.forward(norm(x))`, the norm inside the first
    /// products' launch where the CUDA kernel takes them.
    pub(crate) fn forward_after_norm_plus(
        &self,
        norm: &RmsNorm,
        x: &Array,
        residual: &Array,
    ) -> Result<Array> {
        let hidden = match self.fused_silu_glu_after_norm(norm, x)? {
            Some(h) => h,
            None => self.hidden(&norm.forward(x)?)?,
        };
        self.down_proj.forward_plus(&hidden, residual)
    }

    /// `silu(gate(norm(x))) * up(norm(x))` by one CUDA launch, or `None`.
    fn fused_silu_glu_after_norm(&self, norm: &RmsNorm, x: &Array) -> Result<Option<Array>> {
        match (self.quantized_silu_glu(), norm.in_kernel()) {
            (Some((gate, up, spec)), Some(weight)) => {
                crate::kernels::cuda::quantized_silu_glu(x, gate, up, spec, Some(weight))
            }
            _ => Ok(None),
        }
    }

    /// The gate's and up projection's quantized arrays, when the MLP is a
    /// SwiGLU of two plain quantized layers of one quantization.
    fn quantized_silu_glu(&self) -> Option<([&Array; 3], [&Array; 3], crate::quant::QuantSpec)> {
        if self.activation != Activation::Silu {
            return None;
        }
        let (gate, spec) = self.gate_proj.plain_quantized()?;
        let (up, up_spec) = self.up_proj.plain_quantized()?;
        (spec == up_spec).then_some((gate, up, spec))
    }

    /// `act(gate_proj(x)) * up_proj(x)`, the down projection's input.
    fn hidden(&self, x: &Array) -> Result<Array> {
        if let Some(h) = self.fused_silu_glu(x)? {
            return Ok(h);
        }
        let gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        let gate = match self.activation {
            Activation::Silu => &gate * &sigmoid(&gate)?,
            Activation::GeluApprox => super::gemma2::gelu_approx(&gate)?,
        };
        Ok(&gate * &up)
    }

    /// `silu(gate(x)) * up(x)` in one kernel node (decode on the CPU or a
    /// GPU), or `None` where it does not apply.
    fn fused_silu_glu(&self, x: &Array) -> Result<Option<Array>> {
        match self.quantized_silu_glu() {
            Some((gate, up, spec)) => crate::kernels::quantized_silu_glu(x, gate, up, spec),
            None => Ok(None),
        }
    }
}

/// A layer's feed-forward: one gated MLP, or a sparse mixture of experts.
// One per layer, built once: boxing the larger variant would only add an
// indirection on every step.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum FeedForward {
    /// One gated MLP for every token.
    Dense(Mlp),
    /// A sparse mixture of experts, each token routed to its top-k experts.
    Sparse(super::moe::SparseMoe),
}

impl FeedForward {
    /// The feed-forward output `[B, L, hidden]` for `x` `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x),
            FeedForward::Sparse(moe) => moe.forward(x),
        }
    }

    /// `residual + self.forward(x)`, in the last product's node where it can.
    pub fn forward_plus(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward_plus(x, residual),
            FeedForward::Sparse(moe) => Ok(residual + &moe.forward(x)?),
        }
    }

    /// The dense MLP, if this layer has one.
    pub fn dense(&self) -> Option<&Mlp> {
        match self {
            FeedForward::Dense(mlp) => Some(mlp),
            FeedForward::Sparse(_) => None,
        }
    }
}

/// One decoder layer: a token mixer and a feed-forward, joined to the
/// residual stream as `residual` says.
#[derive(Clone)]
pub struct Block {
    /// The token mixer, unless `linear_attn` replaces it.
    pub self_attn: Attention,
    /// A recurrent mixer in place of attention (the gated DeltaNet layers
    /// of the hybrid Qwen families, LFM2's short convolutions);
    /// `self_attn` is then [`Attention::absent`] and the layer's cache a
    /// [`crate::cache::StateCache`].
    pub linear_attn: Option<Box<Recurrent>>,
    /// The layer's feed-forward.
    pub mlp: FeedForward,
    /// The norm before the token mixer (unused with `Residual::PostNorm`).
    pub input_layernorm: RmsNorm,
    /// The norm before the feed-forward, or after attention where `residual` says so.
    pub post_attention_layernorm: RmsNorm,
    /// How the branches join the residual stream.
    pub residual: Residual,
    /// The layer's decode step, compiled on a GPU (`model::compiled`).
    pub(crate) compiled: super::compiled::CompiledSlot,
}

/// A token mixer that keeps a running state instead of keys and values.
#[derive(Clone)]
pub enum Recurrent {
    /// The gated DeltaNet of Qwen3-Next and Qwen3.5.
    GatedDelta(GatedDeltaNet),
    /// LFM2's gated short causal convolution.
    ShortConv(ShortConv),
    /// The Mamba-2 mixer of Nemotron-H and Granite 4.
    Mamba2(super::mamba2::Mamba2),
}

impl Recurrent {
    /// The mixer's output `[B, L, hidden]` for `x` `[B, L, hidden]`, advancing
    /// the running state in `cache`.
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        match self {
            Recurrent::GatedDelta(delta) => delta.forward(x, cache),
            Recurrent::ShortConv(conv) => conv.forward(x, cache),
            Recurrent::Mamba2(mamba) => mamba.forward(x, cache),
        }
    }

    /// The mixer's linear layers by their path inside the block, as mlx-lm
    /// names them (the LoRA sites; Granite 4's names for a Mamba-2 mixer,
    /// which Nemotron-H calls `mixer.*`).
    pub(crate) fn linears(&self) -> Vec<(&'static str, &Linear)> {
        match self {
            Recurrent::GatedDelta(delta) => {
                let mut out = match &delta.in_proj {
                    gated_delta::InProj::Grouped(p) => vec![
                        ("linear_attn.in_proj_qkvz", &p.qkvz),
                        ("linear_attn.in_proj_ba", &p.ba),
                    ],
                    gated_delta::InProj::Split(p) => vec![
                        ("linear_attn.in_proj_qkv", &p.qkv),
                        ("linear_attn.in_proj_z", &p.z),
                        ("linear_attn.in_proj_b", &p.b),
                        ("linear_attn.in_proj_a", &p.a),
                    ],
                };
                out.push(("linear_attn.out_proj", &delta.out_proj));
                out
            }
            Recurrent::ShortConv(conv) => vec![
                ("conv.in_proj", &conv.in_proj),
                ("conv.out_proj", &conv.out_proj),
            ],
            Recurrent::Mamba2(mamba) => vec![
                ("mamba.in_proj", &mamba.in_proj),
                ("mamba.out_proj", &mamba.out_proj),
            ],
        }
    }

    /// `linears`, mutable, in the same order.
    pub(crate) fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        match self {
            Recurrent::GatedDelta(delta) => {
                let mut out = match &mut delta.in_proj {
                    gated_delta::InProj::Grouped(p) => {
                        let p = &mut **p;
                        vec![
                            ("linear_attn.in_proj_qkvz", &mut p.qkvz),
                            ("linear_attn.in_proj_ba", &mut p.ba),
                        ]
                    }
                    gated_delta::InProj::Split(p) => {
                        let p = &mut **p;
                        vec![
                            ("linear_attn.in_proj_qkv", &mut p.qkv),
                            ("linear_attn.in_proj_z", &mut p.z),
                            ("linear_attn.in_proj_b", &mut p.b),
                            ("linear_attn.in_proj_a", &mut p.a),
                        ]
                    }
                };
                out.push(("linear_attn.out_proj", &mut delta.out_proj));
                out
            }
            Recurrent::ShortConv(conv) => vec![
                ("conv.in_proj", &mut conv.in_proj),
                ("conv.out_proj", &mut conv.out_proj),
            ],
            Recurrent::Mamba2(mamba) => vec![
                ("mamba.in_proj", &mut mamba.in_proj),
                ("mamba.out_proj", &mut mamba.out_proj),
            ],
        }
    }
}

/// How a block adds its attention and MLP outputs to the residual stream.
#[derive(Clone)]
pub enum Residual {
    /// `h = x + attn(norm(x))`, `h + mlp(norm(h))`.
    PreNorm,
    /// Both branches times a multiplier (Granite's `residual_multiplier`).
    Scaled(f32),
    /// Gemma's norms around the MLP; `post_attention_layernorm` then
    /// normalizes the attention output instead of the MLP input.
    Sandwich(super::gemma2::SandwichNorms),
    /// No norm before attention or the MLP; `post_attention_layernorm`
    /// normalizes the attention output and this one the MLP output:
    /// `h = x + norm(attn(x))`, `h + norm(mlp(h))` (OLMo 3, EXAONE 4).
    /// The block's `input_layernorm` is then unused.
    PostNorm {
        /// The norm on the MLP output.
        post_feedforward_layernorm: RmsNorm,
    },
    /// Nemotron-H: the mixer alone as a residual layer, between residual
    /// ReLU² MLP layers; the block's `mlp` and `post_attention_layernorm`
    /// are then unused.
    Stack(Box<super::nemotron_h::MlpStack>),
    /// Gemma 4's layer (`gemma4_text.rs`), run by its decoder's own forward
    /// pass: KV-shared layers read other layers' keys and values.
    Gemma4(Box<super::gemma4_text::Gemma4Layer>),
}

impl Block {
    /// A pre-norm block of `self_attn` and `mlp` with its two RMS norms.
    pub(super) fn pre_norm(
        w: &mut Weights,
        prefix: &str,
        eps: f32,
        self_attn: Attention,
        mlp: FeedForward,
    ) -> Result<Self> {
        Ok(Self {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::load(w, &format!("{prefix}.input_layernorm"), eps)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{prefix}.post_attention_layernorm"),
                eps,
            )?,
            residual: Residual::PreNorm,
            linear_attn: None,
            compiled: Default::default(),
        })
    }

    /// A pre-norm block of `self_attn` and `mlp` with the given norms.
    pub(super) fn pre_norm_with(
        input_layernorm: RmsNorm,
        post_attention_layernorm: RmsNorm,
        self_attn: Attention,
        mlp: FeedForward,
    ) -> Self {
        Self {
            self_attn,
            mlp,
            input_layernorm,
            post_attention_layernorm,
            residual: Residual::PreNorm,
            linear_attn: None,
            compiled: Default::default(),
        }
    }

    /// A post-norm block (`Residual::PostNorm`) of `self_attn` and `mlp`,
    /// with its `post_attention_layernorm` and `post_feedforward_layernorm`.
    pub(super) fn post_norm(
        w: &mut Weights,
        prefix: &str,
        args: &ModelArgs,
        self_attn: Attention,
        mlp: FeedForward,
    ) -> Result<Self> {
        let eps = args.rms_norm_eps;
        let norm = |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{prefix}.{name}"), eps);
        Ok(Self {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::unscaled(args.hidden_size, eps, w.compute_dtype())?,
            post_attention_layernorm: norm(w, "post_attention_layernorm")?,
            residual: Residual::PostNorm {
                post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
            },
            linear_attn: None,
            compiled: Default::default(),
        })
    }

    /// The layer's output `[B, L, hidden]` for `x` `[B, L, hidden]`, updating
    /// this layer's `cache`.
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let scale = match &self.residual {
            Residual::Sandwich(norms) => return norms.forward(self, x, cache),
            Residual::Stack(stack) => return stack.forward(self, x, cache),
            Residual::Gemma4(_) => {
                anyhow::bail!("a Gemma 4 layer runs only inside its decoder's forward pass")
            }
            Residual::PostNorm {
                post_feedforward_layernorm,
            } => {
                let r = self.self_attn.forward(x, cache)?;
                let h = x + &self.post_attention_layernorm.forward(&r)?;
                let r = self.mlp.forward(&h)?;
                return Ok(&h + &post_feedforward_layernorm.forward(&r)?);
            }
            Residual::Scaled(m) => Some(Array::from_f32(*m).as_dtype(x.dtype())?),
            Residual::PreNorm => None,
        };
        if scale.is_none() {
            if let Some(out) = super::compiled::forward(self, x, cache)? {
                return Ok(out);
            }
            let normed = self.input_layernorm.forward(x)?;
            let h = match &self.linear_attn {
                Some(delta) => x + &delta.forward(&normed, cache)?,
                None => self.self_attn.forward_plus(&normed, cache, x)?,
            };
            let normed = self.post_attention_layernorm.forward(&h)?;
            return self.mlp.forward_plus(&normed, &h);
        }
        let scaled = |r: Array| match &scale {
            Some(m) => &r * m,
            None => r,
        };
        let normed = self.input_layernorm.forward(x)?;
        let r = match &self.linear_attn {
            Some(delta) => delta.forward(&normed, cache)?,
            None => self.self_attn.forward(&normed, cache)?,
        };
        let h = x + &scaled(r);
        let r = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        Ok(&h + &scaled(r))
    }
}

/// The decoder-only language model: token embedding, the layers, a final
/// RMS norm and the output head.
#[derive(Clone)]
pub struct Decoder {
    /// The token embedding table (`model.embed_tokens`), `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// The decoder layers, in order.
    pub layers: Vec<Block>,
    /// The final RMS norm (`model.norm`).
    pub norm: RmsNorm,
    /// The output head (`lm_head`); `None` when tied to `embed_tokens`
    /// (`tie_word_embeddings`).
    pub lm_head: Option<Linear>,
    /// The family's options the layers were built with.
    pub options: DecoderOptions,
    /// Multiplies the token embeddings (Gemma: `sqrt(hidden_size)`).
    pub embed_scale: Option<f32>,
    /// What the output logits go through last.
    pub logits_map: LogitsMap,
    /// This rank's place in a layer pipeline (set when the model is split
    /// across ranks by layers).
    pub pipeline: Option<super::pipeline::PipelineStage>,
}

impl Decoder {
    /// Loads a LLaMA-style decoder (every layer pre-norm attention and a dense
    /// MLP) from the `model.*` and `lm_head` tensors in `w`.
    pub fn load(w: &mut Weights, args: &ModelArgs, options: DecoderOptions) -> Result<Self> {
        let embed_tokens = Embedding::load(w, "model.embed_tokens")?;
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Block {
                    self_attn: Attention::load(w, &format!("{p}.self_attn"), args, &options)?,
                    mlp: FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?),
                    input_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.input_layernorm"),
                        args.rms_norm_eps,
                    )?,
                    post_attention_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm"),
                        args.rms_norm_eps,
                    )?,
                    residual: Residual::PreNorm,
                    linear_attn: None,
                    compiled: Default::default(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(w, "model.norm", args.rms_norm_eps)?;
        let lm_head = if w.contains("lm_head.weight") {
            Some(Linear::load(w, "lm_head")?)
        } else {
            None
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            options,
            embed_scale: None,
            logits_map: LogitsMap::Identity,
            pipeline: None,
        })
    }

    /// A decoder of the given `layers`, with the embedding, final norm and
    /// (untied) output head every family stores alike.
    pub(super) fn assemble(
        w: &mut Weights,
        args: &ModelArgs,
        layers: Vec<Block>,
        options: DecoderOptions,
    ) -> Result<Self> {
        Self::assemble_at(w, args, "", layers, options)
    }

    /// As `assemble`, the tensors named under `root` (`language_model.`).
    pub(super) fn assemble_at(
        w: &mut Weights,
        args: &ModelArgs,
        root: &str,
        layers: Vec<Block>,
        options: DecoderOptions,
    ) -> Result<Self> {
        let head = format!("{root}lm_head");
        let lm_head = if w.contains(&format!("{head}.weight")) {
            Some(Linear::load(w, &head)?)
        } else {
            None
        };
        Ok(Self {
            embed_tokens: Embedding::load(w, &format!("{root}model.embed_tokens"))?,
            layers,
            norm: RmsNorm::load(w, &format!("{root}model.norm"), args.rms_norm_eps)?,
            lm_head,
            options,
            embed_scale: None,
            logits_map: LogitsMap::Identity,
            pipeline: None,
        })
    }

    /// The (scaled) token embeddings of `inputs`, `[B, L, hidden]`.
    pub fn embed(&self, inputs: &Array) -> Result<Array> {
        let h = self.embed_tokens.forward(inputs)?;
        Ok(match self.embed_scale {
            Some(s) => &h * &Array::from_f32(s).as_dtype(h.dtype())?,
            None => h,
        })
    }

    /// Hidden states after the final norm, `[B, L, hidden]`.
    pub fn hidden(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if super::gemma4_text::is_gemma4(self) {
            return super::gemma4_text::hidden(self, inputs, caches);
        }
        let mut h = self.embed(inputs)?;
        if let Some(stage) = &self.pipeline {
            h = stage.receive(&h)?;
        }
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache.as_mut())?;
        }
        if let Some(stage) = &self.pipeline {
            h = stage.pass_on(&h)?;
        }
        self.norm.forward(&h)
    }

    pub(crate) fn project(&self, hidden: &Array) -> Result<Array> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed_tokens.as_linear(hidden)?,
        };
        self.logits_map.apply(logits)
    }

    /// Logits `[B, L, vocab]` for `inputs` `[B, L]`.
    pub fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let h = self.hidden(inputs, caches)?;
        self.project(&h)
    }

    /// Logits of the last position only, `[B, vocab]`.
    pub(crate) fn forward_last(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn KvCache>],
    ) -> Result<Array> {
        let h = self.hidden(inputs, caches)?;
        let last = h.index((.., -1, ..));
        self.project(&last)
    }

    /// Checks `kv` (`KvSettings::validate`) and that its group size
    /// divides what each attention layer caches.
    pub(crate) fn check_kv(&self, kv: &KvSettings) -> Result<()> {
        kv.validate()?;
        let Some(q) = kv.quantization else {
            return Ok(());
        };
        for i in 0..self.cache_count() {
            if self.layers[i].linear_attn.is_some() {
                continue;
            }
            if let Some(w) = self
                .cached_widths(i)
                .into_iter()
                .find(|w| w % q.group_size != 0)
            {
                anyhow::bail!(
                    "--kv-group-size {} does not divide the {w} values per head that \
                     layer {i} caches",
                    q.group_size
                );
            }
        }
        Ok(())
    }

    /// Caches bounded to `max_kv_size` positions (mlx-lm's
    /// `RotatingKVCache` keeping the first 4) or quantized from
    /// `kv.start` on, after [`Self::check_kv`]. Layers with their own
    /// sliding window keep it.
    pub fn make_caches_with(
        &self,
        max_kv_size: Option<usize>,
        kv: Option<KvQuantization>,
    ) -> Result<Vec<Box<dyn KvCache>>> {
        self.check_kv(&KvSettings {
            max_kv_size,
            quantization: kv,
        })?;
        Ok((0..self.cache_count())
            .map(|i| -> Box<dyn KvCache> {
                if self.layers[i].linear_attn.is_some() {
                    return gated_delta::new_cache();
                }
                match (
                    self.options.layer_windows.get(i).copied().flatten(),
                    max_kv_size,
                    kv,
                ) {
                    (Some(w), _, _) => Box::new(RotatingCache::new(w, 0)),
                    (None, Some(n), _) => Box::new(RotatingCache::new(n, 4)),
                    (None, None, Some(q)) => Box::new(QuantizedCache::new(q)),
                    (None, None, None) => Box::new(StandardCache::new()),
                }
            })
            .collect())
    }

    /// The widths of what layer `i` caches per head and position (a KV
    /// cache is quantized in groups along them): the head size, or a latent
    /// attention's latent and rotary key.
    fn cached_widths(&self, i: usize) -> Vec<i32> {
        let attn = &self.layers[i].self_attn;
        match &attn.latent {
            Some(m) => vec![m.kv_lora_rank, m.qk_rope_head_dim],
            None => vec![attn.head_dim],
        }
    }

    /// How many caches the layers keep: one each, except that Gemma 4's
    /// KV-shared layers keep none (mlx-lm's `make_cache`).
    pub fn cache_count(&self) -> usize {
        super::gemma4_text::cache_count(self).unwrap_or(self.layers.len())
    }

    /// One fresh cache per layer that keeps one: a rotating cache of the window
    /// for sliding-window layers, a state cache for recurrent layers, and an
    /// unbounded one otherwise.
    pub fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        (0..self.cache_count())
            .map(|i| -> Box<dyn KvCache> {
                if self.layers[i].linear_attn.is_some() {
                    return gated_delta::new_cache();
                }
                match self.options.layer_windows.get(i).copied().flatten() {
                    Some(w) => Box::new(RotatingCache::new(w, 0)),
                    None => Box::new(StandardCache::new()),
                }
            })
            .collect()
    }
}

/// The last step on the output logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LogitsMap {
    /// The logits as the head computes them.
    Identity,
    /// `cap * tanh(logits / cap)` (Gemma 2's `final_logit_softcapping`).
    SoftCap(f32),
    /// `logits / d` (Granite's `logits_scaling`).
    Divide(f32),
}

impl LogitsMap {
    /// `logits` `[.., vocab]` mapped as this says.
    pub fn apply(self, logits: Array) -> Result<Array> {
        match self {
            LogitsMap::Identity => Ok(logits),
            LogitsMap::SoftCap(cap) => softcap(logits, Some(cap)),
            LogitsMap::Divide(d) => Ok(&logits / &Array::from_f32(d).as_dtype(logits.dtype())?),
        }
    }
}

/// `cap * tanh(x / cap)`, or `x` without a cap.
pub(crate) fn softcap(x: Array, cap: Option<f32>) -> Result<Array> {
    let Some(cap) = cap else {
        return Ok(x);
    };
    let c = Array::from_f32(cap).as_dtype(x.dtype())?;
    Ok(&mlx_rs::ops::tanh(&(&x / &c))? * &c)
}
