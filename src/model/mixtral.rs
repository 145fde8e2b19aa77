//! Mixtral: LLaMA attention with a sparse Mixture-of-Experts feed-forward
//! (`block_sparse_moe`) in every layer. The router keeps the top
//! `num_experts_per_tok` logits and softmaxes over them. As mlx-lm, the
//! checkpoint's `sliding_window` is not applied and `rope_theta` defaults to
//! 1e6.

use anyhow::Result;
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward};
use super::moe::{ExpertActivation, MoeLayout, Routing, SparseMoe};
use super::weights::Weights;

/// The Mixtral fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct MixtralArgs {
    #[serde(default = "default_experts")]
    pub num_local_experts: i32,
    #[serde(default = "default_top_k")]
    pub num_experts_per_tok: i32,
}

fn default_experts() -> i32 {
    8
}

fn default_top_k() -> i32 {
    2
}

/// Mixtral's experts: Hugging Face's `w1`, `w3`, `w2` per expert under
/// `block_sparse_moe.experts`, stacked into `block_sparse_moe.switch_mlp`.
pub(crate) const MOE_LAYOUT: MoeLayout = MoeLayout {
    router: "gate",
    experts: "switch_mlp",
    hf_names: ["w1", "w3", "w2"],
    router_key: "block_sparse_moe.gate",
    activation: ExpertActivation::SwiGlu,
};

/// Loads a Mixtral decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: MixtralArgs = family_args(raw)?;
    let mut args = args.clone();
    let nested_theta = args
        .rope_parameters
        .as_ref()
        .is_some_and(|p| p.get("rope_theta").is_some());
    if args.rope_theta.is_none() && !nested_theta {
        args.rope_theta = Some(1e6);
    }
    let options = DecoderOptions::default();
    let layers = (0..args.num_hidden_layers as usize)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let self_attn = Attention::load(w, &format!("{p}.self_attn"), &args, &options)?;
            let moe = SparseMoe::load(
                w,
                &format!("{p}.block_sparse_moe"),
                extra.num_local_experts,
                extra.num_experts_per_tok,
                Routing::TopKSoftmax,
                MOE_LAYOUT,
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
