//! SmolLM3: the LLaMA decoder with some layers using no positional encoding
//! (NoPE): `no_rope_layers[i] == 0` turns RoPE off in layer `i`; without
//! the list, every `no_rope_layer_interval`-th layer (default 4) has none.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::Decoder;
use super::llama;
use super::weights::Weights;

/// The SmolLM3 fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct SmolLm3Args {
    #[serde(default = "default_interval")]
    pub no_rope_layer_interval: usize,
    #[serde(default)]
    pub no_rope_layers: Option<Vec<u8>>,
}

fn default_interval() -> usize {
    4
}

impl SmolLm3Args {
    /// Whether each of `layers` layers applies RoPE.
    pub(crate) fn uses_rope(&self, layers: usize) -> Result<Vec<bool>> {
        match &self.no_rope_layers {
            Some(list) if list.len() != layers => bail!(
                "no_rope_layers has {} entries but num_hidden_layers is {layers}",
                list.len()
            ),
            Some(list) => Ok(list.iter().map(|&v| v != 0).collect()),
            None if self.no_rope_layer_interval == 0 => {
                bail!("no_rope_layer_interval must be at least 1")
            }
            None => Ok((0..layers)
                .map(|i| !(i + 1).is_multiple_of(self.no_rope_layer_interval))
                .collect()),
        }
    }
}

/// Loads a SmolLM3 decoder (RoPE off in its NoPE layers)
/// from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: SmolLm3Args = family_args(raw)?;
    let uses_rope = extra.uses_rope(args.num_hidden_layers as usize)?;
    let mut decoder = Decoder::load(w, args, llama::options(args))?;
    for (layer, rope) in decoder.layers.iter_mut().zip(uses_rope) {
        if !rope {
            layer.self_attn.rope = None;
        }
    }
    Ok(decoder)
}
