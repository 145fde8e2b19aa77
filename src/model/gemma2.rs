//! Gemma 2: the gated MLP with tanh-GELU, RMS norms that scale by
//! `1 + weight`, "sandwich" norms around attention and MLP, embeddings scaled
//! by `sqrt(hidden_size)`, and soft-capped attention and output logits.
//! Every layer attends over the whole context (as mlx-lm, which ignores the
//! checkpoint's `sliding_window`), so Gemma 2 batches like LLaMA.

use anyhow::Result;
use mlx_rs::ops::{arange, expand_dims, ge, matmul, select, softmax_axis, tanh};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{
    softcap, Activation, Attention, Block, Decoder, DecoderOptions, FeedForward, LogitsMap, Mlp,
    Residual,
};
use super::layers::{Embedding, Linear, RmsNorm};
use super::weights::Weights;
use crate::cache::{KvCache, Mask};

/// The Gemma 2 fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct Gemma2Args {
    #[serde(default = "default_query_pre_attn_scalar")]
    pub query_pre_attn_scalar: f32,
    #[serde(default = "default_attn_cap")]
    pub attn_logit_softcapping: Option<f32>,
    #[serde(default = "default_final_cap")]
    pub final_logit_softcapping: Option<f32>,
}

fn default_query_pre_attn_scalar() -> f32 {
    144.0
}

fn default_attn_cap() -> Option<f32> {
    Some(50.0)
}

fn default_final_cap() -> Option<f32> {
    Some(30.0)
}

/// Gemma's `pre_feedforward_layernorm` and `post_feedforward_layernorm`.
#[derive(Clone)]
pub struct SandwichNorms {
    /// The norm on the MLP input.
    pub pre_feedforward_layernorm: RmsNorm,
    /// The norm on the MLP output, before the residual add.
    pub post_feedforward_layernorm: RmsNorm,
}

impl SandwichNorms {
    /// `h = x + post_attn(attn(input(x)))`, `h + post_ff(mlp(pre_ff(h)))`.
    pub fn forward(&self, block: &Block, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let r = block
            .self_attn
            .forward(&block.input_layernorm.forward(x)?, cache)?;
        let h = x + &block.post_attention_layernorm.forward(&r)?;
        let r = block
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        Ok(&h + &self.post_feedforward_layernorm.forward(&r)?)
    }
}

/// A Gemma RMS norm: the stored weight is an offset from one, folded in at
/// load (`rms_norm(x, 1 + w)`, the same arithmetic as mlx-lm's).
pub(super) fn gemma_norm(w: &mut Weights, prefix: &str, eps: f32) -> Result<RmsNorm> {
    let mut norm = RmsNorm::load(w, prefix, eps)?;
    norm.weight = &norm.weight + &Array::from_f32(1.0).as_dtype(norm.weight.dtype())?;
    Ok(norm)
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, in mlx's order.
pub(crate) fn gelu_approx(x: &Array) -> Result<Array> {
    let c = |v: f64| Array::from_f32(v as f32).as_dtype(x.dtype());
    let cube = x.power(&c(3.0)?)?;
    let inner = &c((2.0 / std::f64::consts::PI).sqrt())? * &(x + &(&c(0.044715)? * &cube));
    let half_x = &c(0.5)? * x;
    Ok(&half_x * &(&c(1.0)? + &tanh(&inner)?))
}

/// Attention with soft-capped scores, as mlx-lm's Gemma 2: `q` scaled,
/// `cap * tanh(q k^T / cap)`, masked, softmax in float32, times `v`.
/// Grouped-query heads fold into a repeat axis.
pub(crate) fn softcapped_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    cap: f32,
    mask: Mask,
) -> Result<Array> {
    let s = q.shape();
    let (b, n_heads, l, d) = (s[0], s[1], s[2], s[3]);
    let n_kv = k.shape()[1];
    let repeats = n_heads / n_kv;
    let mut q = q * &Array::from_f32(scale).as_dtype(q.dtype())?;
    let (mut k, mut v) = (k.clone(), v.clone());
    if repeats > 1 {
        q = q.reshape(&[b, n_kv, repeats, l, d])?;
        k = expand_dims(&k, 2)?;
        v = expand_dims(&v, 2)?;
    }
    let scores = softcap(matmul(&q, &k.swap_axes(-1, -2)?)?, Some(cap))?;
    let kl = scores.shape()[scores.ndim() - 1];
    let mask = match mask {
        Mask::None => None,
        Mask::Causal => {
            let qi = expand_dims(&arange::<_, i32>(kl - l, kl, None)?, 1)?;
            let ki = expand_dims(&arange::<_, i32>(0, kl, None)?, 0)?;
            Some(ge(&qi, &ki)?)
        }
        Mask::Array(m) if repeats > 1 && m.ndim() > 3 => Some(expand_dims(&m, -3)?),
        Mask::Array(m) => Some(m),
    };
    let scores = match mask {
        Some(m) if m.dtype() == Dtype::Bool => {
            let floor = Array::from_f32(f32::MIN).as_dtype(scores.dtype())?;
            select(&m, &scores, &floor)?
        }
        Some(m) => &scores + &m,
        None => scores,
    };
    let out = matmul(&softmax_axis(&scores, -1, true)?, &v)?;
    if repeats > 1 {
        return Ok(out.reshape(&[b, n_heads, l, d])?);
    }
    Ok(out)
}

/// One Gemma decoder layer: shared attention and MLP, Gemma norms.
pub(super) fn gemma_block(
    w: &mut Weights,
    prefix: &str,
    args: &ModelArgs,
    qk_norm: bool,
) -> Result<Block> {
    let eps = args.rms_norm_eps;
    let opts = DecoderOptions {
        qk_norm: false,
        layer_windows: Vec::new(),
    };
    let mut self_attn = Attention::load(w, &format!("{prefix}.self_attn"), args, &opts)?;
    if qk_norm {
        self_attn.q_norm = Some(gemma_norm(w, &format!("{prefix}.self_attn.q_norm"), eps)?);
        self_attn.k_norm = Some(gemma_norm(w, &format!("{prefix}.self_attn.k_norm"), eps)?);
    }
    let mut mlp = Mlp::load(w, &format!("{prefix}.mlp"))?;
    mlp.activation = Activation::GeluApprox;
    Ok(Block {
        self_attn,
        mlp: FeedForward::Dense(mlp),
        input_layernorm: gemma_norm(w, &format!("{prefix}.input_layernorm"), eps)?,
        post_attention_layernorm: gemma_norm(
            w,
            &format!("{prefix}.post_attention_layernorm"),
            eps,
        )?,
        residual: Residual::Sandwich(SandwichNorms {
            pre_feedforward_layernorm: gemma_norm(
                w,
                &format!("{prefix}.pre_feedforward_layernorm"),
                eps,
            )?,
            post_feedforward_layernorm: gemma_norm(
                w,
                &format!("{prefix}.post_feedforward_layernorm"),
                eps,
            )?,
        }),
        linear_attn: None,
        compiled: Default::default(),
    })
}

/// The embedding, final norm and (untied) head of a Gemma model.
pub(super) fn gemma_ends(
    w: &mut Weights,
    args: &ModelArgs,
) -> Result<(Embedding, RmsNorm, Option<Linear>)> {
    let embed = Embedding::load(w, "model.embed_tokens")?;
    let norm = gemma_norm(w, "model.norm", args.rms_norm_eps)?;
    let head = if w.contains("lm_head.weight") {
        Some(Linear::load(w, "lm_head")?)
    } else {
        None
    };
    Ok((embed, norm, head))
}

/// Loads a Gemma 2 decoder from the checkpoint's tensors `w`, the shared
/// config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Gemma2Args = family_args(raw)?;
    let attn_scale = (1.0 / (extra.query_pre_attn_scalar as f64).sqrt()) as f32;
    let layers = (0..args.num_hidden_layers)
        .map(|i| {
            let mut block = gemma_block(w, &format!("model.layers.{i}"), args, false)?;
            block.self_attn.scale = attn_scale;
            block.self_attn.logit_softcap = extra.attn_logit_softcapping;
            Ok(block)
        })
        .collect::<Result<Vec<_>>>()?;
    let (embed_tokens, norm, lm_head) = gemma_ends(w, args)?;
    Ok(Decoder {
        embed_tokens,
        layers,
        norm,
        lm_head,
        options: DecoderOptions::default(),
        embed_scale: Some((args.hidden_size as f64).sqrt() as f32),
        logits_map: match extra.final_logit_softcapping {
            Some(cap) => LogitsMap::SoftCap(cap),
            None => LogitsMap::Identity,
        },
        pipeline: None,
    })
}
