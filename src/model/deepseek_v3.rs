//! DeepSeek-V3 (`deepseek_v3`; Kimi K2's `kimi_k2` is the same class in
//! mlx-lm): multi-head latent attention and a sparse MoE with grouped
//! sigmoid routing.
//!
//! Attention (mlx-lm 0.32.2's `DeepseekV3Attention`): queries through a
//! low-rank bottleneck (`q_a_proj`, `q_a_layernorm`, `q_b_proj`; a plain
//! `q_proj` when `q_lora_rank` is null), each head split into a
//! `qk_nope_head_dim` part and a `qk_rope_head_dim` part; keys and values
//! come from one compressed latent (`kv_a_proj_with_mqa`, normalized by
//! `kv_a_layernorm`) plus a rotary key shared by all heads. The cache holds
//! what mlx-lm's holds: the normalized latent `[B, 1, S, kv_lora_rank]` as
//! keys and the rotated shared key `[B, 1, S, qk_rope_head_dim]` as values.
//! The rotary part of the scores is computed first and enters the softmax as
//! an additive mask; the latent is expanded per head with `embed_q` (keys)
//! and `unembed_out` (values), stacked `[heads, out, in]` as mlx-lm's
//! `sanitize` splits `kv_b_proj`. Several queries (prefill, verification)
//! expand the latent into keys and values; a single query is moved into the
//! latent space instead and attends to the latent directly, as in mlx-lm.
//! RoPE is traditional, with YaRN as `rope_scaling` gives it; the softmax
//! scale takes YaRN's `mscale_all_dim` factor squared.
//!
//! Feed-forward: dense for the first `first_k_dense_replace` layers and off
//! every `moe_layer_freq`-th layer, elsewhere a sparse MoE routed by float32
//! sigmoid scores plus `e_score_correction_bias` over `n_group` groups
//! (`topk_group` kept, see `Routing::SigmoidGroups`), scaled by
//! `routed_scaling_factor`, plus `n_shared_experts` experts' worth of shared
//! MLP.
//!
//! Checkpoints as mlx-lm writes them; Hugging Face ones (experts one by one,
//! `kv_b_proj` unsplit, dense or mlx-quantized) are converted as mlx-lm's
//! `sanitize` does. The multi-token-prediction layer
//! (`model.layers.{num_hidden_layers}`) is dropped. fp8 and
//! compressed-tensors int4 checkpoints are refused.

use anyhow::{bail, Context, Result};
use mlx_rs::fast::scaled_dot_product_attention;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{arange, expand_dims, ge, matmul, select};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::config::{family_args, ModelArgs, RopeScaling};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp};
use super::layers::{Linear, LinearWeight, RmsNorm, Rope};
use super::moe::{ExpertActivation, GroupedSigmoidMoe, MoeLayout, SparseMoe};
use super::quantized_attention::quantized_sdpa;
use super::weights::Weights;
use crate::cache::{KvCache, Mask, QuantizedState};
use crate::quant::{dequantize, quantize, quantized_matmul, QuantSpec};

fn one_f32() -> f32 {
    1.0
}
fn one_i32() -> i32 {
    1
}
fn one_usize() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn kv_lora_rank() -> i32 {
    512
}
fn q_lora_rank() -> Option<i32> {
    Some(1536)
}
fn qk_rope_head_dim() -> i32 {
    64
}
fn head_part() -> i32 {
    128
}
fn noaux_tc() -> String {
    "noaux_tc".into()
}

/// The DeepSeek-V3 fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct DeepseekV3Args {
    #[serde(default)]
    pub n_routed_experts: Option<i32>,
    #[serde(default)]
    pub n_shared_experts: Option<i32>,
    #[serde(default = "one_f32")]
    pub routed_scaling_factor: f32,
    #[serde(default = "kv_lora_rank")]
    pub kv_lora_rank: i32,
    /// `null` means a plain `q_proj`.
    #[serde(default = "q_lora_rank")]
    pub q_lora_rank: Option<i32>,
    #[serde(default = "qk_rope_head_dim")]
    pub qk_rope_head_dim: i32,
    #[serde(default = "head_part")]
    pub v_head_dim: i32,
    #[serde(default = "head_part")]
    pub qk_nope_head_dim: i32,
    #[serde(default = "noaux_tc")]
    pub topk_method: String,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default = "one_i32")]
    pub n_group: i32,
    #[serde(default = "one_i32")]
    pub topk_group: i32,
    #[serde(default = "one_i32")]
    pub num_experts_per_tok: i32,
    #[serde(default = "one_usize")]
    pub moe_layer_freq: usize,
    #[serde(default)]
    pub first_k_dense_replace: usize,
}

pub(crate) const LAYOUT: MoeLayout = MoeLayout {
    router: "gate",
    experts: "switch_mlp",
    hf_names: ["gate_proj", "up_proj", "down_proj"],
    router_key: "mlp.gate",
    activation: ExpertActivation::SwiGlu,
};

impl DeepseekV3Args {
    fn check(&self) -> Result<()> {
        // mlx-lm asserts the method and always scores by sigmoid.
        if self.topk_method != "noaux_tc" {
            bail!(
                "topk_method {:?} is not supported (only noaux_tc, as mlx-lm)",
                self.topk_method
            );
        }
        let dims = [
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("q_lora_rank", self.q_lora_rank.unwrap_or(1)),
            ("moe_layer_freq", self.moe_layer_freq as i32),
        ];
        for (name, v) in dims {
            if v < 1 {
                bail!("{name} must be at least 1, got {v}");
            }
        }
        if self.qk_rope_head_dim % 2 != 0 {
            bail!(
                "qk_rope_head_dim must be even for rotary embeddings, got {}",
                self.qk_rope_head_dim
            );
        }
        if let Some(experts) = self.n_routed_experts {
            let groups = self.n_group;
            if groups < 1 || experts % groups != 0 {
                bail!("n_group ({groups}) must divide n_routed_experts ({experts})");
            }
            if groups > 1 && !(1..=groups).contains(&self.topk_group) {
                bail!(
                    "topk_group ({}) must be between 1 and n_group ({groups})",
                    self.topk_group
                );
            }
            if groups > 1 && experts / groups < 2 {
                bail!("each of the n_group groups needs at least 2 experts");
            }
        }
        Ok(())
    }

    fn sparse(&self, i: usize) -> Option<i32> {
        self.n_routed_experts
            .filter(|_| i >= self.first_k_dense_replace && i.is_multiple_of(self.moe_layer_freq))
    }
}

/// mlx-lm's `MultiLinear`: one `[out, in]` matrix per head, stacked
/// `[heads, out, in]` (dense or quantized along `in`).
#[derive(Clone)]
pub struct MultiLinear {
    /// The stacked per-head matrices `[heads, out, in]`, dense or quantized.
    pub weight: LinearWeight,
}

impl MultiLinear {
    fn load(w: &mut Weights, prefix: &str) -> Result<Self> {
        let spec = w.quant_spec(prefix)?;
        let weight = w.take(&format!("{prefix}.weight"))?;
        // `mx.random.uniform` at construction, and again in the quantized
        // layer `to_quantized` builds.
        w.count_init_draws(1 + usize::from(spec.is_some()));
        if weight.ndim() != 3 {
            bail!(
                "tensor \"{prefix}.weight\" has shape {:?}; expected [heads, out, in]",
                weight.shape()
            );
        }
        let weight = match spec {
            Some(spec) => {
                let (scales, biases) = w.take_quant_params(prefix, spec)?;
                LinearWeight::Quantized {
                    weight,
                    scales,
                    biases,
                    spec,
                }
            }
            None => LinearWeight::Dense(weight),
        };
        Ok(Self { weight })
    }

    /// `[heads, out, in]` from a dense `w`, quantized as `spec` when given.
    fn from_dense(w: Array, spec: Option<QuantSpec>) -> Result<Self> {
        let weight = match spec {
            None => LinearWeight::Dense(w),
            Some(spec) => {
                let mut parts = quantize(&w, spec)?.into_iter();
                let (Some(weight), Some(scales)) = (parts.next(), parts.next()) else {
                    bail!("quantize returned no weight or scales");
                };
                LinearWeight::Quantized {
                    weight,
                    scales,
                    biases: parts.next(),
                    spec,
                }
            }
        };
        Ok(Self { weight })
    }

    /// `x @ wᵀ` per head (`transpose`), else `x @ w`.
    pub fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        match &self.weight {
            LinearWeight::Dense(w) if transpose => Ok(matmul(x, w.swap_axes(-1, -2)?)?),
            LinearWeight::Dense(w) => Ok(matmul(x, w)?),
            LinearWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => quantized_matmul(x, weight, scales, biases.as_ref(), transpose, *spec),
        }
    }
}

/// The latent parts of a multi-head latent attention layer; the block's
/// [`Attention`] keeps `o_proj`, the plain `q_proj` (when `q_lora_rank` is
/// null) and the head count, and hands its forward pass here.
#[derive(Clone)]
pub struct LatentAttention {
    /// `q_a_proj`, `q_a_layernorm`, `q_b_proj`; `None` for a plain `q_proj`.
    pub q_lora: Option<(Linear, RmsNorm, Linear)>,
    /// Projects the hidden states to the compressed KV latent (`kv_lora_rank`)
    /// and the shared rotary key (`qk_rope_head_dim`).
    pub kv_a_proj_with_mqa: Linear,
    /// The RMS norm on the KV latent.
    pub kv_a_layernorm: RmsNorm,
    /// Per head `[kv_lora_rank, qk_nope_head_dim]`: the latent's keys.
    pub embed_q: MultiLinear,
    /// Per head `[v_head_dim, kv_lora_rank]`: the latent's values.
    pub unembed_out: MultiLinear,
    /// RoPE on the rotary part of the queries and key.
    pub rope: Rope,
    /// Width of the compressed KV latent the cache holds.
    pub kv_lora_rank: i32,
    /// Width of each query head's part without RoPE.
    pub qk_nope_head_dim: i32,
    /// Width of the rotary part of the queries and the shared key.
    pub qk_rope_head_dim: i32,
    /// The softmax scale: `(qk_nope_head_dim + qk_rope_head_dim)^-0.5`, times
    /// YaRN's `mscale_all_dim` factor squared where set.
    pub scale: f32,
}

/// The most negative finite value of `dtype` (`mx.finfo(dtype).min`).
fn finfo_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

/// The rotary scores `[B, heads, L, S]` with the cache's mask applied as
/// mlx-lm does (`where(mask, scores, finfo.min)`): the additive mask of the
/// latent attention.
fn masked(scores: Array, mask: Mask) -> Result<Array> {
    let mask = match mask {
        Mask::None => return Ok(scores),
        Mask::Causal => {
            let sh = scores.shape();
            let (l, s) = (sh[sh.len() - 2], sh[sh.len() - 1]);
            let qi = expand_dims(&arange::<_, i32>(s - l, s, None)?, 1)?;
            let ki = expand_dims(&arange::<_, i32>(0, s, None)?, 0)?;
            ge(&qi, &ki)?
        }
        Mask::Array(m) if m.dtype() != Dtype::Bool => return Ok(&scores + &m),
        Mask::Array(m) => m,
    };
    let floor = Array::from_f32(finfo_min(scores.dtype())).as_dtype(scores.dtype())?;
    Ok(select(&mask, &scores, &floor)?)
}

impl LatentAttention {
    pub(super) fn forward(
        &self,
        attn: &Attention,
        x: &Array,
        cache: &mut dyn KvCache,
    ) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = attn.n_heads;
        let (nope, rope_dim, rank) = (
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.kv_lora_rank,
        );
        let q = match &self.q_lora {
            Some((a, norm, b_proj)) => b_proj.forward(&norm.forward(&a.forward(x)?)?)?,
            None => attn.q_proj.forward(x)?,
        };
        let q = q
            .reshape(&[b, l, heads, nope + rope_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let q_nope = q.index((.., .., .., ..nope));
        let q_pe = q.index((.., .., .., nope..));
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let latent = compressed.index((.., .., ..rank));
        let k_pe = compressed
            .index((.., .., rank..))
            .reshape(&[b, l, 1, rope_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let latent = self.kv_a_layernorm.forward(&latent)?;
        let positions = cache.positions();
        let q_pe = self.rope.forward_at(&q_pe, &positions)?;
        let k_pe = self.rope.forward_at(&k_pe, &positions)?;
        let latent = expand_dims(&latent, 1)?;
        let scale = Array::from_f32(self.scale).as_dtype(q_pe.dtype())?;
        let q_pe = &q_pe * &scale;

        if let Some(kv) = cache.update_quantized(&latent, &k_pe)? {
            // mlx-lm's class cannot run over a quantized cache (it takes the
            // packed tuple for an array); here the single-query form runs
            // for every query count, on the packed latent and rotary key.
            let s = kv.len();
            let (g, bits) = (kv.group_size, kv.bits);
            let [pw, ps, pb] = &kv.values;
            let spec = QuantSpec::affine(g, bits);
            let pe = quantized_matmul(&q_pe, pw, ps, Some(pb), true, spec)?;
            let pe = masked(pe, cache.mask(l, s)?)?;
            // Heads folded into the query axis: the latent is one head.
            let q = self
                .embed_q
                .forward(&q_nope, true)?
                .reshape(&[b, 1, heads * l, rank])?;
            let latent_kv = QuantizedState {
                keys: kv.keys.clone(),
                values: kv.keys,
                group_size: g,
                bits,
                buffers: None,
            };
            let pe = pe.reshape(&[b, 1, heads * l, s])?;
            let out = quantized_sdpa(&q, &latent_kv, self.scale, Mask::Array(pe))?
                .reshape(&[b, heads, l, rank])?;
            let out = self.unembed_out.forward(&out, true)?;
            let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
            return attn.o_proj.forward(&out);
        }

        let (latent, k_pe) = cache.update_and_fetch(&latent, &k_pe)?;
        let s = latent.shape()[2];
        let pe = matmul(&q_pe, k_pe.swap_axes(-1, -2)?)?;
        let pe = masked(pe, cache.mask(l, s)?)?;
        let out = if l == 1 {
            let q = self.embed_q.forward(&q_nope, true)?;
            let out = scaled_dot_product_attention(&q, &latent, &latent, self.scale, &pe, None)?;
            self.unembed_out.forward(&out, true)?
        } else {
            let k = self.embed_q.forward(&latent, false)?;
            let v = self.unembed_out.forward(&latent, true)?;
            scaled_dot_product_attention(&q_nope, &k, &v, self.scale, &pe, None)?
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        attn.o_proj.forward(&out)
    }
}

/// `embed_q` and `unembed_out` of a layer: as stored, or split from a
/// Hugging Face `kv_b_proj` (`[heads × (nope + v), kv_lora_rank]`), requantized
/// as it was, as mlx-lm's `sanitize`.
fn latent_projections(
    w: &mut Weights,
    prefix: &str,
    heads: i32,
    extra: &DeepseekV3Args,
) -> Result<(MultiLinear, MultiLinear)> {
    let kv_b = format!("{prefix}.kv_b_proj");
    if !w.contains(&format!("{kv_b}.weight")) {
        return Ok((
            MultiLinear::load(w, &format!("{prefix}.embed_q"))?,
            MultiLinear::load(w, &format!("{prefix}.unembed_out"))?,
        ));
    }
    let spec = w.quant_spec(&kv_b)?;
    let weight = w.take(&format!("{kv_b}.weight"))?;
    let dense = match spec {
        Some(spec) => {
            let (scales, biases) = w.take_quant_params(&kv_b, spec)?;
            dequantize(&weight, &scales, biases.as_ref(), spec)?
        }
        None => weight,
    };
    w.count_init_draws(2 * (1 + usize::from(spec.is_some())));
    let (wk, wv) = split_kv_b_proj(&dense, heads, extra.qk_nope_head_dim, extra.v_head_dim)
        .with_context(|| format!("{kv_b}.weight"))?;
    Ok((
        MultiLinear::from_dense(wk, spec)?,
        MultiLinear::from_dense(wv, spec)?,
    ))
}

/// A dense `kv_b_proj` (`[heads × (nope + v), kv_lora_rank]`) split as
/// mlx-lm's `sanitize`: per head, the keys' part transposed (`embed_q`,
/// `[heads, kv_lora_rank, nope]`) and the values' part (`unembed_out`,
/// `[heads, v, kv_lora_rank]`).
pub(crate) fn split_kv_b_proj(
    dense: &Array,
    heads: i32,
    nope: i32,
    v_head_dim: i32,
) -> Result<(Array, Array)> {
    let v = dense
        .reshape(&[heads, nope + v_head_dim, -1])
        .with_context(|| format!("not {heads} heads of {nope} + {v_head_dim} rows"))?;
    let wk = v.index((.., ..nope, ..)).swap_axes(-1, -2)?;
    let wv = v.index((.., nope.., ..));
    Ok((wk, wv))
}

/// The softmax scale: `(nope + rope)^-0.5`, times YaRN's
/// `(0.1 · mscale_all_dim · ln factor + 1)²` when the config's
/// `rope_scaling` gives a `mscale_all_dim` and a factor above 1 (mlx-lm reads
/// them whatever the scaling type).
fn softmax_scale(args: &ModelArgs, extra: &DeepseekV3Args) -> Result<f32> {
    let mut scale = ((extra.qk_nope_head_dim + extra.qk_rope_head_dim) as f64).powf(-0.5);
    if let Some(map) = args.rope_scaling.as_ref().and_then(|v| v.as_object()) {
        let all_dim = map
            .get("mscale_all_dim")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0);
        if all_dim != 0.0 {
            let Some(factor) = map.get("factor").and_then(serde_json::Value::as_f64) else {
                bail!("rope_scaling.factor is required with mscale_all_dim");
            };
            if factor > 1.0 {
                let s = 0.1 * all_dim * factor.ln() + 1.0;
                scale *= s * s;
            }
        }
    }
    Ok(scale as f32)
}

fn attention(
    w: &mut Weights,
    prefix: &str,
    args: &ModelArgs,
    extra: &DeepseekV3Args,
    rope: &Rope,
    scale: f32,
) -> Result<Attention> {
    // mlx-lm's two latent norms keep eps 1e-6 whatever `rms_norm_eps` says.
    let eps = 1e-6;
    let heads = args.num_attention_heads;
    let dtype = w.compute_dtype();
    let empty = || -> Result<Linear> {
        Ok(Linear {
            weight: LinearWeight::Dense(mlx_rs::ops::zeros_dtype(&[0, 0], dtype)?),
            bias: None,
            lora: None,
            all_sum: None,
        })
    };
    let (q_proj, q_lora) = match extra.q_lora_rank {
        None => (Linear::load(w, &format!("{prefix}.q_proj"))?, None),
        Some(_) => {
            let a = Linear::load(w, &format!("{prefix}.q_a_proj"))?;
            let norm = RmsNorm::load(w, &format!("{prefix}.q_a_layernorm"), eps)?;
            let b = Linear::load(w, &format!("{prefix}.q_b_proj"))?;
            (empty()?, Some((a, norm, b)))
        }
    };
    let kv_a_proj_with_mqa = Linear::load(w, &format!("{prefix}.kv_a_proj_with_mqa"))?;
    let kv_a_layernorm = RmsNorm::load(w, &format!("{prefix}.kv_a_layernorm"), eps)?;
    let (embed_q, unembed_out) = latent_projections(w, prefix, heads, extra)?;
    let o_proj = Linear::load(w, &format!("{prefix}.o_proj"))?;
    let mut attn = Attention::absent(w.compute_dtype())?;
    attn.q_proj = q_proj;
    attn.o_proj = o_proj;
    attn.n_heads = heads;
    attn.n_kv_heads = 1;
    attn.head_dim = extra.qk_nope_head_dim + extra.qk_rope_head_dim;
    attn.scale = scale;
    attn.latent = Some(Box::new(LatentAttention {
        q_lora,
        kv_a_proj_with_mqa,
        kv_a_layernorm,
        embed_q,
        unembed_out,
        rope: rope.clone(),
        kv_lora_rank: extra.kv_lora_rank,
        qk_nope_head_dim: extra.qk_nope_head_dim,
        qk_rope_head_dim: extra.qk_rope_head_dim,
        scale,
    }));
    Ok(attn)
}

fn sparse_layer(
    w: &mut Weights,
    prefix: &str,
    extra: &DeepseekV3Args,
    experts: i32,
) -> Result<SparseMoe> {
    GroupedSigmoidMoe {
        family: "DeepSeek-V3",
        experts,
        top_k: extra.num_experts_per_tok,
        n_group: extra.n_group,
        topk_group: extra.topk_group,
        normalize: extra.norm_topk_prob,
        routed_scale: extra.routed_scaling_factor,
        shared_experts: extra.n_shared_experts.is_some(),
        layout: LAYOUT,
    }
    .load(w, prefix)
}

/// The Hugging Face quantized format a tensor name belongs to, of those
/// mlx-lm's `sanitize` dequantizes itself.
pub(crate) fn foreign_quantization(name: &str) -> Option<&'static str> {
    if name.ends_with("weight_scale_inv") {
        Some("fp8 block-quantized weights")
    } else if name.ends_with("weight_packed") || name.ends_with("weight_shape") {
        Some("compressed-tensors int4 weights")
    } else {
        None
    }
}

/// Refuses the Hugging Face formats mlx-lm's `sanitize` dequantizes itself.
fn refuse_foreign_quantization(w: &Weights) -> Result<()> {
    for name in w.remaining() {
        match foreign_quantization(&name) {
            Some(format) if name.ends_with("weight_scale_inv") => bail!(
                "{name}: {format} are not loaded directly; convert the checkpoint with \
                 `mlx-bun convert --hf-path` first"
            ),
            Some(format) => bail!(
                "{name}: {format} are not supported; convert the checkpoint with \
                 mlx_lm.convert first"
            ),
            None => {}
        }
    }
    Ok(())
}

/// Loads a DeepSeek-V3 decoder (multi-head latent attention, sparse MoE after
/// the first `first_k_dense_replace` layers), dropping the multi-token-prediction
/// layer, from the checkpoint's tensors `w`, the shared config `args` and the
/// raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: DeepseekV3Args = family_args(raw)?;
    extra.check()?;
    refuse_foreign_quantization(w)?;
    let n = args.num_hidden_layers as usize;
    let mtp = format!("model.layers.{n}.");
    for name in w.remaining() {
        if name.starts_with(&mtp) {
            w.take(&name)?;
        }
    }
    let scaling = match &args.rope_scaling {
        Some(v) => RopeScaling::parse(v)?,
        None => None,
    };
    let rope = Rope::new(
        extra.qk_rope_head_dim,
        true,
        args.rope_base(),
        scaling.as_ref(),
    )?;
    let scale = softmax_scale(args, &extra)?;
    let eps = args.rms_norm_eps;
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let self_attn = attention(w, &format!("{p}.self_attn"), args, &extra, &rope, scale)?;
            let mlp = match extra.sparse(i) {
                Some(experts) => {
                    FeedForward::Sparse(sparse_layer(w, &format!("{p}.mlp"), &extra, experts)?)
                }
                None => FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?),
            };
            Block::pre_norm(w, &p, eps, self_attn, mlp)
        })
        .collect::<Result<Vec<_>>>()?;
    let decoder = Decoder::assemble(w, args, layers, DecoderOptions::default())?;
    if decoder.lm_head.is_none() {
        bail!("missing tensor \"lm_head.weight\": DeepSeek-V3 models have an untied output head");
    }
    Ok(decoder)
}

/// The linear layer a LoRA key (mlx-lm's module path inside the block)
/// names in a latent attention layer: `Some(None)` for an attention key this
/// layer lacks (`k_proj`, `v_proj`, and `q_proj` or `q_a_proj` / `q_b_proj`
/// by `q_lora_rank`), `None` when `attn` is not latent or the key is not an
/// attention key.
pub(crate) fn latent_linear<'a>(attn: &'a Attention, key: &str) -> Option<Option<&'a Linear>> {
    let latent = attn.latent.as_ref()?;
    let key = key.strip_prefix("self_attn.")?;
    Some(match (key, &latent.q_lora) {
        ("q_proj", None) => Some(&attn.q_proj),
        ("q_a_proj", Some((a, _, _))) => Some(a),
        ("q_b_proj", Some((_, _, b))) => Some(b),
        ("kv_a_proj_with_mqa", _) => Some(&latent.kv_a_proj_with_mqa),
        ("o_proj", _) => Some(&attn.o_proj),
        _ => None,
    })
}

/// `latent_linear`, mutable.
pub(crate) fn latent_linear_mut<'a>(
    attn: &'a mut Attention,
    key: &str,
) -> Option<Option<&'a mut Linear>> {
    let Attention {
        latent,
        q_proj,
        o_proj,
        ..
    } = attn;
    let latent = latent.as_mut()?;
    let key = key.strip_prefix("self_attn.")?;
    let LatentAttention {
        q_lora,
        kv_a_proj_with_mqa,
        ..
    } = latent.as_mut();
    Some(match (key, q_lora) {
        ("q_proj", None) => Some(q_proj),
        ("q_a_proj", Some((a, _, _))) => Some(a),
        ("q_b_proj", Some((_, _, b))) => Some(b),
        ("kv_a_proj_with_mqa", _) => Some(kv_a_proj_with_mqa),
        ("o_proj", _) => Some(o_proj),
        _ => None,
    })
}

/// The adapters on a latent attention layer's own projections (`q_a_proj`,
/// `q_b_proj`, `kv_a_proj_with_mqa`, in `BLOCK_LINEARS` order).
pub(crate) fn latent_loras_mut(
    latent: &mut Option<Box<LatentAttention>>,
) -> Vec<&mut super::layers::Lora> {
    let Some(latent) = latent.as_mut() else {
        return Vec::new();
    };
    let LatentAttention {
        q_lora,
        kv_a_proj_with_mqa,
        ..
    } = latent.as_mut();
    let mut out = Vec::new();
    if let Some((a, _, b)) = q_lora {
        out.extend(a.lora.as_mut());
        out.extend(b.lora.as_mut());
    }
    out.extend(kv_a_proj_with_mqa.lora.as_mut());
    out
}
