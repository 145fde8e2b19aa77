//! What a Hugging Face checkpoint of one architecture needs before it is an
//! mlx-lm model: which tensors mlx-lm's `sanitize` drops, and which layers
//! `nn.quantize` turns into quantized ones. A new architecture adds one
//! entry to `FAMILIES`.

use anyhow::{bail, Result};
use serde_json::Value;

/// One architecture (`model_type` in `config.json`).
pub(crate) struct Family {
    pub model_type: &'static str,
    /// `tie_word_embeddings` when `config.json` does not say.
    tie_default: Option<bool>,
    /// Tensors mlx-lm's `sanitize` removes, besides a tied `lm_head.weight`.
    dropped: fn(&str) -> bool,
    /// Weights of the layers mlx-lm quantizes (`Linear`, `Embedding`), given
    /// the tensor name and its number of dimensions.
    quantizable: fn(&str, usize) -> bool,
}

fn rotary_cache(name: &str) -> bool {
    name.contains("self_attn.rotary_emb.inv_freq")
}

fn nothing(_: &str) -> bool {
    false
}

/// The dense decoders: every matrix `weight` belongs to a Linear or the
/// Embedding; norms are vectors.
fn linear_or_embedding(name: &str, ndim: usize) -> bool {
    ndim == 2 && name.ends_with(".weight")
}

const FAMILIES: &[Family] = &[
    Family {
        model_type: "llama",
        tie_default: Some(true),
        dropped: rotary_cache,
        quantizable: linear_or_embedding,
    },
    Family {
        model_type: "qwen2",
        tie_default: Some(true),
        dropped: rotary_cache,
        quantizable: linear_or_embedding,
    },
    Family {
        model_type: "qwen3",
        tie_default: None,
        dropped: nothing,
        quantizable: linear_or_embedding,
    },
];

/// The `model_type`s that convert supports.
pub fn supported() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.model_type).collect()
}

/// The family of a `config.json`.
pub(crate) fn of_config(config: &Value) -> Result<&'static Family> {
    let Some(model_type) = config.get("model_type").and_then(Value::as_str) else {
        bail!("config.json has no model_type");
    };
    match FAMILIES.iter().find(|f| f.model_type == model_type) {
        Some(f) => Ok(f),
        None => bail!(
            "convert does not know model_type {model_type:?} (supported: {})",
            supported().join(", ")
        ),
    }
}

impl Family {
    pub fn tied(&self, config: &Value) -> Result<bool> {
        match config.get("tie_word_embeddings").and_then(Value::as_bool) {
            Some(t) => Ok(t),
            None => match self.tie_default {
                Some(t) => Ok(t),
                None => bail!(
                    "config.json of this {} model lacks tie_word_embeddings",
                    self.model_type
                ),
            },
        }
    }

    /// Whether the tensor `name` is part of the mlx-lm model.
    pub fn keeps(&self, name: &str, tied: bool) -> bool {
        let tied_head = tied && name == "lm_head.weight";
        !(self.dropped)(name) && !tied_head
    }

    pub(crate) fn quantizable(&self, name: &str, ndim: usize) -> bool {
        (self.quantizable)(name, ndim)
    }
}
