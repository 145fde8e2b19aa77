//! Qwen3-Next (`qwen3_next`) and the hybrid decoder it shares with Qwen3.5:
//! three of every `full_attention_interval` layers mix tokens with a gated
//! DeltaNet (`linear_attn`, see `gated_delta.rs`, cached as a recurrent
//! state), the others with full attention whose `q_proj` also yields a
//! sigmoid gate on the output, per-head q/k RMS norms and RoPE on the
//! `partial_rotary_factor` of each head. Feed-forward: a sparse MoE (softmax
//! top-k, renormalized when `norm_topk_prob`) plus a shared expert scaled by
//! `sigmoid(shared_expert_gate(x))`, on every `decoder_sparse_step`-th layer
//! outside `mlp_only_layers`; a dense MLP elsewhere.
//!
//! Checkpoints as mlx-lm writes them; Hugging Face ones (experts stored one
//! by one, convolution weights `[channels, 1, kernel]`) are converted as
//! mlx-lm's `sanitize` does, norms included (`1 + w`). The
//! multi-token-prediction weights (`mtp.*`) are dropped.

use anyhow::{bail, Result};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::{family_args, ModelArgs, RopeScaling};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp, Recurrent};
use super::gated_delta::{DeltaDims, GatedDeltaNet};
use super::layers::{Linear, RmsNorm, Rope};
use super::moe::{ExpertActivation, MoeLayout, Routing, SharedExperts, SparseMoe};
use super::weights::Weights;

fn one() -> usize {
    1
}

fn four() -> usize {
    4
}

/// The hybrid fields of `config.json` (Qwen3.5 nests them in `text_config`).
#[derive(Debug, Deserialize)]
pub(crate) struct HybridArgs {
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    #[serde(default = "four")]
    pub full_attention_interval: usize,
    #[serde(default)]
    pub num_experts: i32,
    #[serde(default)]
    pub num_experts_per_tok: i32,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Untied unless the config says so (mlx-lm's default here).
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

/// What differs between the hybrid families.
pub(crate) struct Hybrid {
    /// Where the decoder's tensors sit (`""`, `"language_model."`).
    pub root: &'static str,
    /// Qwen3-Next's fused, per-key-head grouped DeltaNet projections.
    pub grouped_in_proj: bool,
    /// The MoE layers: every layer with experts (Qwen3.5), or only the
    /// `decoder_sparse_step`-th ones outside `mlp_only_layers` (Qwen3-Next).
    pub every_layer_sparse: bool,
    /// `norm_topk_prob` when the config leaves it out.
    pub norm_topk_default: bool,
    /// RoPE from `rope_parameters` alone (Qwen3.5: `rope_theta` 100000 and
    /// `partial_rotary_factor` 0.25 unless it gives them), else from the
    /// top-level `rope_theta`, `partial_rotary_factor` and `rope_scaling`.
    pub rope_from_parameters: bool,
}

pub(crate) const LAYOUT: MoeLayout = MoeLayout {
    router: "gate",
    experts: "switch_mlp",
    hf_names: ["gate_proj", "up_proj", "down_proj"],
    router_key: "mlp.gate",
    activation: ExpertActivation::SwiGlu,
};

impl HybridArgs {
    fn dims(&self) -> DeltaDims {
        DeltaDims {
            num_k_heads: self.linear_num_key_heads,
            num_v_heads: self.linear_num_value_heads,
            head_k_dim: self.linear_key_head_dim,
            head_v_dim: self.linear_value_head_dim,
            conv_kernel: self.linear_conv_kernel_dim,
        }
    }

    /// Per layer: whether it is a gated DeltaNet (linear) layer.
    fn linear_layers(&self, args: &ModelArgs) -> Result<Vec<bool>> {
        let n = args.num_hidden_layers as usize;
        if self.full_attention_interval < 1 {
            bail!("full_attention_interval must be at least 1");
        }
        let Some(types) = &args.layer_types else {
            return Ok((0..n)
                .map(|i| (i + 1) % self.full_attention_interval != 0)
                .collect());
        };
        types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => bail!(
                    "layer_types: unknown layer type {other:?} (linear_attention, full_attention)"
                ),
            })
            .collect()
    }

    fn sparse(&self, i: usize, family: &Hybrid) -> bool {
        if self.num_experts <= 0 {
            return false;
        }
        family.every_layer_sparse
            || (!self.mlp_only_layers.contains(&i)
                && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1)))
    }
}

/// A norm weight Hugging Face stores as an offset from 1, as MLX's norm
/// takes it (`1 + w`, in `w`'s dtype).
pub(crate) fn norm_from_offset(weight: &Array) -> Result<Array> {
    Ok(weight + &Array::from_f32(1.0).as_dtype(weight.dtype())?)
}

fn norm(w: &mut Weights, name: &str, eps: f32, shifted: bool) -> Result<RmsNorm> {
    let mut norm = RmsNorm::load(w, name, eps)?;
    if shifted {
        norm.weight = norm_from_offset(&norm.weight)?;
    }
    Ok(norm)
}

fn sparse_layer(
    w: &mut Weights,
    prefix: &str,
    extra: &HybridArgs,
    family: &Hybrid,
) -> Result<SparseMoe> {
    let routing = Routing::SoftmaxTopK {
        normalize: extra.norm_topk_prob.unwrap_or(family.norm_topk_default),
    };
    let mut moe = SparseMoe::load(
        w,
        prefix,
        extra.num_experts,
        extra.num_experts_per_tok,
        routing,
        LAYOUT,
    )?;
    moe.shared = Some(Box::new(SharedExperts {
        mlp: Mlp::load(w, &format!("{prefix}.shared_expert"))?,
        gate: Some(Linear::load(w, &format!("{prefix}.shared_expert_gate"))?),
        key: "mlp.shared_expert",
    }));
    Ok(moe)
}

/// The attention layers' RoPE (see `Hybrid::rope_from_parameters`).
fn rope(args: &ModelArgs, extra: &HybridArgs, family: &Hybrid) -> Result<Rope> {
    let (factor, base, scaling) = if family.rope_from_parameters {
        let params = args.rope_parameters.clone().unwrap_or_default();
        let num = |key: &str| params.get(key).and_then(serde_json::Value::as_f64);
        let scaling = match params.is_null() {
            true => None,
            false => RopeScaling::parse(&params)?,
        };
        let base = num("rope_theta").unwrap_or(100000.0) as f32;
        (num("partial_rotary_factor").unwrap_or(0.25), base, scaling)
    } else {
        let Some(factor) = extra.partial_rotary_factor else {
            bail!("missing field `partial_rotary_factor`");
        };
        (factor, args.rope_base(), args.rope_scaling()?)
    };
    if !(factor > 0.0 && factor <= 1.0) {
        bail!("partial_rotary_factor must be in (0, 1], got {factor}");
    }
    let dims = (args.head_dim() as f64 * factor) as i32;
    Rope::new(dims, false, base, scaling.as_ref())
}

/// The hybrid decoder of `args` and its family fields `raw`.
pub(crate) fn load_hybrid(
    w: &mut Weights,
    args: &ModelArgs,
    raw: &serde_json::Value,
    family: &Hybrid,
) -> Result<Decoder> {
    let extra: HybridArgs = family_args(raw)?;
    let dims = extra.dims();
    dims.check()?;
    let linear = extra.linear_layers(args)?;
    let root = family.root;
    for name in w.remaining() {
        let inner = name.strip_prefix(root).unwrap_or(&name);
        if inner.starts_with("mtp.")
            || name.starts_with("vision_tower")
            || name.starts_with("model.visual")
        {
            w.take(&name)?;
        }
    }
    let eps = args.rms_norm_eps;
    let rope = rope(args, &extra, family)?;
    let options = DecoderOptions {
        qk_norm: false,
        layer_windows: Vec::new(),
    };
    let layer = |i: usize| format!("{root}model.layers.{i}");
    // The token mixers first: a Hugging Face checkpoint (not sanitized by
    // mlx-lm) shows itself by its convolution layout, and then stores every
    // norm as an offset from 1.
    let mut shifted = false;
    let mut mixers = Vec::with_capacity(linear.len());
    for (i, &is_linear) in linear.iter().enumerate() {
        let p = layer(i);
        mixers.push(if is_linear {
            let prefix = format!("{p}.linear_attn");
            let (delta, hf) = GatedDeltaNet::load(w, &prefix, dims, eps, family.grouped_in_proj)?;
            shifted |= hf;
            let mixer = Recurrent::GatedDelta(delta);
            (Attention::absent(w.compute_dtype())?, Some(Box::new(mixer)))
        } else {
            let mut attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            attn.rope = Some(rope.clone());
            attn.output_gate = true;
            (attn, None)
        });
    }
    let layers = mixers
        .into_iter()
        .enumerate()
        .map(|(i, (mut self_attn, linear_attn))| {
            let p = layer(i);
            if linear_attn.is_none() {
                let a = format!("{p}.self_attn");
                self_attn.q_norm = Some(norm(w, &format!("{a}.q_norm"), eps, shifted)?);
                self_attn.k_norm = Some(norm(w, &format!("{a}.k_norm"), eps, shifted)?);
            }
            let mlp = if extra.sparse(i, family) {
                FeedForward::Sparse(sparse_layer(w, &format!("{p}.mlp"), &extra, family)?)
            } else {
                FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?)
            };
            let mut block = Block::pre_norm_with(
                norm(w, &format!("{p}.input_layernorm"), eps, shifted)?,
                norm(w, &format!("{p}.post_attention_layernorm"), eps, shifted)?,
                self_attn,
                mlp,
            );
            block.linear_attn = linear_attn;
            Ok(block)
        })
        .collect::<Result<Vec<_>>>()?;
    let head = format!("{root}lm_head");
    if extra.tie_word_embeddings {
        for part in ["weight", "scales", "biases"] {
            w.take_opt(&format!("{head}.{part}"))?;
        }
    } else if !w.contains(&format!("{head}.weight")) {
        bail!("missing tensor \"{head}.weight\": tie_word_embeddings is false");
    }
    let mut decoder = Decoder::assemble_at(w, args, root, layers, options)?;
    if shifted {
        decoder.norm.weight = norm_from_offset(&decoder.norm.weight)?;
    }
    Ok(decoder)
}

/// Loads a Qwen3-Next decoder (gated DeltaNet and gated attention layers,
/// sparse MoE feed-forwards) from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let family = Hybrid {
        root: "",
        grouped_in_proj: true,
        every_layer_sparse: false,
        norm_topk_default: false,
        rope_from_parameters: false,
    };
    load_hybrid(w, args, raw, &family)
}
