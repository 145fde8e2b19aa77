//! Gemma 3 (text): Gemma 2's layer (sandwich norms, tanh-GELU, `1 + weight`
//! norms) without soft-capping, with RMS norm on queries and keys, and
//! sliding-window layers interleaved with global ones: layer `i` is global
//! when `(i + 1) % sliding_window_pattern == 0`. Sliding layers use
//! `rope_local_base_freq` and no scaling; global layers `rope_theta` with
//! `rope_scaling`. Embeddings are scaled by `sqrt(hidden_size)` rounded to
//! bfloat16, as mlx-lm does. The windowed layers keep rotating caches, which
//! batch as `BatchRotatingCache` beside the global layers' dense batch caches.

use anyhow::{bail, Result};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Decoder, DecoderOptions, LogitsMap};
use super::gemma2::{gemma_block, gemma_ends};
use super::layers::Rope;
use super::weights::Weights;

/// The Gemma 3 fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct Gemma3Args {
    #[serde(default = "default_query_pre_attn_scalar")]
    pub query_pre_attn_scalar: f32,
    #[serde(default = "default_local_base")]
    pub rope_local_base_freq: f32,
    #[serde(default = "default_global_base")]
    pub rope_theta: f32,
    #[serde(default = "default_window")]
    pub sliding_window: usize,
    #[serde(default = "default_pattern")]
    pub sliding_window_pattern: usize,
}

fn default_query_pre_attn_scalar() -> f32 {
    256.0
}

fn default_local_base() -> f32 {
    10_000.0
}

fn default_global_base() -> f32 {
    1_000_000.0
}

fn default_window() -> usize {
    512
}

fn default_pattern() -> usize {
    6
}

impl Gemma3Args {
    pub(crate) fn is_sliding(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.sliding_window_pattern)
    }
}

/// Loads a Gemma 3 text decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Gemma3Args = family_args(raw)?;
    if extra.sliding_window_pattern == 0 || extra.sliding_window == 0 {
        bail!("sliding_window and sliding_window_pattern must be at least 1");
    }
    let head_dim = args.head_dim();
    let scale = (extra.query_pre_attn_scalar as f64).powf(-0.5) as f32;
    let mut layer_windows = Vec::new();
    let layers = (0..args.num_hidden_layers as usize)
        .map(|i| {
            let mut block = gemma_block(w, &format!("model.layers.{i}"), args, true)?;
            let sliding = extra.is_sliding(i);
            block.self_attn.scale = scale;
            block.self_attn.rope = Some(if sliding {
                Rope::new(head_dim, false, extra.rope_local_base_freq, None)?
            } else {
                Rope::new(
                    head_dim,
                    false,
                    extra.rope_theta,
                    args.rope_scaling()?.as_ref(),
                )?
            });
            layer_windows.push(sliding.then_some(extra.sliding_window));
            Ok(block)
        })
        .collect::<Result<Vec<_>>>()?;
    let (embed_tokens, norm, lm_head) = gemma_ends(w, args)?;
    let embed_scale = Array::from_f32((args.hidden_size as f64).sqrt() as f32)
        .as_dtype(Dtype::Bfloat16)?
        .as_dtype(Dtype::Float32)?
        .item_cast::<f32>();
    Ok(Decoder {
        embed_tokens,
        layers,
        norm,
        lm_head,
        options: DecoderOptions {
            qk_norm: true,
            layer_windows,
        },
        embed_scale: Some(embed_scale),
        logits_map: LogitsMap::Identity,
        pipeline: None,
    })
}
