//! Qwen2 / Qwen2.5: the LLaMA layout with biases on the q/k/v projections
//! (loaded from the weights) and an optional sliding window.

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

pub fn options(args: &ModelArgs) -> DecoderOptions {
    DecoderOptions {
        qk_norm: false,
        sliding_window: if args.use_sliding_window == Some(true) {
            args.sliding_window
        } else {
            None
        },
    }
}
