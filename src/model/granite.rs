//! Granite (3.x): the LLaMA decoder with four multipliers: token embeddings
//! times `embedding_multiplier`, attention scores scaled by
//! `attention_multiplier` (instead of `1/sqrt(head_dim)`), both residual
//! branches times `residual_multiplier`, and logits divided by
//! `logits_scaling`.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Decoder, DecoderOptions, LogitsMap, Residual};
use super::weights::Weights;

/// The Granite fields of `config.json` (all required, as in mlx-lm).
#[derive(Debug, Deserialize)]
pub(crate) struct GraniteArgs {
    pub attention_multiplier: f32,
    pub embedding_multiplier: f32,
    pub residual_multiplier: f32,
    pub logits_scaling: f32,
}

/// Loads a Granite 3 decoder (with its four multipliers) from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: GraniteArgs = family_args(raw)?;
    if !(extra.logits_scaling.is_finite() && extra.logits_scaling != 0.0) {
        bail!(
            "logits_scaling must be a non-zero number, got {}",
            extra.logits_scaling
        );
    }
    let mut decoder = Decoder::load(w, args, DecoderOptions::default())?;
    for layer in &mut decoder.layers {
        layer.self_attn.scale = extra.attention_multiplier;
        layer.residual = Residual::Scaled(extra.residual_multiplier);
    }
    decoder.embed_scale = Some(extra.embedding_multiplier);
    decoder.logits_map = LogitsMap::Divide(extra.logits_scaling);
    Ok(decoder)
}
