//! Mistral 3 (`mistral3`): the vision-language wrapper Ministral 3 and
//! Mistral Small 3.x ship in. `config.json` nests the decoder in
//! `text_config`, whose `model_type` picks it: `ministral3` (`ministral3.rs`)
//! or else a LLaMA-style decoder (`mistral`, `llama`); `mistral4` is another
//! model, refused. The config is flattened at load (see
//! `model::read_config`), `tie_word_embeddings` false unless `text_config`
//! says otherwise, as mlx-lm reads it. The tensors sit under
//! `language_model.` (mlx-lm's layout) or, as Hugging Face ships them, under
//! `model.language_model.` with `lm_head` at the top; both are renamed to the
//! text model's own names, and the vision tower and projector are dropped.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use mlx_rs::Array;
use serde_json::Value;

use super::config::ModelArgs;
use super::decoder::Decoder;
use super::weights::Weights;
use super::{llama, ministral3};

/// Where the wrapper keeps the text model, in mlx-lm's layout (and so in
/// the per-layer names of its `quantization` block and of LoRA adapters).
pub(crate) const ROOT: &str = "language_model.";

/// The decoder's config of a `mistral3` `config.json`: `text_config`'s
/// fields, `tie_word_embeddings` false when it lacks one; the top level keeps
/// `model_type`, the quantization and `text_config` itself (whose
/// `model_type` picks the decoder), and lends the fields `text_config` lacks
/// (token ids and the like).
pub(crate) fn flatten_config(raw: Value) -> Value {
    let Value::Object(mut top) = raw else {
        return raw;
    };
    let text = match top.get("text_config") {
        Some(Value::Object(text)) => text.clone(),
        _ => serde_json::Map::new(),
    };
    let mut flat = serde_json::Map::new();
    for key in [
        "model_type",
        "quantization",
        "quantization_config",
        "text_config",
    ] {
        if let Some(v) = top.remove(key) {
            flat.insert(key.to_string(), v);
        }
    }
    for (key, value) in text {
        if key != "model_type" && !flat.contains_key(&key) {
            flat.insert(key, value);
        }
    }
    flat.entry("tie_word_embeddings").or_insert(false.into());
    for (key, value) in top {
        flat.entry(key).or_insert(value);
    }
    Value::Object(flat)
}

/// The decoder `text_config.model_type` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TextModel {
    /// `ministral3`.
    Ministral3,
    /// Any other (`mistral`, `llama`), as mlx-lm falls back to LLaMA.
    Llama,
}

/// The decoder of a `mistral3` config (flattened or not); `mistral4` is
/// refused by name.
pub(crate) fn text_model(raw: &Value) -> Result<TextModel> {
    match raw["text_config"]["model_type"].as_str() {
        Some("ministral3") => Ok(TextModel::Ministral3),
        Some("mistral4") => bail!(
            "mistral3 with text_config.model_type \"mistral4\" (Mistral Small 4: latent \
             attention and experts) is not supported"
        ),
        _ => Ok(TextModel::Llama),
    }
}

/// Whether `name` belongs to the vision tower or the multimodal projector,
/// which mlx-lm's `sanitize` drops.
pub(crate) fn is_vision(name: &str) -> bool {
    name.contains("vision_tower") || name.contains("multi_modal_projector")
}

/// Renames a checkpoint's tensors to the text model's own (`model.*`,
/// `lm_head.*`) as mlx-lm's `sanitize` does before handing them to the text
/// model: `model.language_model.*` becomes `model.*`, a leading
/// `language_model.` is removed, and the vision tower and multimodal
/// projector are dropped.
pub(crate) fn to_text_model(tensors: &mut HashMap<String, Array>) {
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let tensor = tensors.remove(&name).expect("listed above");
        if is_vision(&name) {
            continue;
        }
        let renamed = match name.strip_prefix("model.language_model.") {
            Some(rest) => format!("model.{rest}"),
            None => name.strip_prefix(ROOT).unwrap_or(&name).to_string(),
        };
        tensors.insert(renamed, tensor);
    }
}

/// Loads the text decoder of a Mistral 3 checkpoint from its tensors `w`,
/// the flattened config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &Value) -> Result<Decoder> {
    let text = text_model(raw)?;
    to_text_model(w.tensors_mut());
    if let Some(q) = w.quantization_mut() {
        q.strip_layer_prefix(ROOT);
    }
    if args.tie_word_embeddings {
        for part in ["weight", "scales", "biases"] {
            w.take_opt(&format!("lm_head.{part}"))?;
        }
    }
    w.check_shapes(args, false)
        .context("the weights do not match config.json's text_config")?;
    match text {
        TextModel::Ministral3 => ministral3::load(w, args, raw),
        TextModel::Llama => Decoder::load(w, args, llama::options(args)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_config_is_flattened_untied_unless_it_says_so() {
        let raw = serde_json::json!({
            "model_type": "mistral3",
            "eos_token_id": 2,
            "tie_word_embeddings": true,
            "text_config": {"model_type": "mistral", "hidden_size": 64},
        });
        let flat = flatten_config(raw.clone());
        assert_eq!(flat["model_type"], "mistral3");
        assert_eq!(flat["hidden_size"], 64);
        assert_eq!(flat["eos_token_id"], 2);
        assert_eq!(flat["tie_word_embeddings"], false);
        assert_eq!(text_model(&flat).unwrap(), TextModel::Llama);

        let mut tied = raw;
        tied["text_config"]["tie_word_embeddings"] = true.into();
        tied["text_config"]["model_type"] = "ministral3".into();
        let flat = flatten_config(tied);
        assert_eq!(flat["tie_word_embeddings"], true);
        assert_eq!(text_model(&flat).unwrap(), TextModel::Ministral3);
    }

    #[test]
    fn mistral4_is_refused_by_name() {
        let raw = serde_json::json!({"text_config": {"model_type": "mistral4"}});
        let err = text_model(&raw).unwrap_err().to_string();
        assert!(err.contains("\"mistral4\""), "{err}");
    }

    #[test]
    fn both_layouts_become_the_text_models_names_without_vision_tensors() {
        let t = || Array::from_f32(0.0);
        for (embed, head) in [
            (
                "language_model.model.embed_tokens.weight",
                "language_model.lm_head.weight",
            ),
            ("model.language_model.embed_tokens.weight", "lm_head.weight"),
        ] {
            let mut tensors: HashMap<String, Array> = [
                (embed.to_string(), t()),
                (head.to_string(), t()),
                ("vision_tower.transformer.layers.0.w".to_string(), t()),
                ("model.vision_tower.patch_conv.weight".to_string(), t()),
                ("multi_modal_projector.linear_1.weight".to_string(), t()),
                ("model.multi_modal_projector.norm.weight".to_string(), t()),
            ]
            .into_iter()
            .collect();
            to_text_model(&mut tensors);
            let mut names: Vec<_> = tensors.keys().cloned().collect();
            names.sort();
            assert_eq!(names, ["lm_head.weight", "model.embed_tokens.weight"]);
        }
    }
}
