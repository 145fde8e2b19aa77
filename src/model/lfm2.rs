//! Liquid LFM2 (`lfm2`): a hybrid decoder whose layers mix tokens either with
//! full attention (per-head q/k RMS norms, RoPE over the whole head, head
//! size `hidden_size / num_attention_heads`, output `out_proj`) or with a
//! gated short causal convolution ([`ShortConv`]); `full_attn_idxs`, else
//! `layer_types`, names the attention layers. Every layer then runs a SwiGLU
//! feed-forward (`w2(silu(w1 x) * w3 x)`) whose width
//! `block_auto_adjust_ff_dim` derives from `block_ff_dim`. The norms are
//! `operator_norm` before the mixer, `ffn_norm` before the feed-forward and
//! `embedding_norm` last, all with `norm_eps`; the output head is always the
//! embedding.
//!
//! A convolution layer's cache ([`crate::cache::StateCache`], mlx-lm's
//! `ArraysCache`) keeps its last `conv_L_cache - 1` inputs. Hugging Face
//! checkpoints store the convolution as `[channels, 1, kernel]`; it is
//! turned to MLX's `[channels, kernel, 1]` as mlx-lm's `sanitize` does.

use anyhow::{anyhow, bail, Result};
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{
    Activation, Attention, Block, Decoder, DecoderOptions, FeedForward, LogitsMap, Mlp, Recurrent,
};
use super::gated_delta::causal_conv1d;
use super::layers::{Embedding, Linear, LinearWeight, RmsNorm, Rope};
use super::weights::Weights;
use crate::cache::KvCache;

fn default_rope_theta() -> f32 {
    1_000_000.0
}

/// The LFM2 fields of `config.json` (mlx-lm's `lfm2.ModelArgs`).
#[derive(Debug, Deserialize)]
struct Lfm2Args {
    norm_eps: f32,
    conv_bias: bool,
    #[serde(rename = "conv_L_cache")]
    conv_l_cache: i32,
    block_dim: i32,
    block_multiple_of: i32,
    #[serde(default)]
    block_ffn_dim_multiplier: Option<f64>,
    block_auto_adjust_ff_dim: bool,
    #[serde(default)]
    block_ff_dim: Option<i32>,
    #[serde(default)]
    intermediate_size: Option<i32>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    full_attn_idxs: Option<Vec<usize>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
}

impl Lfm2Args {
    /// The feed-forward width: `block_ff_dim` (else `intermediate_size`),
    /// with `block_auto_adjust_ff_dim` two thirds of it, times
    /// `block_ffn_dim_multiplier`, rounded up to a multiple of
    /// `block_multiple_of` (mlx-lm's integer truncations included).
    fn ff_dim(&self) -> Result<i32> {
        let Some(ff) = self.block_ff_dim.or(self.intermediate_size) else {
            bail!("config must specify either block_ff_dim or intermediate_size");
        };
        if !self.block_auto_adjust_ff_dim {
            return Ok(ff);
        }
        let mut ff = (2.0 * ff as f64 / 3.0) as i64;
        if let Some(m) = self.block_ffn_dim_multiplier {
            ff = (m * ff as f64) as i64;
        }
        let multiple = self.block_multiple_of as i64;
        if multiple < 1 {
            bail!("block_multiple_of must be at least 1, got {multiple}");
        }
        Ok((multiple * ((ff + multiple - 1) / multiple)) as i32)
    }

    /// `rope_parameters`' `rope_theta` over the top-level one.
    fn rope_base(&self) -> f32 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(serde_json::Value::as_f64)
            .map_or(self.rope_theta, |t| t as f32)
    }

    /// Per layer: whether it is a full-attention layer.
    fn attention_layers(&self, n: usize) -> Result<Vec<bool>> {
        if let Some(idxs) = &self.full_attn_idxs {
            if let Some(bad) = idxs.iter().find(|&&i| i >= n) {
                bail!("full_attn_idxs names layer {bad} of a {n}-layer model");
            }
            return Ok((0..n).map(|i| idxs.contains(&i)).collect());
        }
        let Some(types) = &self.layer_types else {
            bail!("config must specify full_attn_idxs or layer_types");
        };
        if types.len() != n {
            bail!(
                "layer_types has {} entries but num_hidden_layers is {n}",
                types.len()
            );
        }
        Ok(types.iter().map(|t| t == "full_attention").collect())
    }
}

/// The fields of an LFM2 `config.json` that the shared config reads under
/// other names: `rms_norm_eps` from `norm_eps`, `intermediate_size` from
/// `block_ff_dim`, each only where the config leaves it out.
pub(crate) fn shared_config(raw: serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(mut top) = raw else {
        return raw;
    };
    for (shared, own) in [
        ("rms_norm_eps", "norm_eps"),
        ("intermediate_size", "block_ff_dim"),
    ] {
        if let Some(v) = top.get(own).filter(|v| !v.is_null()).cloned() {
            top.entry(shared).or_insert(v);
        }
    }
    serde_json::Value::Object(top)
}

/// LFM2's token mixer outside the attention layers: `in_proj` yields
/// `b`, `c`, `x`; the depthwise causal convolution runs over `b * x`
/// and its output is gated by `c` before `out_proj`.
#[derive(Clone)]
pub struct ShortConv {
    /// Projects the hidden states to `b`, `c` and `x`, `3 × hidden` wide.
    pub in_proj: Linear,
    /// Depthwise convolution weights `[hidden, kernel, 1]`.
    pub conv: Array,
    /// The convolution's bias `[hidden]` (`conv_bias`), if the config has one.
    pub conv_bias: Option<Array>,
    /// Projects the gated convolution output back to the hidden size.
    pub out_proj: Linear,
}

impl ShortConv {
    fn load(w: &mut Weights, prefix: &str, hidden: i32, kernel: i32, bias: bool) -> Result<Self> {
        // mlx-lm's `nn.Conv1d` draws its initial weight (its bias is zeros).
        w.count_init_draws(1);
        let name = format!("{prefix}.conv.weight");
        let mut conv = w.take(&name)?;
        if conv.ndim() != 3 {
            bail!(
                "tensor {name:?} has shape {:?}, expected [hidden_size, conv_L_cache, 1]",
                conv.shape()
            );
        }
        conv = short_conv_for_mlx(conv)?;
        let want = [hidden, kernel, 1];
        if conv.shape() != want {
            bail!(
                "tensor {name:?} has shape {:?}, expected {want:?} (hidden_size, conv_L_cache, 1)",
                conv.shape()
            );
        }
        let conv_bias = match bias {
            true => Some(w.take(&format!("{prefix}.conv.bias"))?),
            false => None,
        };
        let lin = |w: &mut Weights, name: &str| -> Result<Linear> {
            let full = format!("{prefix}.{name}");
            if bias != w.contains(&format!("{full}.bias")) {
                bail!("{full}: conv_bias is {bias} but the weights say otherwise");
            }
            Linear::load(w, &full)
        };
        Ok(Self {
            in_proj: lin(w, "in_proj")?,
            conv,
            conv_bias,
            out_proj: lin(w, "out_proj")?,
        })
    }

    /// The mixer's output `[B, L, hidden]` for `x` `[B, L, hidden]`, keeping the
    /// last convolution inputs in `cache` (a state cache).
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let kind = cache.kind();
        let state = cache.as_state_mut().ok_or_else(|| {
            anyhow!("a short convolution layer keeps its last inputs, not a {kind} cache")
        })?;
        let bcx = self.in_proj.forward(x)?;
        let d = bcx.shape()[bcx.ndim() - 1] / 3;
        let b = bcx.index((Ellipsis, ..d));
        let c = bcx.index((Ellipsis, d..2 * d));
        let v = bcx.index((Ellipsis, 2 * d..));
        let (conv, kept) = causal_conv1d(state.conv(), &(&b * &v), &self.conv)?;
        state.advance_conv(kept, x.shape()[1] as usize);
        let conv = match &self.conv_bias {
            Some(bias) => &conv + bias,
            None => conv,
        };
        self.out_proj.forward(&(&c * &conv))
    }
}

/// The attention of layer `prefix` (`...layers.{i}.self_attn`).
fn attention(
    w: &mut Weights,
    prefix: &str,
    args: &ModelArgs,
    extra: &Lfm2Args,
) -> Result<Attention> {
    let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{prefix}.{name}"));
    let norm =
        |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{prefix}.{name}"), extra.norm_eps);
    let heads = args.num_attention_heads;
    let head_dim = args.hidden_size / heads;
    let mut attn = Attention::absent(w.compute_dtype())?;
    attn.q_proj = lin(w, "q_proj")?;
    attn.k_proj = lin(w, "k_proj")?;
    attn.v_proj = lin(w, "v_proj")?;
    attn.o_proj = lin(w, "out_proj")?;
    attn.q_norm = Some(norm(w, "q_layernorm")?);
    attn.k_norm = Some(norm(w, "k_layernorm")?);
    attn.n_heads = heads;
    attn.n_kv_heads = args.kv_heads();
    attn.head_dim = head_dim;
    attn.scale = (head_dim as f32).powf(-0.5);
    attn.rope = Some(Rope::new(head_dim, false, extra.rope_base(), None)?);
    Ok(attn)
}

/// The SwiGLU feed-forward of layer `prefix`, checked against `ff_dim`.
fn feed_forward(w: &mut Weights, prefix: &str, ff_dim: i32) -> Result<Mlp> {
    let p = format!("{prefix}.feed_forward");
    let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{p}.{name}"));
    let mlp = Mlp {
        gate_proj: lin(w, "w1")?,
        up_proj: lin(w, "w3")?,
        down_proj: lin(w, "w2")?,
        activation: Activation::Silu,
    };
    let rows = match &mlp.gate_proj.weight {
        LinearWeight::Dense(t) | LinearWeight::Quantized { weight: t, .. } => t.shape()[0],
    };
    if rows != ff_dim {
        bail!(
            "tensor \"{p}.w1.weight\" has {rows} rows, but the config's feed-forward width is \
             {ff_dim} (block_ff_dim, adjusted when block_auto_adjust_ff_dim)"
        );
    }
    Ok(mlp)
}

/// Loads an LFM2 decoder (attention layers among short-convolution layers)
/// from the checkpoint's tensors `w`, the shared config `args` and the raw
/// `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Lfm2Args = family_args(raw)?;
    let n = args.num_hidden_layers as usize;
    let attention_layers = extra.attention_layers(n)?;
    if args.hidden_size % args.num_attention_heads != 0 {
        bail!(
            "hidden_size ({}) must be a multiple of num_attention_heads ({})",
            args.hidden_size,
            args.num_attention_heads
        );
    }
    if extra.conv_l_cache < 1 {
        bail!(
            "conv_L_cache must be at least 1, got {}",
            extra.conv_l_cache
        );
    }
    if extra.block_dim != args.hidden_size {
        bail!(
            "block_dim ({}) must equal hidden_size ({})",
            extra.block_dim,
            args.hidden_size
        );
    }
    let ff_dim = extra.ff_dim()?;
    let eps = extra.norm_eps;
    let layers = attention_layers
        .iter()
        .enumerate()
        .map(|(i, &is_attention)| {
            let p = format!("model.layers.{i}");
            let (self_attn, mixer) = if is_attention {
                let attn = attention(w, &format!("{p}.self_attn"), args, &extra)?;
                (attn, None)
            } else {
                let conv = ShortConv::load(
                    w,
                    &format!("{p}.conv"),
                    args.hidden_size,
                    extra.conv_l_cache,
                    extra.conv_bias,
                )?;
                let absent = Attention::absent(w.compute_dtype())?;
                (absent, Some(Box::new(Recurrent::ShortConv(conv))))
            };
            let mlp = feed_forward(w, &p, ff_dim)?;
            let mut block = Block::pre_norm_with(
                RmsNorm::load(w, &format!("{p}.operator_norm"), eps)?,
                RmsNorm::load(w, &format!("{p}.ffn_norm"), eps)?,
                self_attn,
                FeedForward::Dense(mlp),
            );
            block.linear_attn = mixer;
            Ok(block)
        })
        .collect::<Result<Vec<_>>>()?;
    // The output head is the embedding, whatever the config says.
    for part in ["weight", "scales", "biases"] {
        w.take_opt(&format!("lm_head.{part}"))?;
    }
    Ok(Decoder {
        embed_tokens: Embedding::load(w, "model.embed_tokens")?,
        layers,
        norm: RmsNorm::load(w, "model.embedding_norm", eps)?,
        lm_head: None,
        options: DecoderOptions::default(),
        embed_scale: None,
        logits_map: LogitsMap::Identity,
        pipeline: None,
    })
}

/// A short convolution's weight in MLX's `[channels, kernel, 1]`: Hugging
/// Face's `[channels, 1, kernel]` turned as mlx-lm's `sanitize` does
/// (whenever the last axis is the longer).
pub(crate) fn short_conv_for_mlx(conv: Array) -> Result<Array> {
    if conv.ndim() == 3 && conv.shape()[2] > conv.shape()[1] {
        return Ok(conv.swap_axes(1, 2)?);
    }
    Ok(conv)
}
