//! The LLaMA family: Llama 2/3 (with rope scaling), SmolLM2, Mistral.
//! A plain pre-norm decoder; layers named `sliding_attention` in
//! `layer_types` attend over a sliding window (as mlx-lm; Mistral maps here).

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

/// The decoder options of the LLaMA family: a sliding window (`sliding_window`)
/// on the layers `layer_types` names `sliding_attention`, full attention elsewhere.
pub fn options(args: &ModelArgs) -> DecoderOptions {
    let layer_windows = match (&args.layer_types, args.sliding_window) {
        (Some(types), Some(window)) => types
            .iter()
            .map(|t| (t == "sliding_attention").then_some(window))
            .collect(),
        _ => Vec::new(),
    };
    DecoderOptions {
        qk_norm: false,
        layer_windows,
    }
}
