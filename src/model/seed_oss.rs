//! Seed-OSS (ByteDance): the LLaMA decoder with biases where the config
//! asks for them: `attention_bias` on q/k/v, `attention_out_bias` on the
//! output projection, `mlp_bias` on the MLP (all read from the weights).
//! A tied checkpoint's stray `lm_head` is dropped, as mlx-lm's `sanitize`.

use anyhow::Result;

use super::config::ModelArgs;
use super::decoder::{Decoder, DecoderOptions};
use super::weights::Weights;

/// Loads a Seed-OSS decoder from the checkpoint's tensors `w` and its config `args`.
pub fn load(w: &mut Weights, args: &ModelArgs) -> Result<Decoder> {
    if args.tie_word_embeddings {
        for part in ["weight", "scales", "biases"] {
            w.take_opt(&format!("lm_head.{part}"))?;
        }
    }
    Decoder::load(w, args, DecoderOptions::default())
}
