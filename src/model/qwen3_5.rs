//! Qwen3.5 (`qwen3_5`, dense) and Qwen3.5-MoE (`qwen3_5_moe`): the hybrid
//! decoder of Qwen3-Next (`qwen3_next.rs`) with the gated DeltaNet's
//! projections stored apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
//! `in_proj_a`), every layer sparse when the model has experts, top-k
//! weights renormalized unless `norm_topk_prob` is false, and RoPE from
//! `rope_parameters` (its `mrope_section` is for images: text positions are
//! plain RoPE). The checkpoints are the text model of a vision-language
//! model: `config.json` nests the decoder's fields in `text_config`
//! (flattened at load, see `model::read_config`) and the tensors sit under
//! `language_model.`; vision-tower tensors are dropped.

use std::collections::HashMap;

use anyhow::{Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::config::ModelArgs;
use super::decoder::Decoder;
use super::qwen3_next::{load_hybrid, Hybrid};
use super::weights::Weights;

/// Loads a Qwen3.5 or Qwen3.5-MoE decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    rename_hugging_face(w.tensors_mut())?;
    let family = Hybrid {
        root: "language_model.",
        grouped_in_proj: false,
        every_layer_sparse: true,
        norm_topk_default: true,
        rope_from_parameters: true,
    };
    load_hybrid(w, args, raw, &family)
}

/// The decoder's config of a Qwen3.5 `config.json`: `text_config`'s fields
/// over the top-level ones (the top level keeps `model_type` and the
/// quantization), as mlx-lm reads it; a flat config is returned as is.
pub(crate) fn flatten_text_config(raw: serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(mut top) = raw else {
        return raw;
    };
    let Some(serde_json::Value::Object(text)) = top.remove("text_config") else {
        return serde_json::Value::Object(top);
    };
    for (key, value) in text {
        if key != "model_type" {
            top.insert(key, value);
        }
    }
    // mlx-lm's default, read only by dense layers.
    top.entry("intermediate_size").or_insert(14336.into());
    serde_json::Value::Object(top)
}

/// A checkpoint as Hugging Face ships it, renamed as mlx-lm's `sanitize`
/// does: `model.language_model.*` becomes `language_model.model.*`, any other
/// top-level tensor (`lm_head`, `mtp.*`) moves under `language_model.`, and a
/// Qwen3.5-MoE layer's fused experts (`experts.gate_up_proj` `[experts,
/// 2 × intermediate, hidden]`, `experts.down_proj`) become the
/// `switch_mlp` projections. Vision tensors are left for the caller to drop;
/// a checkpoint already in mlx-lm's names is left as it is.
pub(crate) fn rename_hugging_face(tensors: &mut HashMap<String, Array>) -> Result<()> {
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        if name.starts_with("language_model.")
            || name.starts_with("vision_tower")
            || name.starts_with("model.visual")
        {
            continue;
        }
        let renamed = match name.strip_prefix("model.language_model.") {
            Some(rest) => format!("language_model.model.{rest}"),
            None => format!("language_model.{name}"),
        };
        let tensor = tensors.remove(&name).expect("listed above");
        tensors.insert(renamed, tensor);
    }
    let fused: Vec<String> = tensors
        .keys()
        .filter_map(|n| n.strip_suffix(".experts.gate_up_proj").map(str::to_string))
        .collect();
    for mlp in fused {
        let gate_up = tensors
            .remove(&format!("{mlp}.experts.gate_up_proj"))
            .expect("listed above");
        let mid = gate_up.shape()[gate_up.ndim() - 2] / 2;
        tensors.insert(
            format!("{mlp}.switch_mlp.gate_proj.weight"),
            gate_up.index((.., ..mid, ..)),
        );
        tensors.insert(
            format!("{mlp}.switch_mlp.up_proj.weight"),
            gate_up.index((.., mid.., ..)),
        );
        let down = tensors
            .remove(&format!("{mlp}.experts.down_proj"))
            .with_context(|| {
                format!("{mlp}.experts.gate_up_proj has no down projection beside it")
            })?;
        tensors.insert(format!("{mlp}.switch_mlp.down_proj.weight"), down);
    }
    Ok(())
}
