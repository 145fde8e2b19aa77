//! IBM Granite 4 (`granitemoehybrid`): a pre-norm stack whose layers are
//! Mamba-2 mixers or attention, one per entry of `layer_types` (`mamba`,
//! `attention`), each followed by a feed-forward: a mixture of experts
//! (`block_sparse_moe`: the router `router.layer` keeps the top
//! `num_experts_per_tok` logits and softmaxes them; experts of width
//! `intermediate_size`) beside a shared SwiGLU MLP (`shared_mlp`, its gate
//! and up fused in `input_linear`, width `shared_intermediate_size`) when
//! `num_local_experts` is set, else one dense MLP (`mlp`).
//!
//! Granite's multipliers apply as in Granite 3: embeddings times
//! `embedding_multiplier`, attention scores scaled by `attention_multiplier`,
//! both residual branches times `residual_multiplier`, logits divided by
//! `logits_scaling`. Attention has head size `hidden_size / heads` and RoPE
//! unless `position_embedding_type` is `nope`. The Mamba-2 mixer is
//! Nemotron-H's ([`Mamba2`]) with the gated norm over all its channels at
//! once, and step sizes clipped to `time_step_limit` (default [0.001, 100]).
//! Every layer keeps a cache (mlx-lm's `ArraysCache` of size 2 for Mamba-2, a
//! `KVCache` for attention), so each is one block.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{
    Activation, Attention, Block, Decoder, DecoderOptions, FeedForward, LogitsMap, Mlp, Recurrent,
    Residual,
};
use super::layers::{Embedding, Linear, RmsNorm, Rope};
use super::mamba2::{Mamba2, Mamba2Dims, StepLimit};
use super::moe::{ExpertActivation, MoeLayout, Routing, SharedExperts, SparseMoe};
use super::weights::Weights;

/// The Granite 4 fields of `config.json` (mlx-lm's `granitemoehybrid.ModelArgs`).
#[derive(Debug, Deserialize)]
struct GraniteHybridArgs {
    embedding_multiplier: f32,
    attention_multiplier: f32,
    residual_multiplier: f32,
    logits_scaling: f32,
    layer_types: Vec<String>,
    #[serde(default)]
    num_local_experts: Option<i32>,
    #[serde(default)]
    num_experts_per_tok: Option<i32>,
    #[serde(default)]
    shared_intermediate_size: Option<i32>,
    #[serde(default)]
    mamba_n_heads: Option<i32>,
    #[serde(default)]
    mamba_d_head: Option<i32>,
    #[serde(default)]
    mamba_d_state: Option<i32>,
    #[serde(default)]
    mamba_d_conv: Option<i32>,
    #[serde(default)]
    mamba_n_groups: Option<i32>,
    #[serde(default = "rope")]
    position_embedding_type: String,
    #[serde(default)]
    time_step_limit: Option<Vec<serde_json::Value>>,
}

fn rope() -> String {
    "rope".into()
}

impl GraniteHybridArgs {
    /// Experts when `num_local_experts` is set and non-zero (mlx-lm's `use_moe`).
    fn experts(&self) -> Option<i32> {
        self.num_local_experts.filter(|&n| n != 0)
    }

    fn dims(&self) -> Result<Mamba2Dims> {
        let need = |v: Option<i32>, name: &str| {
            v.with_context(|| format!("a Granite 4 config with mamba layers needs {name}"))
        };
        let dims = Mamba2Dims {
            heads: need(self.mamba_n_heads, "mamba_n_heads")?,
            head_dim: need(self.mamba_d_head, "mamba_d_head")?,
            groups: need(self.mamba_n_groups, "mamba_n_groups")?,
            state_size: need(self.mamba_d_state, "mamba_d_state")?,
            conv_kernel: need(self.mamba_d_conv, "mamba_d_conv")?,
        };
        dims.check()?;
        Ok(dims)
    }

    fn limit(&self) -> Result<StepLimit> {
        let Some(bounds) = &self.time_step_limit else {
            return Ok(StepLimit {
                min: 0.001,
                max: 100.0,
            });
        };
        let number = |v: &serde_json::Value| -> Result<f32> {
            if let Some(x) = v.as_f64() {
                return Ok(x as f32);
            }
            match v.as_str().map(str::to_ascii_lowercase).as_deref() {
                Some("infinity" | "inf") => Ok(f32::INFINITY),
                Some("-infinity" | "-inf") => Ok(f32::NEG_INFINITY),
                _ => bail!("time_step_limit holds {v}, not a number"),
            }
        };
        let [lo, hi] = bounds.as_slice() else {
            bail!("time_step_limit must hold two numbers, got {bounds:?}");
        };
        let (min, max) = (number(lo)?, number(hi)?);
        if min.is_nan() || max.is_nan() || min > max {
            bail!("time_step_limit must be ordered numbers, got [{min}, {max}]");
        }
        Ok(StepLimit { min, max })
    }
}

/// The attention of layer `prefix`: Granite's scale, RoPE unless `nope`.
fn attention(
    w: &mut Weights,
    prefix: &str,
    args: &ModelArgs,
    extra: &GraniteHybridArgs,
) -> Result<Attention> {
    let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{prefix}.self_attn.{name}"));
    // mlx-lm ignores `head_dim` here.
    let head_dim = args.hidden_size / args.num_attention_heads;
    let mut attn = Attention::absent(w.compute_dtype())?;
    attn.q_proj = lin(w, "q_proj")?;
    attn.k_proj = lin(w, "k_proj")?;
    attn.v_proj = lin(w, "v_proj")?;
    attn.o_proj = lin(w, "o_proj")?;
    for (proj, heads, name) in [
        (&attn.q_proj, args.num_attention_heads, "q_proj"),
        (&attn.k_proj, args.kv_heads(), "k_proj"),
        (&attn.v_proj, args.kv_heads(), "v_proj"),
    ] {
        let rows = proj.shape().0;
        if rows != heads * head_dim {
            bail!(
                "tensor \"{prefix}.self_attn.{name}.weight\" has {rows} rows, expected {heads} \
                 heads × {head_dim} (hidden_size / num_attention_heads)"
            );
        }
    }
    attn.n_heads = args.num_attention_heads;
    attn.n_kv_heads = args.kv_heads();
    attn.head_dim = head_dim;
    attn.scale = extra.attention_multiplier;
    attn.rope = match extra.position_embedding_type.as_str() {
        "nope" => None,
        _ => Some(Rope::new(head_dim, false, args.rope_base(), None)?),
    };
    Ok(attn)
}

/// The shared MLP's `input_linear`, which the loader splits into the
/// gate and up projections: one LoRA site over both, as mlx-lm adapts it.
pub(crate) const FUSED_LINEARS: [(&str, &[&str]); 1] = [(
    "shared_mlp.input_linear",
    &["shared_mlp.gate_proj", "shared_mlp.up_proj"],
)];

/// `shared_mlp`: `output_linear(silu(gate) · up)` with gate and up the two
/// halves of `input_linear`, as a gated MLP.
fn shared_mlp(w: &mut Weights, prefix: &str) -> Result<Mlp> {
    let input = Linear::load(w, &format!("{prefix}.input_linear"))?;
    let rows = input.shape().0;
    if rows % 2 != 0 {
        bail!("tensor \"{prefix}.input_linear.weight\" has {rows} rows, not gate and up halves");
    }
    let mut halves = input.split_rows(&[rows / 2, rows / 2])?.into_iter();
    let (gate_proj, up_proj) = (halves.next().unwrap(), halves.next().unwrap());
    Ok(Mlp {
        gate_proj,
        up_proj,
        down_proj: Linear::load(w, &format!("{prefix}.output_linear"))?,
        activation: Activation::Silu,
    })
}

/// The feed-forward of layer `prefix`: experts beside the shared MLP, or
/// the dense MLP (stored as `mlp.*`, or as Hugging Face's `shared_mlp.*`).
fn feed_forward(w: &mut Weights, prefix: &str, extra: &GraniteHybridArgs) -> Result<FeedForward> {
    let Some(experts) = extra.experts() else {
        if w.contains(&format!("{prefix}.mlp.gate_proj.weight")) {
            return Ok(FeedForward::Dense(Mlp {
                gate_proj: Linear::load(w, &format!("{prefix}.mlp.gate_proj"))?,
                up_proj: Linear::load(w, &format!("{prefix}.mlp.up_proj"))?,
                down_proj: Linear::load(w, &format!("{prefix}.mlp.down_proj"))?,
                activation: Activation::Silu,
            }));
        }
        let mlp = shared_mlp(w, &format!("{prefix}.shared_mlp"))?;
        // mlx-lm builds gate_proj and up_proj apart: one draw more.
        w.count_init_draws(1);
        return Ok(FeedForward::Dense(mlp));
    };
    let moe = format!("{prefix}.block_sparse_moe");
    if w.contains(&format!("{moe}.input_linear.weight")) {
        bail!(
            "\"{moe}.input_linear\" holds the experts in the Hugging Face layout; convert the \
             checkpoint with mlx-lm (mlx_lm.convert) first"
        );
    }
    let top_k = extra
        .num_experts_per_tok
        .context("a Granite 4 config with experts needs num_experts_per_tok")?;
    let layout = MoeLayout {
        router: "router.layer",
        experts: "switch_mlp",
        hf_names: ["gate_proj", "up_proj", "down_proj"],
        router_key: "block_sparse_moe.router.layer",
        activation: ExpertActivation::SwiGlu,
    };
    let mut sparse = SparseMoe::load(w, &moe, experts, top_k, Routing::TopKLastSoftmax, layout)?;
    let shared = shared_mlp(w, &format!("{prefix}.shared_mlp"))?;
    if let Some(width) = extra.shared_intermediate_size {
        let rows = shared.gate_proj.shape().0;
        if rows != width {
            bail!(
                "tensor \"{prefix}.shared_mlp.input_linear.weight\" has {} rows, expected 2 × \
                 shared_intermediate_size ({width})",
                2 * rows
            );
        }
    }
    // mlx-lm's paths of the experts and the shared MLP (their LoRA keys).
    sparse.experts_key = "block_sparse_moe.switch_mlp".into();
    sparse.shared = Some(Box::new(SharedExperts::new(shared, "shared_mlp")));
    Ok(FeedForward::Sparse(sparse))
}

/// Loads a Granite 4 (`granitemoehybrid`) decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: GraniteHybridArgs = family_args(raw)?;
    if !(extra.logits_scaling.is_finite() && extra.logits_scaling != 0.0) {
        bail!(
            "logits_scaling must be a non-zero number, got {}",
            extra.logits_scaling
        );
    }
    if extra.layer_types.len() != args.num_hidden_layers as usize {
        bail!(
            "layer_types names {} layers, num_hidden_layers is {}",
            extra.layer_types.len(),
            args.num_hidden_layers
        );
    }
    let eps = args.rms_norm_eps;
    let dtype = w.compute_dtype();
    let mut layers = Vec::with_capacity(extra.layer_types.len());
    for (i, kind) in extra.layer_types.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let input_layernorm = RmsNorm::load(w, &format!("{p}.input_layernorm"), eps)?;
        let (self_attn, linear_attn) = match kind.as_str() {
            "mamba" => {
                let mut mamba =
                    Mamba2::load(w, &format!("{p}.mamba"), extra.dims()?, eps, extra.limit()?)
                        .with_context(|| format!("layer {i} (Mamba-2)"))?;
                // One RMS norm over all the mixer's channels.
                mamba.norm_groups = 1;
                (
                    Attention::absent(dtype)?,
                    Some(Box::new(Recurrent::Mamba2(mamba))),
                )
            }
            "attention" => (attention(w, &p, args, &extra)?, None),
            other => bail!("unknown layer type {other:?} in layer_types (mamba or attention)"),
        };
        let mlp = feed_forward(w, &p, &extra)?;
        layers.push(Block {
            self_attn,
            linear_attn,
            compiled: Default::default(),
            mlp,
            input_layernorm,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                eps,
            )?,
            residual: Residual::Scaled(extra.residual_multiplier),
        });
    }
    let lm_head = if args.tie_word_embeddings {
        // Some checkpoints ship a redundant head mlx-lm drops.
        w.take_opt("lm_head.weight")?;
        None
    } else {
        Some(Linear::load(w, "lm_head")?)
    };
    Ok(Decoder {
        embed_tokens: Embedding::load(w, "model.embed_tokens")?,
        layers,
        norm: RmsNorm::load(w, "model.norm", eps)?,
        lm_head,
        options: DecoderOptions::default(),
        embed_scale: Some(extra.embedding_multiplier),
        logits_map: LogitsMap::Divide(extra.logits_scaling),
        pipeline: None,
    })
}
