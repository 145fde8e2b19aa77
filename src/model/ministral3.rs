//! Ministral 3 (Mistral): the LLaMA layer with Llama 4's attention
//! temperature tuning (queries at position `p` times
//! `1 + llama_4_scaling_beta * ln(1 + floor(p / original_max_position_embeddings))`)
//! and RoPE entirely from `rope_parameters` (its `rope_theta` and scaling).
//! `layer_types` may mark sliding-window layers, which keep rotating caches.
//! A tied checkpoint's stray
//! `lm_head` is dropped, as mlx-lm's `sanitize`.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs, RopeScaling};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp, QueryScaling};
use super::layers::Rope;
use super::weights::Weights;

/// The Ministral 3 fields of `config.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct Ministral3Args {
    pub rope_parameters: RopeParameters,
    #[serde(default)]
    pub sliding_window: Option<usize>,
}

/// The fields of `rope_parameters` read besides the scaling (required, as
/// in mlx-lm).
#[derive(Debug, Deserialize)]
pub(crate) struct RopeParameters {
    pub rope_theta: f32,
    pub llama_4_scaling_beta: f32,
    pub original_max_position_embeddings: f32,
}

/// Loads a Ministral 3 decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Ministral3Args = family_args(raw)?;
    let params = &extra.rope_parameters;
    let max_position = params.original_max_position_embeddings;
    if !(max_position.is_finite() && max_position > 0.0) {
        bail!(
            "rope_parameters.original_max_position_embeddings must be positive, got {max_position}"
        );
    }
    let scaling = RopeScaling::parse(&raw["rope_parameters"]).context("rope_parameters")?;
    let rope = Rope::new(args.head_dim(), false, params.rope_theta, scaling.as_ref())?;
    let query_scaling = QueryScaling {
        beta: params.llama_4_scaling_beta,
        max_position,
    };
    let n = args.num_hidden_layers as usize;
    let layer_windows = match &args.layer_types {
        Some(types) => types
            .iter()
            .map(|t| match (t.as_str(), extra.sliding_window) {
                ("sliding_attention", None) => {
                    bail!("layer_types has sliding layers but sliding_window is not set")
                }
                ("sliding_attention", window) => Ok(window),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?,
        None => vec![None; n],
    };
    if args.tie_word_embeddings {
        for part in ["weight", "scales", "biases"] {
            w.take_opt(&format!("lm_head.{part}"))?;
        }
    }
    let options = DecoderOptions {
        qk_norm: false,
        layer_windows,
    };
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut self_attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            self_attn.rope = Some(rope.clone());
            self_attn.query_scaling = Some(query_scaling);
            let mlp = FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?);
            Block::pre_norm(w, &p, args.rms_norm_eps, self_attn, mlp)
        })
        .collect::<Result<Vec<_>>>()?;
    Decoder::assemble(w, args, layers, options)
}
