//! Gemma 4 (text, `gemma4_text`; and the text model of the multimodal
//! `gemma4` checkpoints, whose `config.json` nests the decoder in
//! `text_config` and whose tensors sit under `language_model.`).
//!
//! As mlx-lm 0.32.2's class: sliding-window and global layers by
//! `layer_types` (default: every `sliding_window_pattern`-th layer global);
//! global layers may have their own head size (`global_head_dim`), their
//! own KV head count and keys that double as values (`attention_k_eq_v`),
//! and a proportional RoPE over part of the head. Queries and keys are RMS
//! normalized per head, values by a norm without scale; attention is
//! unscaled. Plain RMS norms (no `1 + weight`) in Gemma's sandwich, a
//! tanh-GELU gated MLP (twice as wide in KV-shared layers with
//! `use_double_wide_mlp`), optionally a mixture of experts beside it with
//! its own router, per-layer input embeddings gated into each layer, a
//! learned per-layer scalar, and soft-capped logits.
//!
//! The last `num_kv_shared_layers` layers compute no keys or values: each
//! attends over the keys, values, positions and mask of the last earlier
//! layer of its type. They keep no cache: as mlx-lm's `make_cache`, the
//! cache list holds only the layers before them (rotating caches for the
//! sliding layers), so prompt-cache files and batches agree with mlx-lm.
//! Such layers run only inside this decoder's forward pass ([`hidden`]).

use anyhow::{bail, Context, Result};
use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::ops::{argpartition_axis, expand_dims, softmax_axis};
use mlx_rs::{stop_gradient, Array, Dtype};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{
    Activation, Attention, Block, Decoder, DecoderOptions, FeedForward, LogitsMap, Mlp, QkNormSpan,
    Residual,
};
use super::layers::{Embedding, Linear, LinearWeight, Lora, RmsNorm, Rope};
use super::moe::{ExpertActivation, MoeLayout, Routing, SparseMoe, SwitchGlu};
use super::quantized_attention::quantized_sdpa;
use super::weights::Weights;
use crate::cache::{KvCache, Mask, Positions, QuantizedState};

/// The Gemma 4 fields of the (flattened) `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
struct Gemma4Args {
    #[serde(default = "default_head_dim")]
    head_dim: i32,
    #[serde(default = "default_global_head_dim")]
    global_head_dim: Option<i32>,
    #[serde(default = "default_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default)]
    num_global_key_value_heads: Option<i32>,
    #[serde(default = "default_kv_shared")]
    num_kv_shared_layers: i64,
    #[serde(default = "default_per_layer_width")]
    hidden_size_per_layer_input: i32,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default = "default_window")]
    sliding_window: usize,
    #[serde(default = "default_pattern")]
    sliding_window_pattern: usize,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default = "default_final_cap")]
    final_logit_softcapping: Option<f32>,
    #[serde(default)]
    enable_moe_block: bool,
    #[serde(default)]
    num_experts: Option<i32>,
    #[serde(default)]
    top_k_experts: Option<i32>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
}

fn default_head_dim() -> i32 {
    256
}

fn default_global_head_dim() -> Option<i32> {
    Some(512)
}

fn default_kv_heads() -> i32 {
    1
}

fn default_kv_shared() -> i64 {
    20
}

fn default_per_layer_width() -> i32 {
    256
}

fn default_window() -> usize {
    512
}

fn default_pattern() -> usize {
    5
}

fn default_final_cap() -> Option<f32> {
    Some(30.0)
}

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

impl Gemma4Args {
    /// `layer_types`, or mlx-lm's default from the pattern.
    fn layer_types(&self, n: usize) -> Result<Vec<String>> {
        let types = match &self.layer_types {
            Some(t) => t.clone(),
            None => {
                if self.sliding_window_pattern == 0 {
                    bail!("sliding_window_pattern must be at least 1");
                }
                (0..n)
                    .map(|i| {
                        if (i + 1).is_multiple_of(self.sliding_window_pattern) {
                            FULL.to_string()
                        } else {
                            SLIDING.to_string()
                        }
                    })
                    .collect()
            }
        };
        if types.len() < n {
            bail!(
                "layer_types names {} layers, the model has {n}",
                types.len()
            );
        }
        for t in &types[..n] {
            if t != FULL && t != SLIDING {
                bail!("unsupported Gemma 4 layer type {t:?} (expected {FULL:?} or {SLIDING:?})");
            }
        }
        Ok(types[..n].to_vec())
    }

    /// The RoPE of a layer type, from `rope_parameters` as mlx-lm's
    /// `initialize_rope` reads it.
    fn rope(&self, layer_type: &str, head_dim: i32) -> Result<Rope> {
        let defaults = serde_json::json!({
            FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            SLIDING: {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
        });
        let all = self.rope_parameters.as_ref().unwrap_or(&defaults);
        let empty = serde_json::json!({});
        let p = all.get(layer_type).unwrap_or(&empty);
        let num = |key: &str, default: f64| p.get(key).and_then(|v| v.as_f64()).unwrap_or(default);
        let theta = num("rope_theta", 10000.0) as f32;
        let kind = p
            .get("type")
            .or_else(|| p.get("rope_type"))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let mut rope = Rope::new(head_dim, self.rope_traditional, theta, None)?;
        match kind {
            "default" => {}
            "linear" => rope.scale = (1.0 / num("factor", 1.0)) as f32,
            "proportional" => {
                // mlx-lm's ProportionalRoPE: the first `rotated` dims at
                // `factor * base^(i / dims)`, the rest at an infinite
                // wavelength (left as they are).
                let rotated = (head_dim as f64 * num("partial_rotary_factor", 1.0)) as i32;
                if rotated > head_dim {
                    bail!("partial_rotary_factor rotates more than the head's {head_dim} dims");
                }
                let exps = &mlx_rs::ops::arange::<_, f32>(0, rotated, 2)?
                    / &Array::from_f32(head_dim as f32);
                let rotating = &mlx_rs::ops::power(Array::from_f32(theta), &exps)?
                    * &Array::from_f32(num("factor", 1.0) as f32);
                let still = mlx_rs::ops::full::<f32>(
                    &[(head_dim - rotated) / 2],
                    &Array::from_f32(f32::INFINITY),
                )?;
                rope.freqs = Some(mlx_rs::ops::concatenate(&[rotating, still], 0)?);
            }
            other => bail!("unsupported RoPE type {other:?} in Gemma 4's rope_parameters"),
        }
        Ok(rope)
    }
}

/// Gemma 4's per-layer input embeddings and their projection from the
/// hidden state (the `hidden_size_per_layer_input` models).
#[derive(Clone)]
pub struct PerLayerInputs {
    embed: Embedding,
    projection: Linear,
    norm: RmsNorm,
    width: i32,
    embed_scale: f64,
    projection_scale: f64,
}

/// What the whole decoder keeps beside its layers (held by layer 0).
#[derive(Clone)]
pub struct Gemma4Top {
    per_layer: Option<PerLayerInputs>,
    /// The layers that keep a cache: those before the KV-shared ones.
    caches: usize,
}

/// The experts beside the dense MLP, with their router.
#[derive(Clone)]
pub struct Gemma4Experts {
    router: Linear,
    /// `router.scale * hidden_size^-0.5`, the router's norm weight.
    router_norm: Array,
    per_expert_scale: Array,
    top_k: i32,
    experts: SwitchGlu,
    pre_feedforward_layernorm_2: RmsNorm,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
    eps: f32,
}

/// The per-layer input gate of a layer.
#[derive(Clone)]
pub struct PerLayerGate {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

/// What a Gemma 4 layer has beyond the shared block (its
/// `Residual::Gemma4`).
#[derive(Clone)]
pub struct Gemma4Layer {
    /// The layer whose keys and values this KV-shared layer reuses.
    kv_source: Option<usize>,
    /// The keys (before their norm) are also the values.
    k_eq_v: bool,
    v_norm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    experts: Option<Box<Gemma4Experts>>,
    per_layer: Option<PerLayerGate>,
    layer_scalar: Array,
    top: Option<Box<Gemma4Top>>,
}

fn extras(block: &Block) -> Option<&Gemma4Layer> {
    match &block.residual {
        Residual::Gemma4(g) => Some(g),
        _ => None,
    }
}

fn extras_mut(block: &mut Block) -> Option<&mut Gemma4Layer> {
    match &mut block.residual {
        Residual::Gemma4(g) => Some(g),
        _ => None,
    }
}

/// A Gemma 4 layer's linear layers outside the shared block (the experts'
/// router and the per-layer input gate), by mlx-lm's path inside the layer:
/// LoRA sites.
pub(crate) fn extra_linears(block: &Block) -> Vec<(&'static str, &Linear)> {
    let Some(ext) = extras(block) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(e) = &ext.experts {
        out.push(("router.proj", &e.router));
    }
    if let Some(p) = &ext.per_layer {
        out.push(("per_layer_input_gate", &p.gate));
        out.push(("per_layer_projection", &p.projection));
    }
    out
}

/// `extra_linears`, mutable, in the same order.
pub(crate) fn extra_linears_mut(block: &mut Block) -> Vec<(&'static str, &mut Linear)> {
    let Some(ext) = extras_mut(block) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(e) = &mut ext.experts {
        out.push(("router.proj", &mut e.router));
    }
    if let Some(p) = &mut ext.per_layer {
        out.push(("per_layer_input_gate", &mut p.gate));
        out.push(("per_layer_projection", &mut p.projection));
    }
    out
}

/// The experts beside a Gemma 4 layer's dense MLP (mlx-lm's
/// `experts.switch_glu`).
pub(crate) fn experts(block: &Block) -> Option<&SwitchGlu> {
    Some(&extras(block)?.experts.as_ref()?.experts)
}

/// `experts`, mutable.
pub(crate) fn experts_mut(block: &mut Block) -> Option<&mut SwitchGlu> {
    Some(&mut extras_mut(block)?.experts.as_mut()?.experts)
}

/// The path of [`experts`] inside the layer.
pub(crate) const EXPERTS_KEY: &str = "experts.switch_glu";

/// The adapters of a Gemma 4 layer outside the shared block, from the
/// block's `residual`: the experts' (gate, up, down), then those of
/// [`extra_linears`].
pub(crate) fn extra_loras_mut(residual: &mut Residual) -> Vec<&mut Lora> {
    let Residual::Gemma4(ext) = residual else {
        return Vec::new();
    };
    let Gemma4Layer {
        experts, per_layer, ..
    } = &mut **ext;
    let mut out: Vec<&mut Lora> = Vec::new();
    if let Some(e) = experts {
        let Gemma4Experts {
            router, experts, ..
        } = &mut **e;
        let projs = [
            &mut experts.gate_proj,
            &mut experts.up_proj,
            &mut experts.down_proj,
        ];
        out.extend(projs.into_iter().filter_map(|p| p.lora.as_mut()));
        out.extend(router.lora.as_mut());
    }
    if let Some(p) = per_layer {
        out.extend(p.gate.lora.as_mut());
        out.extend(p.projection.lora.as_mut());
    }
    out
}

fn top(decoder: &Decoder) -> Option<&Gemma4Top> {
    decoder
        .layers
        .first()
        .and_then(extras)
        .and_then(|g| g.top.as_deref())
}

/// Whether `decoder` is a Gemma 4 decoder (run by [`hidden`]).
pub(crate) fn is_gemma4(decoder: &Decoder) -> bool {
    top(decoder).is_some()
}

/// How many caches a Gemma 4 decoder keeps (`None` for other families).
pub(crate) fn cache_count(decoder: &Decoder) -> Option<usize> {
    top(decoder).map(|t| t.caches)
}

/// Whether `key` names a projection this layer does not have (the keys
/// and values of a KV-shared layer, the values of a keys-as-values layer).
pub(crate) fn absent_projection(block: &Block, key: &str) -> bool {
    let linear = match key {
        "self_attn.k_proj" => &block.self_attn.k_proj,
        "self_attn.v_proj" => &block.self_attn.v_proj,
        _ => return false,
    };
    matches!(&linear.weight, LinearWeight::Dense(w) if w.size() == 0)
}

fn empty_linear(dtype: Dtype) -> Result<Linear> {
    Ok(Linear {
        weight: LinearWeight::Dense(mlx_rs::ops::zeros_dtype(&[0, 0], dtype)?),
        bias: None,
        lora: None,
        all_sum: None,
    })
}

/// The decoder's config of a `gemma4` (multimodal) `config.json`: as
/// mlx-lm's wrapper, `text_config` with the top level's `vocab_size`
/// (262144 when absent) and 8 attention heads, 1 KV head by default; the
/// top level keeps `model_type` and the quantization.
pub(crate) fn flatten_config(raw: serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(mut top) = raw else {
        return raw;
    };
    let text = match top.remove("text_config") {
        Some(serde_json::Value::Object(text)) => text,
        _ => serde_json::Map::new(),
    };
    let vocab = top.get("vocab_size").cloned().unwrap_or(262144.into());
    let mut flat = serde_json::Map::new();
    for key in ["model_type", "quantization", "quantization_config"] {
        if let Some(v) = top.remove(key) {
            flat.insert(key.to_string(), v);
        }
    }
    for (key, value) in text {
        if key != "model_type" && !flat.contains_key(&key) {
            flat.insert(key, value);
        }
    }
    flat.insert("vocab_size".into(), vocab);
    flat.entry("num_attention_heads").or_insert(8.into());
    flat.entry("num_key_value_heads").or_insert(1.into());
    // Tokens ids and the like stay readable at the top level.
    for (key, value) in top {
        flat.entry(key).or_insert(value);
    }
    serde_json::Value::Object(flat)
}

/// Where the tensors sit: before the text model's modules, and before `lm_head`.
struct Roots {
    model: String,
    head: String,
}

fn roots(w: &Weights, args: &ModelArgs) -> Roots {
    let nested = args.model_type == "gemma4";
    if nested && w.contains("model.language_model.embed_tokens.weight") {
        // Hugging Face's layout, as mlx-lm's wrapper renames it.
        return Roots {
            model: "model.language_model.".into(),
            head: "lm_head".into(),
        };
    }
    if nested {
        return Roots {
            model: "language_model.model.".into(),
            head: "language_model.lm_head".into(),
        };
    }
    Roots {
        model: "model.".into(),
        head: "lm_head".into(),
    }
}

/// Loads a Gemma 4 text decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Gemma4Args = family_args(raw)?;
    let n = args.num_hidden_layers as usize;
    let types = extra.layer_types(n)?;
    let eps = args.rms_norm_eps;
    let shared_layers = extra.num_kv_shared_layers;
    if shared_layers < 0 || (shared_layers > 0 && shared_layers as usize >= n) {
        bail!(
            "num_kv_shared_layers ({shared_layers}) must leave at least one of the {n} layers \
             computing keys and values"
        );
    }
    let first_shared = n - extra.num_kv_shared_layers.max(0) as usize;
    // Each KV-shared layer reads the last earlier layer of its type.
    let mut kv_source = vec![None; n];
    for (j, t) in types.iter().enumerate().skip(first_shared) {
        let src = (0..first_shared).rev().find(|&i| &types[i] == t);
        kv_source[j] = Some(src.with_context(|| {
            format!(
                "KV-shared layer {j} ({t}) has no earlier {t} layer to read keys and values from"
            )
        })?);
    }
    let r = roots(w, args);
    // As mlx-lm's sanitize: vision and audio towers, rotary tables,
    // activation clipping statistics, and the projections of KV-shared
    // layers are dropped.
    for name in w.remaining() {
        let inner = name.strip_prefix("model.").unwrap_or(&name);
        let tower = [
            "vision_tower",
            "multi_modal_projector",
            "audio_tower",
            "embed_audio",
            "embed_vision",
            "vision_embedder",
        ]
        .iter()
        .any(|t| inner.starts_with(t));
        let unused = [
            "self_attn.rotary_emb",
            "input_max",
            "input_min",
            "output_max",
            "output_min",
        ]
        .iter()
        .any(|s| name.contains(s));
        let shared_kv = kv_source.iter().enumerate().any(|(j, s)| {
            s.is_some()
                && ["k_proj", "v_proj", "k_norm"]
                    .iter()
                    .any(|p| name.starts_with(&format!("{}layers.{j}.self_attn.{p}", r.model)))
        });
        if tower || unused || shared_kv {
            w.take(&name)?;
        }
    }
    let dtype = w.compute_dtype();
    let mut layers = Vec::with_capacity(n);
    for (i, layer_type) in types.iter().enumerate() {
        let p = format!("{}layers.{i}", r.model);
        let full = layer_type == FULL;
        let head_dim = match extra.global_head_dim {
            Some(d) if full && d > 0 => d,
            _ => extra.head_dim,
        };
        let k_eq_v = extra.attention_k_eq_v && full;
        let n_kv_heads = match extra.num_global_key_value_heads {
            Some(h) if k_eq_v => h,
            _ => extra.num_key_value_heads,
        };
        let shared = kv_source[i].is_some();
        let a = format!("{p}.self_attn");
        let q_proj = Linear::load(w, &format!("{a}.q_proj"))?;
        let (k_proj, v_proj, k_norm) = if shared {
            (empty_linear(dtype)?, empty_linear(dtype)?, None)
        } else {
            let k = Linear::load(w, &format!("{a}.k_proj"))?;
            let v = if k_eq_v {
                empty_linear(dtype)?
            } else {
                Linear::load(w, &format!("{a}.v_proj"))?
            };
            (k, v, Some(RmsNorm::load(w, &format!("{a}.k_norm"), eps)?))
        };
        let self_attn = Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj: Linear::load(w, &format!("{a}.o_proj"))?,
            q_norm: Some(RmsNorm::load(w, &format!("{a}.q_norm"), eps)?),
            k_norm,
            n_heads: args.num_attention_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0,
            rope: Some(extra.rope(layer_type, head_dim)?),
            logit_softcap: None,
            sinks: None,
            qk_norm_span: QkNormSpan::Head,
            query_scaling: None,
            output_gate: false,
            latent: None,
        };
        let mut mlp = Mlp::load(w, &format!("{p}.mlp"))?;
        mlp.activation = Activation::GeluApprox;
        let norm = |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{p}.{name}"), eps);
        let experts = if extra.enable_moe_block {
            Some(Box::new(load_experts(w, &p, args, &extra)?))
        } else {
            None
        };
        let per_layer = if extra.hidden_size_per_layer_input > 0 {
            Some(PerLayerGate {
                gate: Linear::load(w, &format!("{p}.per_layer_input_gate"))?,
                projection: Linear::load(w, &format!("{p}.per_layer_projection"))?,
                norm: norm(w, "post_per_layer_input_norm")?,
            })
        } else {
            None
        };
        let ext = Gemma4Layer {
            kv_source: kv_source[i],
            k_eq_v,
            v_norm: RmsNorm::unscaled(head_dim, eps, dtype)?,
            pre_feedforward_layernorm: norm(w, "pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
            experts,
            per_layer,
            layer_scalar: w.take(&format!("{p}.layer_scalar"))?,
            top: None,
        };
        let mut block = Block::pre_norm_with(
            norm(w, "input_layernorm")?,
            norm(w, "post_attention_layernorm")?,
            self_attn,
            FeedForward::Dense(mlp),
        );
        block.residual = Residual::Gemma4(Box::new(ext));
        layers.push(block);
    }
    let per_layer = if extra.hidden_size_per_layer_input > 0 {
        let width = extra.hidden_size_per_layer_input;
        Some(PerLayerInputs {
            embed: Embedding::load(w, &format!("{}embed_tokens_per_layer", r.model))?,
            projection: Linear::load(w, &format!("{}per_layer_model_projection", r.model))?,
            norm: RmsNorm::load(w, &format!("{}per_layer_projection_norm", r.model), eps)?,
            width,
            embed_scale: (width as f64).sqrt(),
            projection_scale: (args.hidden_size as f64).powf(-0.5),
        })
    } else {
        None
    };
    if let Some(Residual::Gemma4(first)) = layers.first_mut().map(|b| &mut b.residual) {
        first.top = Some(Box::new(Gemma4Top {
            per_layer,
            caches: first_shared,
        }));
    }
    let embed_tokens = Embedding::load(w, &format!("{}embed_tokens", r.model))?;
    let norm = RmsNorm::load(w, &format!("{}norm", r.model), eps)?;
    let lm_head = if args.tie_word_embeddings {
        for part in ["weight", "scales", "biases"] {
            w.take_opt(&format!("{}.{part}", r.head))?;
        }
        None
    } else {
        Some(Linear::load(w, &r.head)?)
    };
    let layer_windows = types
        .iter()
        .map(|t| (t == SLIDING).then_some(extra.sliding_window))
        .collect();
    Ok(Decoder {
        embed_tokens,
        layers,
        norm,
        lm_head,
        options: DecoderOptions {
            qk_norm: true,
            layer_windows,
        },
        embed_scale: Some((args.hidden_size as f64).sqrt() as f32),
        logits_map: match extra.final_logit_softcapping {
            Some(cap) => LogitsMap::SoftCap(cap),
            None => LogitsMap::Identity,
        },
        pipeline: None,
    })
}

fn load_experts(
    w: &mut Weights,
    p: &str,
    args: &ModelArgs,
    extra: &Gemma4Args,
) -> Result<Gemma4Experts> {
    let eps = args.rms_norm_eps;
    let (Some(experts), Some(top_k)) = (extra.num_experts, extra.top_k_experts) else {
        bail!("enable_moe_block needs num_experts and top_k_experts");
    };
    let router = Linear::load(w, &format!("{p}.router.proj"))?;
    let scale = w.take(&format!("{p}.router.scale"))?;
    let root =
        Array::from_f32((args.hidden_size as f64).powf(-0.5) as f32).as_dtype(scale.dtype())?;
    let layout = MoeLayout {
        router: "router.proj",
        experts: "switch_glu",
        hf_names: ["gate_proj", "up_proj", "down_proj"],
        router_key: "router.proj",
        activation: ExpertActivation::GeluApprox,
    };
    // Loads the stacked experts only: the router is Gemma 4's own.
    let moe = SparseMoe::with_router(
        w,
        &format!("{p}.experts"),
        experts,
        top_k,
        Routing::TopKLastSoftmax,
        layout,
        empty_linear(w.compute_dtype())?,
    )?;
    let norm = |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{p}.{name}"), eps);
    Ok(Gemma4Experts {
        router,
        router_norm: &scale * &root,
        per_expert_scale: w.take(&format!("{p}.router.per_expert_scale"))?,
        top_k,
        experts: moe.switch_mlp,
        pre_feedforward_layernorm_2: norm(w, "pre_feedforward_layernorm_2")?,
        post_feedforward_layernorm_1: norm(w, "post_feedforward_layernorm_1")?,
        post_feedforward_layernorm_2: norm(w, "post_feedforward_layernorm_2")?,
        eps,
    })
}

/// `x * s`, the scalar in `x`'s dtype (a Python float times an array).
fn times(x: &Array, s: f64) -> Result<Array> {
    Ok(x * &Array::from_f32(s as f32).as_dtype(x.dtype())?)
}

impl Gemma4Experts {
    /// The routed experts' output for `h` (the router reads `h` itself).
    fn forward(&self, h: &Array) -> Result<Array> {
        let normed = crate::kernels::rms_norm(h, &self.router_norm, self.eps)?;
        let scores = self.router.forward(&normed)?;
        let experts = scores.shape()[scores.ndim() - 1];
        let k = self.top_k;
        let inds = argpartition_axis(&scores, experts - k, -1)?.index((Ellipsis, (experts - k)..));
        let inds = stop_gradient(&inds)?;
        let weights = softmax_axis(&scores.take_along_axis(&inds, -1)?, -1, None)?;
        let weights = &weights * &self.per_expert_scale.take_axis(&inds, 0)?;
        let x = self.pre_feedforward_layernorm_2.forward(h)?;
        let y = self.experts.forward(&x, &inds)?;
        let out = (&expand_dims(&weights, -1)? * &y).sum_axis(-2, false)?;
        self.post_feedforward_layernorm_2.forward(&out)
    }
}

/// Keys and values a layer attended over, for the KV-shared layers after it.
struct SharedKv {
    kv: Kv,
    positions: Positions,
}

enum Kv {
    Dense(Array, Array),
    Quantized(QuantizedState),
}

impl Kv {
    fn len(&self) -> i32 {
        match self {
            Kv::Dense(k, _) => k.shape()[2],
            Kv::Quantized(q) => q.len(),
        }
    }
}

fn attention(
    block: &Block,
    ext: &Gemma4Layer,
    x: &Array,
    index: usize,
    caches: &mut [Box<dyn KvCache>],
    shared: &mut [Option<SharedKv>],
) -> Result<Array> {
    let attn = &block.self_attn;
    let (b, l) = (x.shape()[0], x.shape()[1]);
    let head_norm = |y: Array, n: i32, norm: Option<&RmsNorm>| -> Result<Array> {
        let y = y.reshape(&[b, l, n, attn.head_dim])?;
        let y = match norm {
            Some(norm) => norm.forward(&y)?,
            None => y,
        };
        Ok(y.transpose_axes(&[0, 2, 1, 3])?)
    };
    let q = head_norm(attn.q_proj.forward(x)?, attn.n_heads, attn.q_norm.as_ref())?;
    let rope = attn.rope.as_ref().context("a Gemma 4 layer has RoPE")?;
    let source = ext.kv_source.unwrap_or(index);
    if ext.kv_source.is_none() {
        let cache = caches
            .get_mut(index)
            .with_context(|| format!("no cache for Gemma 4 layer {index}"))?;
        let k = attn.k_proj.forward(x)?;
        let v = if ext.k_eq_v {
            k.clone()
        } else {
            attn.v_proj.forward(x)?
        };
        let positions = cache.positions();
        let k = head_norm(k, attn.n_kv_heads, attn.k_norm.as_ref())?;
        let k = rope.forward_at(&k, &positions)?;
        let v = head_norm(v, attn.n_kv_heads, Some(&ext.v_norm))?;
        let kv = match cache.update_quantized(&k, &v)? {
            Some(q) => Kv::Quantized(q),
            None => {
                let (k, v) = cache.update_and_fetch(&k, &v)?;
                Kv::Dense(k, v)
            }
        };
        shared[index] = Some(SharedKv { kv, positions });
    }
    let src = shared[source].as_ref().with_context(|| {
        format!("Gemma 4 layer {index} reads layer {source}'s keys before they exist")
    })?;
    let q = rope.forward_at(&q, &src.positions)?;
    let mask = caches[source].mask(l, src.kv.len())?;
    let out = match &src.kv {
        Kv::Quantized(kv) => quantized_sdpa(&q, kv, attn.scale, mask)?,
        Kv::Dense(k, v) => match mask {
            Mask::None => scaled_dot_product_attention(&q, k, v, attn.scale, None, None)?,
            Mask::Causal => scaled_dot_product_attention(
                &q,
                k,
                v,
                attn.scale,
                ScaledDotProductAttentionMask::Causal,
                None,
            )?,
            Mask::Array(m) => scaled_dot_product_attention(&q, k, v, attn.scale, &m, None)?,
        },
    };
    let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
    attn.o_proj.forward(&out)
}

fn layer_forward(
    block: &Block,
    ext: &Gemma4Layer,
    x: &Array,
    per_layer_input: Option<&Array>,
    index: usize,
    caches: &mut [Box<dyn KvCache>],
    shared: &mut [Option<SharedKv>],
) -> Result<Array> {
    let normed = block.input_layernorm.forward(x)?;
    let r = attention(block, ext, &normed, index, caches, shared)?;
    let h = x + &block.post_attention_layernorm.forward(&r)?;
    let dense = block
        .mlp
        .forward(&ext.pre_feedforward_layernorm.forward(&h)?)?;
    let ff = match &ext.experts {
        Some(experts) => {
            let h1 = experts.post_feedforward_layernorm_1.forward(&dense)?;
            &h1 + &experts.forward(&h)?
        }
        None => dense,
    };
    let mut h = &h + &ext.post_feedforward_layernorm.forward(&ff)?;
    if let (Some(gate), Some(input)) = (&ext.per_layer, per_layer_input) {
        let g = super::gemma2::gelu_approx(&gate.gate.forward(&h)?)?;
        let g = gate.projection.forward(&(&g * input))?;
        h = &h + &gate.norm.forward(&g)?;
    }
    Ok(&h * &ext.layer_scalar)
}

/// Hidden states after the final norm of a Gemma 4 decoder, `[B, L, hidden]`;
/// `caches` as [`Decoder::make_caches`] makes them (one per layer before
/// the KV-shared ones).
pub(crate) fn hidden(
    decoder: &Decoder,
    inputs: &Array,
    caches: &mut [Box<dyn KvCache>],
) -> Result<Array> {
    let top = top(decoder).context("not a Gemma 4 decoder")?;
    if decoder.pipeline.is_some() {
        bail!("Gemma 4 cannot run as a layer pipeline across ranks yet");
    }
    if caches.len() < top.caches {
        bail!(
            "this Gemma 4 model keeps {} caches, got {}",
            top.caches,
            caches.len()
        );
    }
    let mut h = decoder.embed(inputs)?;
    let n = decoder.layers.len();
    let per_layer = match &top.per_layer {
        Some(p) => {
            let (b, l) = (inputs.shape()[0], inputs.shape()[1]);
            let shape = [b, l, n as i32, p.width];
            let from_ids = times(&p.embed.forward(inputs)?, p.embed_scale)?.reshape(&shape)?;
            let projected = times(&p.projection.forward(&h)?, p.projection_scale)?;
            let projected = p.norm.forward(&projected.reshape(&shape)?)?;
            Some(times(&(&projected + &from_ids), 0.5f64.sqrt())?)
        }
        None => None,
    };
    let mut shared: Vec<Option<SharedKv>> = (0..n).map(|_| None).collect();
    for (i, block) in decoder.layers.iter().enumerate() {
        let ext = extras(block).context("a Gemma 4 decoder of Gemma 4 layers")?;
        let input = per_layer.as_ref().map(|p| p.index((.., .., i as i32, ..)));
        h = layer_forward(block, ext, &h, input.as_ref(), i, caches, &mut shared)?;
    }
    decoder.norm.forward(&h)
}

/// Keys and values per cache of processed positions (training).
type PrefixState = Vec<(Array, Array)>;

/// The training forward pass of a Gemma 4 decoder (see
/// `autodiff::forward::TrainForward::hidden`): the whole stack at once
/// (KV-shared layers read other layers' keys), continuing after `prefix`
/// (one key/value pair per cache) when given.
pub(crate) fn train_hidden(
    decoder: &Decoder,
    inputs: &Array,
    prefix: Option<&PrefixState>,
    keep_state: bool,
) -> Result<(Array, Option<PrefixState>)> {
    let mut caches = decoder.make_caches();
    if let Some(prefix) = prefix {
        for (cache, (k, v)) in caches.iter_mut().zip(prefix) {
            let offset = k.shape()[2] as usize;
            cache.set_state(k.clone(), v.clone(), offset)?;
        }
    }
    let h = hidden(decoder, inputs, &mut caches)?;
    let state = if keep_state {
        Some(
            caches
                .iter()
                .map(|c| c.state().context("a Gemma 4 cache after a forward pass"))
                .collect::<Result<Vec<_>>>()?,
        )
    } else {
        None
    };
    Ok((h, state))
}

/// `(kv_heads, head_dim)` of cache `i` of a Gemma 4 decoder (`None` for
/// other families, whose caches all have the config's shape).
pub(crate) fn cache_shape(decoder: &Decoder, i: usize) -> Option<(i32, i32)> {
    top(decoder)?;
    let attn = &decoder.layers.get(i)?.self_attn;
    Some((attn.n_kv_heads, attn.head_dim))
}
