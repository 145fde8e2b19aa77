//! GPT-OSS: attention with biases and per-head sinks, sliding-window layers
//! alternating with global ones (`layer_types`, by default sliding first),
//! and a sparse Mixture-of-Experts in every layer: a biased router keeps the
//! top `num_experts_per_tok` logits and softmaxes over them; the experts
//! carry biases and use the clipped "SwiGLU-OAI" activation. Checkpoints in
//! mlx-lm's layout (experts stacked as `mlp.experts.{gate,up,down}_proj`).
//! The windowed layers keep rotating caches.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward};
use super::moe::{ExpertActivation, MoeLayout, Routing, SparseMoe};
use super::weights::Weights;

/// The GPT-OSS fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct GptOssArgs {
    #[serde(default = "default_experts")]
    pub num_local_experts: i32,
    #[serde(default = "default_top_k")]
    pub num_experts_per_tok: i32,
    #[serde(default = "default_window")]
    pub sliding_window: usize,
}

fn default_experts() -> i32 {
    128
}

fn default_top_k() -> i32 {
    4
}

fn default_window() -> usize {
    128
}

const LAYOUT: MoeLayout = MoeLayout {
    router: "router",
    experts: "experts",
    hf_names: ["gate_proj", "up_proj", "down_proj"],
    router_key: "mlp.router",
    activation: ExpertActivation::SwiGluOai,
};

/// Loads a GPT-OSS decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: GptOssArgs = family_args(raw)?;
    if w.contains("model.layers.0.mlp.experts.gate_up_proj_blocks") {
        bail!(
            "this is an original GPT-OSS checkpoint (MXFP4 blocks); convert it with mlx-lm first"
        );
    }
    let n = args.num_hidden_layers as usize;
    let sliding: Vec<bool> = match &args.layer_types {
        Some(types) => types.iter().map(|t| t == "sliding_attention").collect(),
        None => (0..n).map(|i| i % 2 == 0).collect(),
    };
    let mut args = args.clone();
    if args.rope_theta.is_none() {
        args.rope_theta = Some(150_000.0);
    }
    let options = DecoderOptions {
        qk_norm: false,
        layer_windows: sliding
            .iter()
            .map(|&s| s.then_some(extra.sliding_window))
            .collect(),
    };
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut self_attn = Attention::load(w, &format!("{p}.self_attn"), &args, &options)?;
            self_attn.sinks = Some(w.take(&format!("{p}.self_attn.sinks"))?);
            let moe = SparseMoe::load(
                w,
                &format!("{p}.mlp"),
                extra.num_local_experts,
                extra.num_experts_per_tok,
                Routing::TopKLastSoftmax,
                LAYOUT,
            )?;
            Block::pre_norm(
                w,
                &p,
                args.rms_norm_eps,
                self_attn,
                FeedForward::Sparse(moe),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Decoder::assemble(w, &args, layers, options)
}
