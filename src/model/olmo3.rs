//! OLMo 3 (AI2): post-norm layers (`h = x + norm(attn(x))`,
//! `h + norm(mlp(h))`, no norm before either), RMS norm on queries and keys
//! over all heads at once, and sliding-window layers mixed with global ones
//! by `layer_types` (without it, every fourth layer is global). Sliding
//! layers use plain RoPE at `rope_theta`; global layers add `rope_scaling`.
//! The windowed layers keep rotating caches, so these models decode one
//! request at a time.

use anyhow::Result;
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp, QkNormSpan};
use super::layers::{RmsNorm, Rope};
use super::weights::Weights;

/// The OLMo 3 fields of `config.json` (required, as in mlx-lm).
#[derive(Debug, Deserialize)]
pub(crate) struct Olmo3Args {
    pub sliding_window: usize,
}

/// Loads an OLMo 3 decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Olmo3Args = family_args(raw)?;
    let n = args.num_hidden_layers as usize;
    let global: Vec<bool> = match &args.layer_types {
        Some(types) => types.iter().map(|t| t == "full_attention").collect(),
        None => (0..n).map(|i| (i + 1) % 4 == 0).collect(),
    };
    let options = DecoderOptions {
        qk_norm: false,
        layer_windows: global
            .iter()
            .map(|&g| (!g).then_some(extra.sliding_window))
            .collect(),
    };
    let eps = args.rms_norm_eps;
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut self_attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            self_attn.q_norm = Some(RmsNorm::load(w, &format!("{p}.self_attn.q_norm"), eps)?);
            self_attn.k_norm = Some(RmsNorm::load(w, &format!("{p}.self_attn.k_norm"), eps)?);
            self_attn.qk_norm_span = QkNormSpan::AllHeads;
            if !global[i] {
                self_attn.rope = Some(Rope::new(args.head_dim(), false, args.rope_base(), None)?);
            }
            let mlp = FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?);
            Block::post_norm(w, &p, args, self_attn, mlp)
        })
        .collect::<Result<Vec<_>>>()?;
    Decoder::assemble(w, args, layers, options)
}
