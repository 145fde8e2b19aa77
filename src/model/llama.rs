//! The LLaMA family: Llama 2/3 (with rope scaling), SmolLM2, Mistral.
//! A plain pre-norm decoder; Mistral v0.1 adds a sliding window.

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

pub fn options(args: &ModelArgs) -> DecoderOptions {
    DecoderOptions {
        qk_norm: false,
        sliding_window: if args.model_type == "mistral" {
            args.sliding_window
        } else {
            None
        },
    }
}
