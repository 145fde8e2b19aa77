//! NVIDIA Nemotron-H (`nemotron_h`): a stack of single-purpose layers, each
//! `x + mixer(norm(x))`, whose kind `hybrid_override_pattern` names one
//! character per layer (or `layers_block_type` / `layer_types` one word per
//! layer): `M` a Mamba-2 mixer ([`Mamba2`]), `*` attention without positional
//! encoding (head size `head_dim`, else `hidden_size / num_attention_heads`),
//! `-` a ReLU² MLP (`down_proj(relu(up_proj x)²)`), `E` a mixture of ReLU²
//! experts ([`ExpertsLayer`]). Norms are RMS norms with
//! `layer_norm_epsilon`; the embedding is `backbone.embeddings`, the last
//! norm `backbone.norm_f`, and the output head `lm_head` is never tied.
//!
//! Only the Mamba-2 and attention layers keep a cache (mlx-lm's
//! `make_cache`: an `ArraysCache` of size 2 for `M`, a `KVCache` for `*`), so
//! each of our blocks is one such layer with the MLP and experts layers that
//! follow it ([`MlpStack`]; those before the first mixer run at the start of
//! the first block): one block per cache, as mlx-lm's cache list and its
//! prompt-cache files count them. The multi-token-prediction weights
//! (`mtp.*`) are dropped; Hugging Face convolutions `[channels, 1, kernel]`
//! are turned, and per-expert weights stacked, as mlx-lm's `sanitize` does.

use anyhow::{bail, Context, Result};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{
    Activation, Attention, Block, Decoder, DecoderOptions, FeedForward, LogitsMap, Mlp, Recurrent,
    Residual,
};
use super::layers::{Embedding, Linear, LinearWeight, RmsNorm};
use super::mamba2::{Mamba2, Mamba2Dims, StepLimit};
use super::moe::SwitchMlp;
use super::nemotron_h_moe::{relu_squared, ExpertRouting, ExpertsArgs, ExpertsLayer};
use super::weights::Weights;
use crate::cache::KvCache;

/// `hybrid_override_pattern`: a string of one character per layer, or a
/// list of one-character strings (as mlx-lm's `ModelArgs` holds it).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Pattern {
    Text(String),
    List(Vec<String>),
}

/// The Nemotron-H fields of `config.json` (mlx-lm's `nemotron_h.ModelArgs`).
#[derive(Debug, Deserialize)]
struct NemotronHArgs {
    mamba_num_heads: i32,
    mamba_head_dim: i32,
    ssm_state_size: i32,
    conv_kernel: i32,
    n_groups: i32,
    layer_norm_epsilon: f32,
    #[serde(default)]
    hybrid_override_pattern: Option<Pattern>,
    #[serde(default)]
    layers_block_type: Option<Vec<String>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    time_step_limit: Option<Vec<serde_json::Value>>,
    #[serde(flatten)]
    experts: ExpertsArgs,
}

/// What one layer of the stack is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mamba,
    Attention,
    Mlp,
    Experts,
}

impl Kind {
    fn from_char(c: char) -> Result<Self> {
        Ok(match c {
            'M' => Kind::Mamba,
            '*' => Kind::Attention,
            '-' => Kind::Mlp,
            'E' => Kind::Experts,
            other => bail!(
                "hybrid_override_pattern has {other:?}; expected M (Mamba-2), * (attention), - \
                 (MLP) or E (experts)"
            ),
        })
    }

    /// A `layers_block_type` word (mlx-lm's `_block_type_to_char`).
    fn from_word(word: &str) -> Result<Self> {
        Ok(match word {
            "full_attention" | "attention" => Kind::Attention,
            "linear_attention" | "mamba" | "conv" => Kind::Mamba,
            "moe" => Kind::Experts,
            "mlp" => Kind::Mlp,
            other => bail!(
                "unsupported layers_block_type {other:?}, expected any of attention, conv, \
                 full_attention, linear_attention, mamba, mlp, moe"
            ),
        })
    }
}

impl NemotronHArgs {
    /// Per layer: its kind, from `hybrid_override_pattern`, else from
    /// `layers_block_type` or `layer_types`.
    fn layers(&self) -> Result<Vec<Kind>> {
        let kinds: Result<Vec<Kind>> =
            match (&self.hybrid_override_pattern, &self.layers_block_type) {
                (Some(Pattern::Text(s)), _) => s.chars().map(Kind::from_char).collect(),
                (Some(Pattern::List(l)), _) => l
                    .iter()
                    .map(|s| {
                        let mut chars = s.chars();
                        match (chars.next(), chars.next()) {
                            (Some(c), None) => Kind::from_char(c),
                            _ => bail!("hybrid_override_pattern has {s:?}, not one character"),
                        }
                    })
                    .collect(),
                (None, Some(words)) => words.iter().map(|w| Kind::from_word(w)).collect(),
                (None, None) => match &self.layer_types {
                    Some(words) => words.iter().map(|w| Kind::from_word(w)).collect(),
                    None => bail!(
                        "the config must have layers_block_type or hybrid_override_pattern to \
                     describe the layer stack"
                    ),
                },
            };
        let kinds = kinds?;
        if !kinds
            .iter()
            .any(|k| matches!(k, Kind::Mamba | Kind::Attention))
        {
            bail!("the layer stack has no Mamba-2 or attention layer (mlx-lm keeps no cache then)");
        }
        Ok(kinds)
    }

    fn limit(&self) -> Result<StepLimit> {
        let Some(bounds) = &self.time_step_limit else {
            return Ok(StepLimit::default());
        };
        let [lo, hi] = bounds.as_slice() else {
            bail!("time_step_limit must hold two numbers, got {bounds:?}");
        };
        let (min, max) = (bound(lo)?, bound(hi)?);
        if min.is_nan() || max.is_nan() || min > max {
            bail!("time_step_limit must be ordered numbers, got [{min}, {max}]");
        }
        Ok(StepLimit { min, max })
    }

    /// The experts layers' routing, when the stack has any.
    fn routing(&self, kinds: &[Kind]) -> Result<Option<ExpertRouting>> {
        match kinds.contains(&Kind::Experts) {
            true => Ok(Some(self.experts.routing()?)),
            false => Ok(None),
        }
    }

    fn dims(&self) -> Mamba2Dims {
        Mamba2Dims {
            heads: self.mamba_num_heads,
            head_dim: self.mamba_head_dim,
            groups: self.n_groups,
            state_size: self.ssm_state_size,
            conv_kernel: self.conv_kernel,
        }
    }
}

/// A number of `time_step_limit`: a JSON number, or infinity as Python's
/// `json` writes it (read as the string `"Infinity"`, see
/// [`parse_config_text`]) or transformers 5 does (`{"__float__": "Infinity"}`).
fn bound(v: &serde_json::Value) -> Result<f32> {
    if let Some(x) = v.as_f64() {
        return Ok(x as f32);
    }
    let text = match v {
        serde_json::Value::String(s) => s.as_str(),
        serde_json::Value::Object(o) => o.get("__float__").and_then(|s| s.as_str()).unwrap_or(""),
        _ => "",
    };
    match text.to_ascii_lowercase().as_str() {
        "infinity" | "inf" | "+infinity" | "+inf" => Ok(f32::INFINITY),
        "-infinity" | "-inf" => Ok(f32::NEG_INFINITY),
        _ => bail!("time_step_limit holds {v}, not a number"),
    }
}

/// `config.json` text as JSON, where Python's `json` may have written the
/// bare `Infinity`, `-Infinity` or `NaN` (NVIDIA's Nemotron-H configs do, in
/// `time_step_limit`): those become the strings `"Infinity"` etc., which
/// strict JSON readers (serde_json) otherwise refuse.
pub(crate) fn parse_config_text(text: &str) -> serde_json::Result<serde_json::Value> {
    let err = match serde_json::from_str(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_string = true;
        } else if let Some(word) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|w| rest.starts_with(w))
        {
            out.push('"');
            out.push_str(word);
            out.push('"');
            rest = &rest[word.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    serde_json::from_str(&out).map_err(|_| err)
}

/// The fields of a Nemotron-H `config.json` that the shared config reads
/// under other names: `rms_norm_eps` from `layer_norm_epsilon` (where the
/// config leaves it out), and `num_hidden_layers` as the length of the layer
/// pattern (transformers may omit it; mlx-lm derives it so).
pub(crate) fn shared_config(raw: serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(mut top) = raw else {
        return raw;
    };
    if let Some(v) = top
        .get("layer_norm_epsilon")
        .filter(|v| !v.is_null())
        .cloned()
    {
        top.entry("rms_norm_eps").or_insert(v);
    }
    let layers = match top.get("hybrid_override_pattern") {
        Some(serde_json::Value::String(s)) => Some(s.chars().count()),
        Some(serde_json::Value::Array(a)) => Some(a.len()),
        _ => ["layers_block_type", "layer_types"]
            .iter()
            .find_map(|k| top.get(*k).and_then(|v| v.as_array()).map(Vec::len)),
    };
    if let Some(n) = layers {
        top.insert("num_hidden_layers".into(), n.into());
    }
    serde_json::Value::Object(top)
}

/// One `-` layer: `h + down_proj(relu(up_proj(norm(h)))²)`.
#[derive(Clone)]
pub struct ReluSquaredMlp {
    /// The RMS norm before the MLP.
    pub norm: RmsNorm,
    /// Projects to the MLP's hidden width.
    pub up_proj: Linear,
    /// Projects the squared ReLU back to the hidden size.
    pub down_proj: Linear,
}

impl ReluSquaredMlp {
    fn load(w: &mut Weights, prefix: &str, norm: RmsNorm) -> Result<Self> {
        let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{prefix}.mixer.{name}"));
        Ok(Self {
            norm,
            up_proj: lin(w, "up_proj")?,
            down_proj: lin(w, "down_proj")?,
        })
    }

    /// Its linear layers by their path inside its layer, as mlx-lm names
    /// them (the LoRA sites).
    pub(crate) fn linears(&self) -> [(&'static str, &Linear); 2] {
        [
            ("mixer.up_proj", &self.up_proj),
            ("mixer.down_proj", &self.down_proj),
        ]
    }

    /// `linears`, mutable, in the same order.
    pub(crate) fn linears_mut(&mut self) -> [(&'static str, &mut Linear); 2] {
        [
            ("mixer.up_proj", &mut self.up_proj),
            ("mixer.down_proj", &mut self.down_proj),
        ]
    }

    /// The layer's output: `h` plus the MLP of its norm.
    pub fn forward(&self, h: &Array) -> Result<Array> {
        let normed = self.norm.forward(h)?;
        Ok(h + &relu_squared(&self.up_proj, &self.down_proj, &normed)?)
    }
}

/// A layer without a cache: a ReLU² MLP (`-`) or experts (`E`).
#[derive(Clone)]
pub enum StackLayer {
    /// A `-` layer.
    Mlp(Box<ReluSquaredMlp>),
    /// An `E` layer.
    Experts(Box<ExpertsLayer>),
}

impl StackLayer {
    /// The layer's output for `h`.
    pub fn forward(&self, h: &Array) -> Result<Array> {
        match self {
            StackLayer::Mlp(mlp) => mlp.forward(h),
            StackLayer::Experts(experts) => experts.forward(h),
        }
    }

    /// Its linear layers by their path inside its layer, as mlx-lm names
    /// them (the LoRA sites; an experts layer's routed experts are not
    /// among them: see `switch_mlp`).
    pub(crate) fn linears(&self) -> Vec<(&'static str, &Linear)> {
        match self {
            StackLayer::Mlp(mlp) => mlp.linears().to_vec(),
            StackLayer::Experts(experts) => experts.linears(),
        }
    }

    /// `linears`, mutable, in the same order.
    pub(crate) fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        match self {
            StackLayer::Mlp(mlp) => mlp.linears_mut().into_iter().collect(),
            StackLayer::Experts(experts) => experts.linears_mut(),
        }
    }

    /// The routed experts, when this is an experts layer.
    pub(crate) fn switch_mlp(&self) -> Option<&SwitchMlp> {
        match self {
            StackLayer::Mlp(_) => None,
            StackLayer::Experts(experts) => Some(&experts.switch_mlp),
        }
    }

    /// `switch_mlp`, mutable.
    pub(crate) fn switch_mlp_mut(&mut self) -> Option<&mut SwitchMlp> {
        match self {
            StackLayer::Mlp(_) => None,
            StackLayer::Experts(experts) => Some(&mut experts.switch_mlp),
        }
    }
}

/// A Nemotron-H block: the MLP and experts layers before its mixer (only in
/// the first block, when the stack starts with them), the mixer (the
/// block's `linear_attn` or `self_attn`, after its `input_layernorm`), then
/// the MLP and experts layers that follow it up to the next mixer.
#[derive(Clone)]
pub struct MlpStack {
    /// The layers before the mixer (first block only).
    pub before: Vec<StackLayer>,
    /// The layers after the mixer, up to the next one.
    pub after: Vec<StackLayer>,
}

impl MlpStack {
    /// The layers around the mixer in stack order: `before`, then `after`.
    pub(crate) fn layers(&self) -> impl Iterator<Item = &StackLayer> {
        self.before.iter().chain(&self.after)
    }

    /// `layers`, mutable, in the same order.
    pub(crate) fn layers_mut(&mut self) -> impl Iterator<Item = &mut StackLayer> {
        self.before.iter_mut().chain(&mut self.after)
    }

    /// The block's output: `before`, the mixer of `block` (updating `cache`) as
    /// a residual layer, then `after`.
    pub fn forward(&self, block: &Block, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let mut h = x.clone();
        for layer in &self.before {
            h = layer.forward(&h)?;
        }
        let normed = block.input_layernorm.forward(&h)?;
        let mixed = match &block.linear_attn {
            Some(mixer) => mixer.forward(&normed, cache)?,
            None => block.self_attn.forward(&normed, cache)?,
        };
        h = &h + &mixed;
        for layer in &self.after {
            h = layer.forward(&h)?;
        }
        Ok(h)
    }
}

/// The attention of layer `prefix` (no positional encoding).
fn attention(w: &mut Weights, prefix: &str, args: &ModelArgs) -> Result<Attention> {
    let lin = |w: &mut Weights, name: &str| Linear::load(w, &format!("{prefix}.mixer.{name}"));
    let head_dim = args.head_dim();
    let mut attn = Attention::absent(w.compute_dtype())?;
    attn.q_proj = lin(w, "q_proj")?;
    attn.k_proj = lin(w, "k_proj")?;
    attn.v_proj = lin(w, "v_proj")?;
    attn.o_proj = lin(w, "o_proj")?;
    for (proj, heads, name) in [
        (&attn.q_proj, args.num_attention_heads, "q_proj"),
        (&attn.k_proj, args.kv_heads(), "k_proj"),
    ] {
        let rows = proj.shape().0;
        if rows != heads * head_dim {
            bail!(
                "tensor \"{prefix}.mixer.{name}.weight\" has {rows} rows, expected {heads} heads \
                 × head_dim {head_dim}"
            );
        }
    }
    attn.n_heads = args.num_attention_heads;
    attn.n_kv_heads = args.kv_heads();
    attn.head_dim = head_dim;
    attn.scale = (head_dim as f32).powf(-0.5);
    attn.rope = None;
    Ok(attn)
}

/// The unused feed-forward slot of a block whose MLPs are its [`MlpStack`].
fn no_feed_forward(dtype: mlx_rs::Dtype) -> Result<FeedForward> {
    let empty = || -> Result<Linear> {
        Ok(Linear {
            weight: LinearWeight::Dense(mlx_rs::ops::zeros_dtype(&[0, 0], dtype)?),
            bias: None,
            lora: None,
            all_sum: None,
        })
    };
    Ok(FeedForward::Dense(Mlp {
        gate_proj: empty()?,
        up_proj: empty()?,
        down_proj: empty()?,
        activation: Activation::Silu,
    }))
}

/// The cache-less layer at `prefix`: experts routed by `experts`, else a
/// ReLU² MLP.
fn stack_layer(
    w: &mut Weights,
    prefix: &str,
    norm: RmsNorm,
    experts: Option<ExpertRouting>,
) -> Result<StackLayer> {
    Ok(match experts {
        Some(routing) => {
            StackLayer::Experts(Box::new(ExpertsLayer::load(w, prefix, norm, routing)?))
        }
        None => StackLayer::Mlp(Box::new(ReluSquaredMlp::load(w, prefix, norm)?)),
    })
}

/// A block under construction: its mixer, with the MLP layers around it.
struct Part {
    norm: RmsNorm,
    self_attn: Attention,
    mixer: Option<Box<Recurrent>>,
    stack: MlpStack,
}

/// Loads a Nemotron-H decoder (Mamba-2, attention, ReLU² MLP and experts
/// layers as
/// `hybrid_override_pattern` lists them) from the checkpoint's tensors `w`,
/// the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: NemotronHArgs = family_args(raw)?;
    let kinds = extra.layers()?;
    let routing = extra.routing(&kinds)?;
    let dims = extra.dims();
    dims.check()?;
    let limit = extra.limit()?;
    let eps = extra.layer_norm_epsilon;
    for name in w.remaining() {
        if name.starts_with("mtp.") {
            w.take(&name)?;
        }
    }
    let dtype = w.compute_dtype();
    let mut parts: Vec<Part> = Vec::new();
    let mut leading = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        let p = format!("backbone.layers.{i}");
        let norm = RmsNorm::load(w, &format!("{p}.norm"), eps)?;
        let (self_attn, mixer) = match kind {
            Kind::Mlp | Kind::Experts => {
                let experts = routing.filter(|_| kind == Kind::Experts);
                let layer = stack_layer(w, &p, norm, experts)
                    .with_context(|| format!("layer {i} ({kind:?})"))?;
                match parts.last_mut() {
                    Some(part) => part.stack.after.push(layer),
                    None => leading.push(layer),
                }
                continue;
            }
            Kind::Mamba => {
                let mamba = Mamba2::load(w, &format!("{p}.mixer"), dims, eps, limit)
                    .with_context(|| format!("layer {i} (Mamba-2)"))?;
                let absent = Attention::absent(dtype)?;
                (absent, Some(Box::new(Recurrent::Mamba2(mamba))))
            }
            Kind::Attention => (attention(w, &p, args)?, None),
        };
        parts.push(Part {
            norm,
            self_attn,
            mixer,
            stack: MlpStack {
                before: std::mem::take(&mut leading),
                after: Vec::new(),
            },
        });
    }
    let layers = parts
        .into_iter()
        .map(|part| {
            Ok(Block {
                self_attn: part.self_attn,
                linear_attn: part.mixer,
                compiled: Default::default(),
                mlp: no_feed_forward(dtype)?,
                input_layernorm: part.norm,
                post_attention_layernorm: RmsNorm::unscaled(args.hidden_size, eps, dtype)?,
                residual: Residual::Stack(Box::new(part.stack)),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Decoder {
        embed_tokens: Embedding::load(w, "backbone.embeddings")?,
        layers,
        norm: RmsNorm::load(w, "backbone.norm_f", eps)?,
        lm_head: Some(Linear::load(w, "lm_head")?),
        options: DecoderOptions::default(),
        embed_scale: None,
        logits_map: LogitsMap::Identity,
        pipeline: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_infinity_in_config_text_is_read() {
        let v = parse_config_text(
            r#"{"a": "x\"Infinity", "time_step_limit": [0.0, Infinity], "b": -Infinity}"#,
        )
        .unwrap();
        assert_eq!(v["a"], "x\"Infinity");
        assert_eq!(bound(&v["time_step_limit"][1]).unwrap(), f32::INFINITY);
        assert_eq!(bound(&v["b"]).unwrap(), f32::NEG_INFINITY);
        assert!(parse_config_text("{not json").is_err());
    }

    #[test]
    fn layer_kinds_from_pattern_or_words() {
        let args = |v: serde_json::Value| -> NemotronHArgs {
            let mut base = serde_json::json!({
                "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16,
                "conv_kernel": 4, "n_groups": 2, "layer_norm_epsilon": 1e-5,
            });
            base.as_object_mut()
                .unwrap()
                .extend(v.as_object().unwrap().clone());
            serde_json::from_value(base).unwrap()
        };
        let a = args(serde_json::json!({"hybrid_override_pattern": "M-*"}));
        assert_eq!(
            a.layers().unwrap(),
            [Kind::Mamba, Kind::Mlp, Kind::Attention]
        );
        let a = args(serde_json::json!({"layers_block_type": ["mamba", "mlp", "attention"]}));
        assert_eq!(
            a.layers().unwrap(),
            [Kind::Mamba, Kind::Mlp, Kind::Attention]
        );
        let a = args(serde_json::json!({"layers_block_type": ["moe", "mamba"]}));
        let kinds = a.layers().unwrap();
        assert_eq!(kinds, [Kind::Experts, Kind::Mamba]);
        let err = format!("{:#}", a.routing(&kinds).unwrap_err());
        assert!(err.contains("n_routed_experts"), "{err}");
        let a = args(serde_json::json!({"hybrid_override_pattern": "--"}));
        assert!(a.layers().is_err());
        let a = args(serde_json::json!({"time_step_limit": [0.0, {"__float__": "Infinity"}]}));
        assert_eq!(a.limit().unwrap().max, f32::INFINITY);
    }
}
