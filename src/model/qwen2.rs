//! Qwen2 / Qwen2.5: the LLaMA layout with biases on the q/k/v projections
//! (present in the weights). Full attention in every layer, as mlx-lm.

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

/// The decoder options of Qwen2 / Qwen2.5: plain LLaMA layers with full
/// attention everywhere.
pub fn options(_args: &ModelArgs) -> DecoderOptions {
    DecoderOptions::default()
}
