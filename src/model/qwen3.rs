//! Qwen3: the LLaMA layout with per-head RMS norm on queries and keys.

use super::config::ModelArgs;
use super::decoder::DecoderOptions;

/// The decoder options of Qwen3: RMS norm on each query and key head, full
/// attention everywhere.
pub fn options(_args: &ModelArgs) -> DecoderOptions {
    DecoderOptions {
        qk_norm: true,
        layer_windows: Vec::new(),
    }
}
