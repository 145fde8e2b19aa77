//! Qwen3-MoE: Qwen3's attention (RMS norm on queries and keys) with a sparse
//! Mixture-of-Experts feed-forward in every `decoder_sparse_step`-th layer
//! not listed in `mlp_only_layers` (the others keep a dense MLP). The router
//! softmaxes over all experts, keeps the top `num_experts_per_tok` and, with
//! `norm_topk_prob`, renormalizes them.

use anyhow::Result;
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp};
use super::moe::{ExpertActivation, MoeLayout, Routing, SparseMoe};
use super::weights::Weights;

/// The Qwen3-MoE fields of `config.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct Qwen3MoeArgs {
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    #[serde(default)]
    pub norm_topk_prob: bool,
}

fn one() -> usize {
    1
}

impl Qwen3MoeArgs {
    pub(crate) fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }
}

/// Qwen3-MoE's experts: `mlp.experts.{e}.{gate,up,down}_proj` in Hugging
/// Face checkpoints, stacked into `mlp.switch_mlp`.
pub(crate) const MOE_LAYOUT: MoeLayout = MoeLayout {
    router: "gate",
    experts: "switch_mlp",
    hf_names: ["gate_proj", "up_proj", "down_proj"],
    router_key: "mlp.gate",
    activation: ExpertActivation::SwiGlu,
};

/// Loads a Qwen3-MoE decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Qwen3MoeArgs = family_args(raw)?;
    let options = DecoderOptions {
        qk_norm: true,
        layer_windows: Vec::new(),
    };
    let layers = (0..args.num_hidden_layers as usize)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let self_attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            let mlp = if extra.is_sparse(i) {
                FeedForward::Sparse(SparseMoe::load(
                    w,
                    &format!("{p}.mlp"),
                    extra.num_experts,
                    extra.num_experts_per_tok,
                    Routing::SoftmaxTopK {
                        normalize: extra.norm_topk_prob,
                    },
                    MOE_LAYOUT,
                )?)
            } else {
                FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?)
            };
            Block::pre_norm(w, &p, args.rms_norm_eps, self_attn, mlp)
        })
        .collect::<Result<Vec<_>>>()?;
    Decoder::assemble(w, args, layers, options)
}
