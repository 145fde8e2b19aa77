//! What a Hugging Face checkpoint of one architecture needs before it is an
//! mlx-lm model: which tensors mlx-lm's `sanitize` drops, and which layers
//! `nn.quantize` turns into quantized ones. A new architecture adds one
//! entry to `FAMILIES`.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::indexing::{Ellipsis, IndexOp, IntoStrideBy};
use mlx_rs::Array;
use serde_json::{Map, Value};

use crate::model::deepseek_v3::{foreign_quantization, split_kv_b_proj};
use crate::model::gated_delta::conv_weight_for_mlx;
use crate::model::lfm2::short_conv_for_mlx;
use crate::model::moe::MoeLayout;
use crate::model::qwen3_next::norm_from_offset;
use crate::model::weights::stack_expert_tensors;
use crate::model::{deepseek_v3, glm4_moe, mistral3, mixtral, qwen3_5, qwen3_moe, qwen3_next};

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
    /// What mlx-lm's `sanitize` does besides dropping tensors: renames,
    /// stacked experts; given the config.
    rewrite: fn(&mut Tensors, &Map<String, Value>) -> Result<()>,
    /// Whether `--dtype` (or the config's dtype) casts this tensor: mlx-lm's
    /// `cast_predicate`.
    cast: fn(&str) -> bool,
    /// What loading the model changes in the config mlx-lm writes back.
    config_edit: fn(&mut Map<String, Value>),
    /// Whether a checkpoint quantized as MXFP4 (`quant_method: mxfp4`) is
    /// read, its packed layers kept as mxfp4 ones.
    reads_mxfp4: bool,
    /// Whether float8 weights with scales (`quant_method: fp8`) are read,
    /// as float weights.
    reads_fp8: bool,
}

pub(crate) type Tensors = HashMap<String, Array>;

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

/// The sparse decoders: the dense layers plus the stacked experts
/// (`SwitchLinear`, `[experts, out, in]`).
fn linear_embedding_or_experts(name: &str, ndim: usize) -> bool {
    linear_or_embedding(name, ndim) || (ndim == 3 && name.contains(".switch_mlp."))
}

fn recipe_only(_: &str) -> Option<(i32, i32)> {
    None
}

fn as_read(_: &mut Map<String, Value>) {}

/// Qwen3.5's arguments rename `rope_parameters.rope_type` to `type` in the
/// config dict mlx-lm then saves.
fn rope_type_as_type(config: &mut Map<String, Value>) {
    let text = match config.get_mut("text_config") {
        Some(Value::Object(text)) => text,
        _ => config,
    };
    let Some(Value::Object(rope)) = text.get_mut("rope_parameters") else {
        return;
    };
    if !rope.contains_key("type") {
        if let Some(kind) = rope.remove("rope_type") {
            rope.insert("type".into(), kind);
        }
    }
}

fn every_tensor(_: &str) -> bool {
    true
}

fn as_stored(_: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    Ok(())
}

/// Ministral 3, Qwen3: float8 weights times their scales (see [`super::fp8`]).
fn fp8_scales_folded(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    super::fp8::fold_scales(tensors, config)
}

/// Mistral 3 as mlx-lm's `sanitize` leaves it: the vision tower and
/// projector dropped, the text model's tensors under `language_model.`
/// (from Hugging Face's `model.language_model.*` and `lm_head`), a tied
/// head dropped (`text_config.tie_word_embeddings`, false when absent),
/// float8 weights times their scales (see [`super::fp8`]). A `mistral4`
/// text model is refused.
fn mistral3_for_mlx(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    let whole = Value::Object(config.clone());
    mistral3::text_model(&whole)?;
    mistral3::to_text_model(tensors);
    let tied = whole["text_config"]["tie_word_embeddings"].as_bool();
    if tied == Some(true) {
        tensors.remove("lm_head.weight");
    }
    super::fp8::fold_scales(tensors, config)?;
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let tensor = tensors.remove(&name).expect("listed above");
        tensors.insert(format!("{}{name}", mistral3::ROOT), tensor);
    }
    Ok(())
}

/// Mistral 3's arguments write the untied default into `text_config`,
/// which mlx-lm then saves.
fn text_config_untied_by_default(config: &mut Map<String, Value>) {
    if let Some(Value::Object(text)) = config.get_mut("text_config") {
        text.entry("tie_word_embeddings").or_insert(false.into());
    }
}

/// Stacks every MoE block's per-expert tensors into its `switch_mlp`,
/// counting the experts the checkpoint has.
fn stack_experts(tensors: &mut Tensors, layout: &MoeLayout) -> Result<()> {
    let first = format!(".experts.0.{}.weight", layout.hf_names[0]);
    let blocks: Vec<String> = tensors
        .keys()
        .filter_map(|n| n.strip_suffix(&first).map(str::to_string))
        .collect();
    for block in blocks {
        let count = (0..)
            .take_while(|e| {
                tensors.contains_key(&format!(
                    "{block}.experts.{e}.{}.weight",
                    layout.hf_names[0]
                ))
            })
            .count();
        layout.stack_hugging_face_experts(tensors, &block, count as i32)?;
    }
    Ok(())
}

fn mixtral_experts(tensors: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    stack_experts(tensors, &mixtral::MOE_LAYOUT)
}

fn qwen3_moe_experts(tensors: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    stack_experts(tensors, &qwen3_moe::MOE_LAYOUT)
}

/// Qwen3-MoE's own predicate: the routers at 8 bits.
fn router_at_8_bits(prefix: &str) -> Option<(i32, i32)> {
    prefix.ends_with("mlp.gate").then_some((64, 8))
}

/// The Qwen3-Next family's predicate: routers and shared-expert gates at 8 bits.
fn gates_at_8_bits(prefix: &str) -> Option<(i32, i32)> {
    router_at_8_bits(prefix).or(prefix.ends_with("shared_expert_gate").then_some((64, 8)))
}

fn multi_token_prediction(name: &str) -> bool {
    name.contains("mtp.")
}

fn vision_or_multi_token_prediction(name: &str) -> bool {
    name.starts_with("vision_tower")
        || name.starts_with("model.visual")
        || multi_token_prediction(name)
}

/// Qwen3.5 keeps the DeltaNet's `A_log` in the checkpoint's dtype.
fn all_but_a_log(name: &str) -> bool {
    !name.ends_with("A_log")
}

/// Qwen3.5 and Qwen3.5-MoE: the text model's tensors under
/// `language_model.`, fused experts split; convolutions moved and norms
/// shifted when a convolution is still in Hugging Face's layout.
fn qwen3_5_for_mlx(tensors: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    qwen3_5::rename_hugging_face(tensors)?;
    let hugging_face = tensors
        .iter()
        .any(|(n, t)| n.contains("conv1d.weight") && t.shape().last() != Some(&1));
    if hugging_face {
        delta_net_for_mlx(tensors)?;
    }
    Ok(())
}

/// The norms the gated DeltaNet families store as offsets from 1.
const OFFSET_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// Moves the convolutions to MLX's layout and adds 1 to the offset norms.
fn delta_net_for_mlx(tensors: &mut Tensors) -> Result<()> {
    for (name, tensor) in tensors.iter_mut() {
        if name.contains("conv1d.weight") {
            *tensor = conv_weight_for_mlx(tensor.clone())?.0;
        } else if tensor.ndim() == 1 && OFFSET_NORMS.iter().any(|n| name.ends_with(n)) {
            *tensor = norm_from_offset(tensor)?;
        }
    }
    Ok(())
}

/// Qwen3-Next: mlx-lm converts a checkpoint only when its experts are
/// stored one by one (Hugging Face's layout).
fn qwen3_next_for_mlx(tensors: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    if !tensors
        .keys()
        .any(|n| n.ends_with(".mlp.experts.0.up_proj.weight"))
    {
        return Ok(());
    }
    stack_experts(tensors, &qwen3_next::LAYOUT)?;
    delta_net_for_mlx(tensors)
}

/// The integer `key` of `config.json`.
fn config_int(config: &Map<String, Value>, key: &str) -> Result<i32> {
    config
        .get(key)
        .and_then(Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
        .with_context(|| format!("config.json has no integer {key}"))
}

/// Removes every tensor whose name starts with `prefix`.
fn drop_prefixed(tensors: &mut Tensors, prefix: &str) {
    tensors.retain(|name, _| !name.starts_with(prefix));
}

/// The sigmoid-routed MoE families keep their routers' score correction in
/// its own dtype.
fn all_but_score_correction(name: &str) -> bool {
    !name.contains("e_score_correction_bias")
}

/// The sigmoid-routed MoE families' router (`mlp.gate`) is a plain module,
/// not a `Linear`: it stays dense.
fn linear_embedding_or_experts_but_router(name: &str, ndim: usize) -> bool {
    linear_embedding_or_experts(name, ndim) && !name.ends_with(".mlp.gate.weight")
}

/// GLM-4.5: fp8 weights (block scales, as GLM-4.5-FP8) folded into floats
/// when the config says fp8; experts stacked; the multi-token-prediction
/// layer (`model.layers.{num_hidden_layers}`) dropped, matched by prefix as
/// mlx-lm does.
fn glm4_moe_for_mlx(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    if super::fp8::config_says_scaled_fp8(config) {
        super::fp8::fold_scales(tensors, config)?;
    }
    let layers = config_int(config, "num_hidden_layers")?;
    drop_prefixed(tensors, &format!("model.layers.{layers}"));
    stack_experts(tensors, &glm4_moe::LAYOUT)
}

/// DeepSeek-V3's multi-token-prediction layer, which mlx-lm drops by this
/// fixed prefix, and the rotary caches.
fn deepseek_v3_extra_layer_or_rotary_cache(name: &str) -> bool {
    name.starts_with("model.layers.61") || name.contains("rotary_emb.inv_freq")
}

/// DeepSeek-V3's quantizable layers also hold the per-head latent
/// projections (`MultiLinear`, `[heads, out, in]`).
fn deepseek_v3_quantizable(name: &str, ndim: usize) -> bool {
    let per_head = ndim == 3 && (name.contains(".embed_q.") || name.contains(".unembed_out."));
    linear_embedding_or_experts_but_router(name, ndim) || per_head
}

/// DeepSeek-V3 (and Kimi K2): fp8 weights (block scales) folded into
/// floats when the config says fp8, experts stacked and each `kv_b_proj`
/// split into `embed_q` and `unembed_out`. The compressed-tensors int4
/// format mlx-lm dequantizes itself is refused.
fn deepseek_v3_for_mlx(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    if super::fp8::config_says_scaled_fp8(config) {
        super::fp8::fold_scales(tensors, config)?;
    }
    if let Some((name, format)) = tensors
        .keys()
        .find_map(|n| foreign_quantization(n).map(|f| (n, f)))
    {
        if name.ends_with("weight_scale_inv") {
            bail!(
                "{name}: fp8 scales, but config.json's quantization_config does not say \
                 quant_method fp8"
            );
        }
        bail!("{name}: {format} are not supported by convert; start from a bfloat16 checkpoint");
    }
    stack_experts(tensors, &deepseek_v3::LAYOUT)?;
    split_every_kv_b_proj(tensors, config)
}

fn split_every_kv_b_proj(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    let suffix = ".kv_b_proj.weight";
    let attentions: Vec<String> = tensors
        .keys()
        .filter_map(|n| n.strip_suffix(suffix).map(str::to_string))
        .collect();
    if attentions.is_empty() {
        return Ok(());
    }
    let heads = config_int(config, "num_attention_heads")?;
    let nope = config_int(config, "qk_nope_head_dim")?;
    let v_head_dim = config_int(config, "v_head_dim")?;
    for attention in attentions {
        if tensors.contains_key(&format!("{attention}.kv_b_proj.scales")) {
            bail!("{attention}.kv_b_proj is quantized; convert it with -d first");
        }
        let dense = tensors.remove(&format!("{attention}{suffix}")).unwrap();
        let (keys, values) = split_kv_b_proj(&dense, heads, nope, v_head_dim)
            .with_context(|| format!("{attention}{suffix}"))?;
        tensors.insert(format!("{attention}.embed_q.weight"), keys);
        tensors.insert(format!("{attention}.unembed_out.weight"), values);
    }
    Ok(())
}

/// LFM2: the short convolutions turned to MLX's layout.
fn lfm2_for_mlx(tensors: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    for (name, tensor) in tensors.iter_mut() {
        if name.contains("conv.weight") {
            *tensor = short_conv_for_mlx(tensor.clone())?;
        }
    }
    Ok(())
}

/// Granite 4 (`granitemoehybrid`): the Mamba-2 convolutions turned to MLX's
/// layout; the experts' fused `input_linear` split into the `switch_mlp`
/// gate and up halves, or, in a model without experts, the shared MLP
/// renamed `mlp` with its `input_linear` split the same way.
fn granitemoehybrid_for_mlx(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    for (name, tensor) in tensors.iter_mut() {
        if name.contains("conv1d.weight") {
            *tensor = conv_weight_for_mlx(tensor.clone())?.0;
        }
    }
    let layers = config_int(config, "num_hidden_layers")?;
    let experts = config.get("num_local_experts").and_then(Value::as_i64);
    let sparse = experts.is_some_and(|n| n != 0);
    let (from, to, axis) = if sparse {
        ("block_sparse_moe", "block_sparse_moe.switch_mlp", 1)
    } else {
        ("shared_mlp", "mlp", 0)
    };
    if !tensors.contains_key(&format!("model.layers.0.{from}.input_linear.weight")) {
        return Ok(());
    }
    for layer in 0..layers {
        let (from, to) = (
            format!("model.layers.{layer}.{from}"),
            format!("model.layers.{layer}.{to}"),
        );
        split_input_linear(tensors, &from, &to, axis)?;
    }
    Ok(())
}

/// Nemotron-H: the Mamba-2 convolutions turned to MLX's layout and every
/// experts layer's `experts.{e}.up_proj` / `down_proj` stacked into
/// `switch_mlp.fc1` / `fc2`.
fn nemotron_h_for_mlx(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    for (name, tensor) in tensors.iter_mut() {
        if name.contains("conv1d.weight") {
            *tensor = conv_weight_for_mlx(tensor.clone())?.0;
        }
    }
    let mixers: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".experts.0.up_proj.weight"))
        .map(str::to_string)
        .collect();
    if mixers.is_empty() {
        return Ok(());
    }
    let count = config_int(config, "n_routed_experts")? as i32;
    for mixer in mixers {
        for (from, to) in [("up_proj", "fc1"), ("down_proj", "fc2")] {
            let target = format!("{mixer}.switch_mlp.{to}");
            stack_expert_tensors(tensors, &format!("{mixer}.experts"), from, &target, count)?;
        }
    }
    Ok(())
}

/// Nemotron-H's router is a plain matrix, not a `Linear`.
fn nemotron_h_quantizable(name: &str, ndim: usize) -> bool {
    linear_embedding_or_experts(name, ndim) && !name.ends_with(".mixer.gate.weight")
}

/// Nemotron-H keeps `A_log` and the score correction in their dtypes.
fn all_but_a_log_or_score_correction(name: &str) -> bool {
    all_but_a_log(name) && all_but_score_correction(name)
}

/// `{from}.input_linear` (gate then up along `axis`) and `{from}.output_linear`
/// become `{to}.gate_proj`, `{to}.up_proj` and `{to}.down_proj`.
fn split_input_linear(tensors: &mut Tensors, from: &str, to: &str, axis: i32) -> Result<()> {
    let take = |tensors: &mut Tensors, name: String| {
        tensors
            .remove(&name)
            .with_context(|| format!("tensor {name} is missing"))
    };
    let input = take(tensors, format!("{from}.input_linear.weight"))?;
    let halves = input
        .split_equal(2, axis)
        .with_context(|| format!("{from}.input_linear.weight: no gate and up halves"))?;
    let [gate, up] = <[Array; 2]>::try_from(halves).unwrap();
    tensors.insert(format!("{to}.gate_proj.weight"), gate);
    tensors.insert(format!("{to}.up_proj.weight"), up);
    let output = take(tensors, format!("{from}.output_linear.weight"))?;
    tensors.insert(format!("{to}.down_proj.weight"), output);
    Ok(())
}

/// Granite 4's predicate: the experts' routers at 8 bits.
fn expert_router_at_8_bits(prefix: &str) -> Option<(i32, i32)> {
    prefix.ends_with("router.layer").then_some((64, 8))
}

/// GPT-OSS as mlx-lm's `sanitize` reads Hugging Face's experts: MXFP4
/// `{name}_blocks` (bytes) and `{name}_scales` become a packed `{name}.weight`
/// and its `.scales`, `gate_up_proj` (gate and up rows interleaved) splits
/// into `gate_proj` and `up_proj`, and the `_bias` tensors follow. A
/// checkpoint with a `gate_proj.weight` is taken as already converted.
fn gpt_oss_for_mlx(tensors: &mut Tensors, _: &Map<String, Value>) -> Result<()> {
    if tensors.keys().any(|n| n.contains("gate_proj.weight")) {
        return Ok(());
    }
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let bias = name.contains("bias");
        let fused = name.contains("gate_up_proj");
        if !fused && !name.contains("down_proj") {
            continue;
        }
        let tensor = tensors.remove(&name).unwrap();
        if bias {
            let name = name.replace("_proj_bias", "_proj.bias");
            insert_expert_part(tensors, &name, tensor, fused);
            continue;
        }
        let (name, tensor) = if name.contains("_blocks") {
            (name.replace("_blocks", ".weight"), mxfp4_words(&tensor)?)
        } else {
            (name.replace("_scales", ".scales"), tensor)
        };
        insert_expert_part(tensors, &name, tensor, fused);
    }
    Ok(())
}

/// Inserts an expert tensor; a fused `gate_up_proj` one goes in as its even
/// rows (gate) and odd rows (up), rows being the last axis of a bias and the
/// one before it otherwise.
fn insert_expert_part(tensors: &mut Tensors, name: &str, tensor: Array, fused: bool) {
    if !fused {
        tensors.insert(name.to_string(), tensor);
        return;
    }
    let every_other = |start: i32| {
        if name.ends_with(".bias") {
            tensor.index((Ellipsis, (start..).stride_by(2)))
        } else {
            tensor.index((Ellipsis, (start..).stride_by(2), ..))
        }
    };
    tensors.insert(name.replace("gate_up_proj", "gate_proj"), every_other(0));
    tensors.insert(name.replace("gate_up_proj", "up_proj"), every_other(1));
}

/// MXFP4 blocks `[.., groups, 16]` bytes as MLX's packed words `[.., groups × 4]`.
fn mxfp4_words(blocks: &Array) -> Result<Array> {
    let words = blocks.view::<u32>()?;
    let shape = words.shape();
    let (lead, last_two) = shape.split_at(shape.len().saturating_sub(2));
    let mut flat = lead.to_vec();
    flat.push(last_two.iter().product());
    Ok(words.reshape(&flat)?)
}

/// GPT-OSS's predicate: the routers at 8 bits.
fn gpt_oss_router_at_8_bits(prefix: &str) -> Option<(i32, i32)> {
    prefix.ends_with("router").then_some((64, 8))
}

/// GPT-OSS's stacked experts sit under `mlp.experts`.
fn linear_embedding_or_gpt_oss_experts(name: &str, ndim: usize) -> bool {
    linear_or_embedding(name, ndim) || (ndim == 3 && name.contains(".mlp.experts."))
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
        rewrite: as_stored,
        cast: every_tensor,
        config_edit: as_read,
        reads_mxfp4: false,
        reads_fp8: false,
    }
}

/// A decoder with sparse experts that Hugging Face stores one by one.
const fn sparse(
    model_type: &'static str,
    head: Head,
    rewrite: fn(&mut Tensors, &Map<String, Value>) -> Result<()>,
) -> Family {
    Family {
        quantizable: linear_embedding_or_experts,
        rewrite,
        ..dense(model_type, head, nothing)
    }
}

/// DeepSeek-V3's decoder: latent attention, sigmoid-routed experts.
const fn deepseek_v3(model_type: &'static str) -> Family {
    Family {
        dropped: deepseek_v3_extra_layer_or_rotary_cache,
        quantizable: deepseek_v3_quantizable,
        cast: all_but_score_correction,
        reads_fp8: true,
        ..sparse(model_type, Head::Kept, deepseek_v3_for_mlx)
    }
}

const FAMILIES: &[Family] = &[
    dense("llama", Head::Tied(Some(true)), rotary_cache),
    // mlx-lm runs mistral as llama.
    dense("mistral", Head::Tied(Some(true)), rotary_cache),
    dense("qwen2", Head::Tied(Some(true)), rotary_cache),
    Family {
        rewrite: fp8_scales_folded,
        reads_fp8: true,
        ..dense("qwen3", Head::Tied(None), nothing)
    },
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
    Family {
        rewrite: fp8_scales_folded,
        reads_fp8: true,
        ..dense("ministral3", Head::Tied(Some(true)), rotary_cache)
    },
    dense("phi3", Head::Tied(Some(false)), nothing),
    dense("llama4_text", Head::Tied(None), nothing),
    sparse("mixtral", Head::Tied(Some(false)), mixtral_experts),
    Family {
        predicate: router_at_8_bits,
        ..sparse("qwen3_moe", Head::Tied(None), qwen3_moe_experts)
    },
    Family {
        dropped: multi_token_prediction,
        predicate: gates_at_8_bits,
        ..sparse("qwen3_next", Head::Tied(Some(false)), qwen3_next_for_mlx)
    },
    Family {
        rewrite: qwen3_5_for_mlx,
        cast: all_but_a_log,
        config_edit: rope_type_as_type,
        ..dense(
            "qwen3_5",
            Head::Tied(Some(false)),
            vision_or_multi_token_prediction,
        )
    },
    Family {
        dropped: vision_or_multi_token_prediction,
        predicate: gates_at_8_bits,
        cast: all_but_a_log,
        config_edit: rope_type_as_type,
        ..sparse("qwen3_5_moe", Head::Tied(Some(false)), qwen3_5_for_mlx)
    },
    Family {
        quantizable: linear_embedding_or_experts_but_router,
        cast: all_but_score_correction,
        reads_fp8: true,
        ..sparse("glm4_moe", Head::Kept, glm4_moe_for_mlx)
    },
    // The embedding is always the head.
    Family {
        rewrite: lfm2_for_mlx,
        ..dense("lfm2", Head::Tied(Some(true)), nothing)
    },
    Family {
        predicate: expert_router_at_8_bits,
        ..sparse(
            "granitemoehybrid",
            Head::Tied(Some(true)),
            granitemoehybrid_for_mlx,
        )
    },
    Family {
        quantizable: linear_embedding_or_gpt_oss_experts,
        predicate: gpt_oss_router_at_8_bits,
        rewrite: gpt_oss_for_mlx,
        reads_mxfp4: true,
        ..dense("gpt_oss", Head::Kept, nothing)
    },
    Family {
        dropped: multi_token_prediction,
        quantizable: nemotron_h_quantizable,
        cast: all_but_a_log_or_score_correction,
        ..sparse("nemotron_h", Head::Kept, nemotron_h_for_mlx)
    },
    deepseek_v3("deepseek_v3"),
    // mlx-lm runs Kimi K2 as deepseek_v3.
    deepseek_v3("kimi_k2"),
    // The head is settled by the rewrite, from text_config.
    Family {
        rewrite: mistral3_for_mlx,
        config_edit: text_config_untied_by_default,
        reads_fp8: true,
        ..dense("mistral3", Head::Kept, rotary_cache)
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
    /// Whether a tied `lm_head.weight` is dropped.
    pub fn tied(&self, config: &Value) -> Result<bool> {
        let default = match self.head {
            Head::Kept => return Ok(false),
            Head::Tied(default) => default,
        };
        let tie = config
            .get("tie_word_embeddings")
            .or_else(|| config.get("text_config")?.get("tie_word_embeddings"));
        match tie.and_then(Value::as_bool) {
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

    /// Renames and stacks the checkpoint's tensors as mlx-lm's `sanitize` does.
    pub(crate) fn rewrite(&self, tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
        (self.rewrite)(tensors, config)
    }

    /// Whether a floating tensor `name` takes the output dtype.
    pub(crate) fn casts(&self, name: &str) -> bool {
        (self.cast)(name)
    }

    /// The config as mlx-lm writes it back after loading the model.
    pub(crate) fn edit_config(&self, config: &mut Map<String, Value>) {
        (self.config_edit)(config)
    }

    /// Whether an MXFP4-quantized checkpoint is read (as mxfp4 layers).
    pub(crate) fn reads_mxfp4(&self) -> bool {
        self.reads_mxfp4
    }

    /// Whether a float8 checkpoint with scales is read (as float weights).
    pub(crate) fn reads_fp8(&self) -> bool {
        self.reads_fp8
    }

    pub(crate) fn quantizable(&self, name: &str, ndim: usize) -> bool {
        (self.quantizable)(name, ndim)
    }

    /// The model's own quantization of layer `prefix`, if it sets it apart.
    pub(crate) fn predicate(&self, prefix: &str) -> Option<(i32, i32)> {
        (self.predicate)(prefix)
    }
}
