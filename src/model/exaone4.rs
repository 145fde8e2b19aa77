//! EXAONE 4 (LG AI Research): post-norm layers (`h = x + norm(attn(x))`,
//! `h + norm(mlp(h))`, no norm before either) with RMS norm on each query
//! and key head. `sliding_window_pattern` (e.g. `"LLLG"`, repeated over
//! the layers) marks local layers `L`, which attend over `sliding_window`
//! positions with RoPE, and global layers `G`, which use no positional
//! encoding; without a pattern every layer is global with RoPE. The
//! windowed layers keep rotating caches.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp};
use super::weights::Weights;

/// The EXAONE 4 fields of `config.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct Exaone4Args {
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub sliding_window_pattern: Option<String>,
}

impl Exaone4Args {
    /// Per layer: `Some(true)` local, `Some(false)` global, `None` without
    /// a pattern.
    fn locality(&self, layers: usize) -> Vec<Option<bool>> {
        match self
            .sliding_window_pattern
            .as_deref()
            .filter(|p| !p.is_empty())
        {
            Some(pattern) => {
                let marks: Vec<char> = pattern.chars().collect();
                (0..layers)
                    .map(|i| Some(marks[i % marks.len()] == 'L'))
                    .collect()
            }
            None => vec![None; layers],
        }
    }
}

/// Loads an EXAONE 4 decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Exaone4Args = family_args(raw)?;
    let n = args.num_hidden_layers as usize;
    let locality = extra.locality(n);
    let layer_windows = locality
        .iter()
        .map(|&local| match (local, extra.sliding_window) {
            (Some(true), None) => {
                bail!("sliding_window_pattern has local layers but sliding_window is not set")
            }
            (Some(true), window) => Ok(window),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    let options = DecoderOptions {
        qk_norm: true,
        layer_windows,
    };
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut self_attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            if locality[i] == Some(false) {
                self_attn.rope = None;
            }
            let mlp = FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?);
            Block::post_norm(w, &p, args, self_attn, mlp)
        })
        .collect::<Result<Vec<_>>>()?;
    Decoder::assemble(w, args, layers, options)
}
