//! Qwen3: the LLaMA layout with per-head RMS norm on queries and keys.

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

pub fn options(args: &ModelArgs) -> DecoderOptions {
    DecoderOptions {
        qk_norm: true,
        sliding_window: if args.use_sliding_window == Some(true) {
            args.sliding_window
        } else {
            None
        },
    }
}
