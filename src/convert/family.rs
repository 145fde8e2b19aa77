//! What a Hugging Face checkpoint of one architecture needs before it is an
//! mlx-lm model: which tensors mlx-lm's `sanitize` drops, and which layers
//! `nn.quantize` turns into quantized ones. A new architecture adds one
//! entry to `FAMILIES`.

use anyhow::{bail, Result};
use serde_json::Value;

/// One architecture (`model_type` in `config.json`).
pub(crate) struct Family {
    pub model_type: &'static str,
    /// What happens to `lm_head.weight`.
    head: Head,
    /// Tensors mlx-lm's `sanitize` removes, besides a tied `lm_head.weight`.
    dropped: fn(&str) -> bool,
    /// Weights of the layers mlx-lm quantizes (`Linear`, `Embedding`), given
    /// the tensor name and its number of dimensions.
    quantizable: fn(&str, usize) -> bool,
    /// The model's own `quant_predicate`: affine `(group_size, bits)` for the
    /// layers it sets apart, used when no recipe names a predicate.
    predicate: fn(&str) -> Option<(i32, i32)>,
}

/// How a family treats the output head.
enum Head {
    /// Tied as `tie_word_embeddings` says, else as this default (None: the
    /// config must say); a tied model's `lm_head.weight` is dropped.
    Tied(Option<bool>),
    /// Always kept: mlx-lm ties exactly when the checkpoint has no
    /// `lm_head.weight`, whatever the config says (gemma3_text).
    Kept,
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

fn recipe_only(_: &str) -> Option<(i32, i32)> {
    None
}

/// Granite keeps the layers whose small block maxima underflow low-bit
/// scales at 8 bits.
fn granite_outputs(prefix: &str) -> Option<(i32, i32)> {
    let safe = prefix.ends_with("self_attn.o_proj")
        || prefix.ends_with("mlp.down_proj")
        || prefix == "lm_head";
    safe.then_some((64, 8))
}

/// A decoder whose sanitize drops at most the rotary cache and a tied head.
const fn dense(model_type: &'static str, head: Head, dropped: fn(&str) -> bool) -> Family {
    Family {
        model_type,
        head,
        dropped,
        quantizable: linear_or_embedding,
        predicate: recipe_only,
    }
}

const FAMILIES: &[Family] = &[
    dense("llama", Head::Tied(Some(true)), rotary_cache),
    // mlx-lm runs mistral as llama.
    dense("mistral", Head::Tied(Some(true)), rotary_cache),
    dense("qwen2", Head::Tied(Some(true)), rotary_cache),
    dense("qwen3", Head::Tied(None), nothing),
    // gemma2 has no lm_head at all: the embedding is the head.
    dense("gemma2", Head::Tied(Some(true)), nothing),
    dense("gemma3_text", Head::Kept, nothing),
    dense("smollm3", Head::Tied(Some(true)), rotary_cache),
    Family {
        predicate: granite_outputs,
        ..dense("granite", Head::Tied(Some(true)), nothing)
    },
    dense("seed_oss", Head::Tied(Some(true)), nothing),
    dense("olmo3", Head::Tied(Some(false)), nothing),
    dense("exaone4", Head::Tied(None), nothing),
    // mlx-lm also folds fp8 block scales here; convert refuses fp8 inputs.
    dense("ministral3", Head::Tied(Some(true)), rotary_cache),
    dense("phi3", Head::Tied(Some(false)), nothing),
    dense("llama4_text", Head::Tied(None), nothing),
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
    /// Whether a tied `lm_head.weight` is dropped.
    pub fn tied(&self, config: &Value) -> Result<bool> {
        let default = match self.head {
            Head::Kept => return Ok(false),
            Head::Tied(default) => default,
        };
        match config.get("tie_word_embeddings").and_then(Value::as_bool) {
            Some(t) => Ok(t),
            None => match default {
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

    /// The model's own quantization of layer `prefix`, if it sets it apart.
    pub(crate) fn predicate(&self, prefix: &str) -> Option<(i32, i32)> {
        (self.predicate)(prefix)
    }
}
