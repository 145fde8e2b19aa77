//! Qwen3: the LLaMA layout with per-head RMS norm on queries and keys.

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

pub fn options(_args: &ModelArgs) -> DecoderOptions {
    DecoderOptions {
        qk_norm: true,
        layer_windows: Vec::new(),
    }
}
