//! Where LoRA adapters sit in a model (the "sites": mlx-lm's layer index +
//! module path, mlx-lm's names), how they are initialized, and moving their
//! arrays in and out of a model as the flat parameter list the optimizer and
//! autodiff work on. mlx-lm's layers are our blocks, except in Nemotron-H,
//! whose blocks each hold a mixer layer and the MLP layers around it.
//!
//! A site is what mlx-lm's `linear_to_lora_layers` wraps: a linear layer
//! (`LoRALinear`, `a [in, r]`, `b [r, out]`), a fused projection the
//! loader split (Phi-3's, Granite 4's shared MLP input) (one `LoRALinear` over the fused layer: `a` shared, `b`'s
//! columns split among the parts), or one projection of a sparse layer's
//! experts (`LoRASwitchLinear`: `a [experts, r, in]`, `b [experts, out, r]`).
//!
//! Data about a model, no training: training makes adapters, `adapters`
//! loads them, and dynamic quantization and DWQ reach a block's linear
//! layers by name through `block_linear`.

use anyhow::{bail, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{random, Array};
use serde::{Deserialize, Serialize};

use crate::model::decoder::{Block, FeedForward, Residual};
use crate::model::gemma4_text;
use crate::model::layers::{Linear, Lora};
use crate::model::moe::SWITCH_MLP_KEYS;
use crate::model::moe::{SharedExperts, SparseMoe, SwitchLinear, EXPERT_PROJS};
use crate::model::nemotron_h::{MlpStack, StackLayer};
use crate::model::Model;

/// `lora_parameters`: where adapters go and how large they are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraParameters {
    /// Rank of the low-rank matrices (default 8).
    #[serde(default = "default_rank")]
    pub rank: usize,
    /// Multiplier of the adapter's output (default 20.0).
    #[serde(default = "default_scale")]
    pub scale: f32,
    /// Dropout probability in the adapter during training (default 0).
    #[serde(default)]
    pub dropout: f32,
    /// Module paths inside a block, e.g. `self_attn.q_proj`; absent means every
    /// linear layer of the block (mlx-lm's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
}

fn default_rank() -> usize {
    8
}

fn default_scale() -> f32 {
    20.0
}

impl Default for LoraParameters {
    fn default() -> Self {
        Self {
            rank: default_rank(),
            scale: default_scale(),
            dropout: 0.0,
            keys: None,
        }
    }
}

/// The linear layers of our decoder block, by their path inside the block
/// (mlx-lm's names, except where a loader split a fused layer: see
/// `block_sites` for the LoRA keys). A block has a subset: a sparse
/// Mixture-of-Experts layer has its router (`mlp.gate` in Qwen3-MoE,
/// `block_sparse_moe.gate` in Mixtral, `mlp.router` in GPT-OSS) instead of a dense MLP;
/// a latent attention layer (DeepSeek-V3) has `q_proj` or `q_a_proj` /
/// `q_b_proj`, `kv_a_proj_with_mqa` and `o_proj`.
pub(crate) const BLOCK_LINEARS: [&str; 13] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn.q_a_proj",
    "self_attn.q_b_proj",
    "self_attn.kv_a_proj_with_mqa",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "mlp.gate",
    "block_sparse_moe.gate",
    "mlp.router",
];

pub(crate) fn block_linear<'a>(block: &'a Block, key: &str) -> Option<&'a Linear> {
    let key = our_key(key);
    if let Some(mixer) = &block.linear_attn {
        if key.starts_with("self_attn.") {
            return None;
        }
        if let Some((_, linear)) = mixer.linears().into_iter().find(|(k, _)| *k == key) {
            return Some(linear);
        }
    }
    let gemma4 = gemma4_text::extra_linears(block);
    if let Some((_, linear)) = gemma4.into_iter().find(|(k, _)| *k == key) {
        return Some(linear);
    }
    if gemma4_text::absent_projection(block, key) {
        return None;
    }
    if let Some(linear) = crate::model::deepseek_v3::latent_linear(&block.self_attn, key) {
        return linear;
    }
    Some(match (key, &block.mlp) {
        ("self_attn.q_proj", _) => &block.self_attn.q_proj,
        ("self_attn.k_proj", _) => &block.self_attn.k_proj,
        ("self_attn.v_proj", _) => &block.self_attn.v_proj,
        ("self_attn.o_proj", _) => &block.self_attn.o_proj,
        ("mlp.gate_proj", FeedForward::Dense(m)) => &m.gate_proj,
        ("mlp.up_proj", FeedForward::Dense(m)) => &m.up_proj,
        ("mlp.down_proj", FeedForward::Dense(m)) => &m.down_proj,
        (k, FeedForward::Sparse(moe)) if moe.router_is_linear && k == moe.router_key => &moe.gate,
        (k, FeedForward::Sparse(moe)) => {
            return moe
                .shared_linears()
                .into_iter()
                .find_map(|(name, l)| (name == k).then_some(l))
        }
        _ => return None,
    })
}

pub(crate) fn block_linear_mut<'a>(block: &'a mut Block, key: &str) -> Option<&'a mut Linear> {
    let key = our_key(key);
    if let Some(mixer) = &block.linear_attn {
        if key.starts_with("self_attn.") {
            return None;
        }
        if mixer.linears().iter().any(|(k, _)| *k == key) {
            let mixer = block.linear_attn.as_mut()?;
            return mixer
                .linears_mut()
                .into_iter()
                .find_map(|(k, l)| (k == key).then_some(l));
        }
    }
    if let FeedForward::Sparse(moe) = &block.mlp {
        if moe.shared_linears().iter().any(|(k, _)| k == key) {
            let FeedForward::Sparse(moe) = &mut block.mlp else {
                unreachable!("matched above")
            };
            let linears = moe.shared_linears_mut();
            return linears
                .into_iter()
                .find_map(|(k, l)| (k == key).then_some(l));
        }
    }
    if gemma4_text::extra_linears(block)
        .iter()
        .any(|(k, _)| *k == key)
    {
        let linears = gemma4_text::extra_linears_mut(block);
        return linears
            .into_iter()
            .find_map(|(k, l)| (k == key).then_some(l));
    }
    if gemma4_text::absent_projection(block, key) {
        return None;
    }
    if block.self_attn.latent.is_some() && key.starts_with("self_attn.") {
        return crate::model::deepseek_v3::latent_linear_mut(&mut block.self_attn, key).flatten();
    }
    Some(match (key, &mut block.mlp) {
        ("self_attn.q_proj", _) => &mut block.self_attn.q_proj,
        ("self_attn.k_proj", _) => &mut block.self_attn.k_proj,
        ("self_attn.v_proj", _) => &mut block.self_attn.v_proj,
        ("self_attn.o_proj", _) => &mut block.self_attn.o_proj,
        ("mlp.gate_proj", FeedForward::Dense(m)) => &mut m.gate_proj,
        ("mlp.up_proj", FeedForward::Dense(m)) => &mut m.up_proj,
        ("mlp.down_proj", FeedForward::Dense(m)) => &mut m.down_proj,
        (k, FeedForward::Sparse(moe)) if moe.router_is_linear && k == moe.router_key => {
            &mut moe.gate
        }
        _ => return None,
    })
}

/// Module paths inside a block that some families name differently from
/// the rest, as mlx-lm's classes do, with the path this crate's block uses:
/// LFM2's `self_attn.out_proj` and `feed_forward.w1` / `w3` / `w2`, Llama 4's
/// `feed_forward.*`, Granite 4's `shared_mlp.output_linear`, and Nemotron-H's
/// `mixer.*` (every layer's one module).
const FAMILY_KEYS: [(&str, &str, &str); 14] = [
    ("lfm2", "self_attn.out_proj", "self_attn.o_proj"),
    ("lfm2", "feed_forward.w1", "mlp.gate_proj"),
    ("lfm2", "feed_forward.w3", "mlp.up_proj"),
    ("lfm2", "feed_forward.w2", "mlp.down_proj"),
    ("llama4_text", "feed_forward.gate_proj", "mlp.gate_proj"),
    ("llama4_text", "feed_forward.up_proj", "mlp.up_proj"),
    ("llama4_text", "feed_forward.down_proj", "mlp.down_proj"),
    (
        "granitemoehybrid",
        "shared_mlp.output_linear",
        "shared_mlp.down_proj",
    ),
    ("nemotron_h", "mixer.in_proj", "mamba.in_proj"),
    ("nemotron_h", "mixer.out_proj", "mamba.out_proj"),
    ("nemotron_h", "mixer.q_proj", "self_attn.q_proj"),
    ("nemotron_h", "mixer.k_proj", "self_attn.k_proj"),
    ("nemotron_h", "mixer.v_proj", "self_attn.v_proj"),
    ("nemotron_h", "mixer.o_proj", "self_attn.o_proj"),
];

/// The block path of a (family-named) key.
fn our_key(key: &str) -> &str {
    FAMILY_KEYS
        .iter()
        .find_map(|(_, theirs, ours)| (*theirs == key).then_some(*ours))
        .unwrap_or(key)
}

/// The key mlx-lm gives the block path `key` in a `model_type` model.
fn family_key(model_type: &str, key: &str) -> String {
    FAMILY_KEYS
        .iter()
        .find_map(|(family, theirs, ours)| {
            (*family == model_type && *ours == key).then(|| theirs.to_string())
        })
        .unwrap_or_else(|| key.to_string())
}

/// Where a family's blocks sit in its checkpoint (and mlx-lm's parameter tree).
fn layers_path(model: &Model) -> &'static str {
    match model.args.model_type.as_str() {
        "qwen3_5" | "qwen3_5_moe" | "gemma4" | "mistral3" => "language_model.model.layers",
        "nemotron_h" => "backbone.layers",
        _ => "model.layers",
    }
}

/// What a site adapts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteKind {
    /// One linear layer of the block (`block_linear`).
    Linear,
    /// A fused projection split at load into these linear layers, in row order.
    Fused(&'static [&'static str]),
    /// Projection `i` of `EXPERT_PROJS` of the block's experts (of
    /// `SWITCH_MLP_KEYS` in a Nemotron-H experts layer).
    Experts(usize),
}

/// What part of one of our blocks one of mlx-lm's layers is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerPart {
    /// The whole block (every family but Nemotron-H).
    Block,
    /// Nemotron-H: the block's mixer layer (Mamba-2 or attention).
    Mixer,
    /// Nemotron-H: MLP or experts layer `i` of the block's stack (`before`,
    /// then `after`).
    Mlp(usize),
}

/// One adapted module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Index of the layer in mlx-lm's `model.layers` (its adapter names).
    pub layer: usize,
    /// Index of our block that holds it.
    pub block: usize,
    /// What part of that block the layer is.
    pub part: LayerPart,
    /// Module path inside the block, e.g. `self_attn.q_proj`.
    pub key: String,
    /// What kind of module it is.
    pub kind: SiteKind,
    /// Where the model's blocks sit (`model.layers`, or
    /// `language_model.model.layers` in the nested multimodal checkpoints).
    pub layers_path: &'static str,
}

impl Site {
    /// The module path mlx-lm uses, e.g. `model.layers.29.self_attn.q_proj`.
    pub fn path(&self) -> String {
        format!("{}.{}.{}", self.layers_path, self.layer, self.key)
    }
}

/// The fused projections of a family whose loader splits them.
fn fused_linears(model: &Model) -> &'static [(&'static str, &'static [&'static str])] {
    match model.args.model_type.as_str() {
        "phi3" => &crate::model::phi3::FUSED_LINEARS,
        "granitemoehybrid" => &crate::model::granitemoehybrid::FUSED_LINEARS,
        _ => &[],
    }
}

/// The LoRA keys of `block` with what each adapts, as mlx-lm names the
/// modules of that block: every linear layer and every experts' projection.
pub(crate) fn block_sites(model: &Model, block: &Block) -> Vec<(String, SiteKind)> {
    let fused = fused_linears(model);
    let split: Vec<&str> = fused
        .iter()
        .flat_map(|(_, parts)| parts.iter().copied())
        .collect();
    let family = model.args.model_type.as_str();
    let mut out: Vec<(String, SiteKind)> = BLOCK_LINEARS
        .iter()
        .filter(|k| !split.contains(k) && block_linear(block, k).is_some())
        .map(|k| (family_key(family, k), SiteKind::Linear))
        .collect();
    if let Some(mixer) = &block.linear_attn {
        let linears = mixer.linears();
        out.extend(
            linears
                .iter()
                .map(|(k, _)| (family_key(family, k), SiteKind::Linear)),
        );
    }
    if let FeedForward::Sparse(moe) = &block.mlp {
        if moe.router_is_linear && !BLOCK_LINEARS.contains(&moe.router_key) {
            out.push((moe.router_key.to_string(), SiteKind::Linear));
        }
        let shared = moe.shared_linears();
        out.extend(
            shared
                .iter()
                .filter(|(k, _)| !split.contains(&k.as_str()))
                .map(|(k, _)| (family_key(family, k), SiteKind::Linear)),
        );
    }
    for (key, parts) in fused {
        if parts.iter().all(|p| block_linear(block, p).is_some()) {
            out.push((key.to_string(), SiteKind::Fused(parts)));
        }
    }
    let experts_key = match &block.mlp {
        FeedForward::Sparse(moe) => Some(moe.experts_key.as_str()),
        FeedForward::Dense(_) => gemma4_text::experts(block).map(|_| gemma4_text::EXPERTS_KEY),
    };
    if let Some(experts_key) = experts_key {
        for (i, proj) in EXPERT_PROJS.iter().enumerate() {
            out.push((format!("{experts_key}.{proj}"), SiteKind::Experts(i)));
        }
    }
    let gemma4 = gemma4_text::extra_linears(block);
    out.extend(
        gemma4
            .iter()
            .map(|(k, _)| (k.to_string(), SiteKind::Linear)),
    );
    out
}

/// Projection `i` of the block's experts (a sparse MLP's, Gemma 4's beside
/// its dense one, or the `SwitchMlp`'s of a Nemotron-H experts layer `part`).
fn switch_linear(block: &Block, part: LayerPart, i: usize) -> Option<&SwitchLinear> {
    if let LayerPart::Mlp(j) = part {
        return stack_layer(block, j)?.switch_mlp()?.proj(i);
    }
    match &block.mlp {
        FeedForward::Sparse(moe) => moe.switch_mlp.proj(i),
        FeedForward::Dense(_) => gemma4_text::experts(block)?.proj(i),
    }
}

fn switch_linear_mut(block: &mut Block, part: LayerPart, i: usize) -> Option<&mut SwitchLinear> {
    if let LayerPart::Mlp(j) = part {
        return stack_layer_mut(block, j)?.switch_mlp_mut()?.proj_mut(i);
    }
    if matches!(block.mlp, FeedForward::Dense(_)) {
        return gemma4_text::experts_mut(block)?.proj_mut(i);
    }
    match &mut block.mlp {
        FeedForward::Sparse(moe) => moe.switch_mlp.proj_mut(i),
        FeedForward::Dense(_) => None,
    }
}

/// Every adapter a block holds, in a fixed order: the arrays a
/// checkpointed layer takes as inputs.
pub(crate) fn block_loras_mut(block: &mut Block) -> Vec<&mut Lora> {
    let Block {
        self_attn,
        mlp,
        linear_attn,
        residual,
        ..
    } = block;
    let mut out: Vec<&mut Lora> = vec![
        &mut self_attn.q_proj,
        &mut self_attn.k_proj,
        &mut self_attn.v_proj,
        &mut self_attn.o_proj,
    ]
    .into_iter()
    .filter_map(|l| l.lora.as_mut())
    .collect();
    out.extend(crate::model::deepseek_v3::latent_loras_mut(
        &mut self_attn.latent,
    ));
    match mlp {
        FeedForward::Dense(m) => out.extend(
            [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]
                .into_iter()
                .filter_map(|l| l.lora.as_mut()),
        ),
        FeedForward::Sparse(moe) => {
            let SparseMoe {
                gate,
                switch_mlp: s,
                shared,
                ..
            } = moe;
            out.extend(gate.lora.as_mut());
            out.extend(
                [&mut s.gate_proj, &mut s.up_proj, &mut s.down_proj]
                    .into_iter()
                    .filter_map(|l| l.lora.as_mut()),
            );
            // In `SparseMoe::shared_linears` order.
            if let Some(shared) = shared {
                let SharedExperts { mlp: m, gate, .. } = &mut **shared;
                out.extend(
                    [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]
                        .into_iter()
                        .chain(gate.as_mut())
                        .filter_map(|l| l.lora.as_mut()),
                );
            }
        }
    }
    if let Some(mixer) = linear_attn {
        let linears = mixer.linears_mut();
        out.extend(linears.into_iter().filter_map(|(_, l)| l.lora.as_mut()));
    }
    match residual {
        Residual::Stack(stack) => out.extend(stack_loras_mut(stack)),
        other => out.extend(gemma4_text::extra_loras_mut(other)),
    }
    out
}

fn stack_loras_mut(stack: &mut MlpStack) -> Vec<&mut Lora> {
    let mut out = Vec::new();
    for layer in stack.layers_mut() {
        match layer {
            StackLayer::Mlp(mlp) => out.extend(
                mlp.linears_mut()
                    .into_iter()
                    .filter_map(|(_, l)| l.lora.as_mut()),
            ),
            StackLayer::Experts(experts) => out.extend(experts.loras_mut()),
        }
    }
    out
}

/// Nemotron-H's stack of MLP layers around the block's mixer.
fn mlp_stack(block: &Block) -> Option<&MlpStack> {
    match &block.residual {
        Residual::Stack(stack) => Some(stack),
        _ => None,
    }
}

/// mlx-lm's `model.layers` as our blocks hold them: per layer, its block
/// and what part of it the layer is. One layer per block, but for
/// Nemotron-H, whose blocks hold the MLP layers around each mixer.
pub(crate) fn model_layers(model: &Model) -> Vec<(usize, LayerPart)> {
    let mut out = Vec::new();
    for (b, block) in model.decoder.layers.iter().enumerate() {
        let Some(stack) = mlp_stack(block) else {
            out.push((b, LayerPart::Block));
            continue;
        };
        let before = stack.before.len();
        out.extend((0..before).map(|i| (b, LayerPart::Mlp(i))));
        out.push((b, LayerPart::Mixer));
        out.extend((0..stack.after.len()).map(|i| (b, LayerPart::Mlp(before + i))));
    }
    out
}

/// The LoRA keys of one of mlx-lm's layers with what each adapts.
fn part_sites(model: &Model, block: &Block, part: LayerPart) -> Vec<(String, SiteKind)> {
    match part {
        LayerPart::Block => block_sites(model, block),
        // The block's own feed-forward slot is unused: only the mixer's linears.
        LayerPart::Mixer => block_sites(model, block)
            .into_iter()
            .filter(|(k, _)| k.starts_with("mixer."))
            .collect(),
        LayerPart::Mlp(i) => stack_layer(block, i).map_or_else(Vec::new, stack_layer_sites),
    }
}

/// A Nemotron-H MLP or experts layer's sites: the routed experts'
/// projections, then every linear layer.
fn stack_layer_sites(layer: &StackLayer) -> Vec<(String, SiteKind)> {
    let experts = layer.switch_mlp().map_or(0, |_| SWITCH_MLP_KEYS.len());
    let switch = SWITCH_MLP_KEYS[..experts]
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), SiteKind::Experts(i)));
    let linears = layer.linears().into_iter();
    switch
        .chain(linears.map(|(k, _)| (k.to_string(), SiteKind::Linear)))
        .collect()
}

fn stack_layer(block: &Block, i: usize) -> Option<&StackLayer> {
    mlp_stack(block)?.layers().nth(i)
}

fn stack_layer_mut(block: &mut Block, i: usize) -> Option<&mut StackLayer> {
    match &mut block.residual {
        Residual::Stack(stack) => stack.layers_mut().nth(i),
        _ => None,
    }
}

/// The adapters of a model: their sites, rank and scale.
#[derive(Clone, Debug)]
pub struct AdapterLayout {
    /// The adapted modules, in model order.
    pub sites: Vec<Site>,
    /// Rank of the low-rank matrices.
    pub rank: usize,
    /// Multiplier of the adapters' output.
    pub scale: f32,
    /// Dropout probability during training.
    pub dropout: f32,
}

impl AdapterLayout {
    /// Sites on the last `num_layers` of mlx-lm's layers (all of them when
    /// it is not positive, as mlx-lm does; see `model_layers`), for
    /// `params.keys` or, as mlx-lm, every linear layer and experts'
    /// projection of those layers.
    pub fn new(model: &Model, num_layers: i64, params: &LoraParameters) -> Result<Self> {
        let layers = model_layers(model);
        let total = layers.len();
        if num_layers > total as i64 {
            bail!("requested to adapt {num_layers} layers but the model only has {total}");
        }
        let first = if num_layers <= 0 {
            0
        } else {
            total - num_layers as usize
        };
        let blocks = &model.decoder.layers;
        if let Some(keys) = &params.keys {
            if keys.is_empty() {
                bail!("lora_parameters.keys is empty");
            }
            let mut known: Vec<String> = Vec::new();
            for &(b, part) in &layers {
                for (k, _) in part_sites(model, &blocks[b], part) {
                    if !known.contains(&k) {
                        known.push(k);
                    }
                }
            }
            for k in keys {
                if !known.contains(k) {
                    bail!(
                        "unsupported LoRA key {k:?} for this {} model (supported: {})",
                        model.args.model_type,
                        known.join(", ")
                    );
                }
            }
        }
        // Each block adapts the keys it has (a sparse layer has no dense MLP).
        let mut sites = Vec::new();
        for (layer, &(block, part)) in layers.iter().enumerate().skip(first) {
            for (key, kind) in part_sites(model, &blocks[block], part) {
                if params.keys.as_ref().is_none_or(|keys| keys.contains(&key)) {
                    sites.push(Site {
                        layer,
                        block,
                        part,
                        key,
                        kind,
                        layers_path: layers_path(model),
                    });
                }
            }
        }
        if let Some(keys) = &params.keys {
            for k in keys {
                if !sites.iter().any(|s| &s.key == k) {
                    bail!(
                        "LoRA key {k:?} names no layer among the last {} of this {} model",
                        total - first,
                        model.args.model_type
                    );
                }
            }
        }
        Ok(Self {
            sites,
            rank: params.rank,
            scale: params.scale,
            dropout: params.dropout,
        })
    }

    /// `(experts, in_features, out_features)` of each site's base module
    /// (`experts` is 1 for a linear layer).
    fn dims(&self, model: &Model) -> Vec<(Option<i32>, i32, i32)> {
        self.sites.iter().map(|s| site_dims(model, s)).collect()
    }

    /// Fresh adapters as mlx-lm makes them: `a ~ U(-1/sqrt(in), 1/sqrt(in))`,
    /// `b = 0`, drawn from `seed`. Returns the flat parameter list.
    pub(crate) fn init_params(&self, model: &Model, seed: u64) -> Result<Vec<Array>> {
        let mut key = random::key(seed)?;
        let mut params = Vec::with_capacity(2 * self.sites.len());
        for shape in self.shapes(model).chunks(2) {
            let (next, sub) = random::split(&key, 2)?;
            key = next;
            let inp = match shape[0].len() {
                3 => shape[0][2],
                _ => shape[0][0],
            };
            let bound = 1.0 / (inp as f32).sqrt();
            params.push(random::uniform::<_, f32>(
                -bound,
                bound,
                &shape[0][..],
                &sub,
            )?);
            params.push(Array::zeros::<f32>(&shape[1])?);
        }
        Ok(params)
    }

    /// Puts `params` (`[a0, b0, a1, b1, ...]`) into `model` as its adapters,
    /// for inference (no dropout).
    pub fn set_params(&self, model: &mut Model, params: &[Array]) -> Result<()> {
        self.put(model, params, 0.0)
    }

    /// Like `set_params`, with the layout's dropout active (training).
    pub fn set_training_params(&self, model: &mut Model, params: &[Array]) -> Result<()> {
        self.put(model, params, self.dropout)
    }

    fn put(&self, model: &mut Model, params: &[Array], dropout: f32) -> Result<()> {
        if params.len() != 2 * self.sites.len() {
            bail!(
                "expected {} adapter arrays, got {}",
                2 * self.sites.len(),
                params.len()
            );
        }
        let lora = |a: &Array, b: Array| Lora {
            a: a.clone(),
            b,
            scale: self.scale,
            dropout,
        };
        for (site, ab) in self.sites.iter().zip(params.chunks(2)) {
            let block = &mut model.decoder.layers[site.block];
            match site.kind {
                SiteKind::Linear => {
                    site_linear_mut(block, site.part, &site.key).lora =
                        Some(lora(&ab[0], ab[1].clone()))
                }
                SiteKind::Fused(parts) => {
                    let mut start = 0;
                    for part in parts {
                        let lin = linear_mut(block, part);
                        let end = start + lin.shape().0;
                        lin.lora = Some(lora(&ab[0], ab[1].index((.., start..end))));
                        start = end;
                    }
                }
                SiteKind::Experts(i) => {
                    let sw = switch_linear_mut(block, site.part, i)
                        .expect("sites come from block_sites");
                    sw.lora = Some(lora(&ab[0], ab[1].clone()));
                }
            }
        }
        Ok(())
    }

    /// The adapter arrays currently in `model`, in parameter order.
    pub fn params(&self, model: &Model) -> Result<Vec<Array>> {
        let mut out = Vec::with_capacity(2 * self.sites.len());
        for site in &self.sites {
            let block = &model.decoder.layers[site.block];
            let missing = || anyhow::anyhow!("{} has no adapter", site.path());
            match site.kind {
                SiteKind::Linear => {
                    let l = site_linear(block, site.part, &site.key);
                    let l = l.lora.as_ref().ok_or_else(missing)?;
                    out.extend([l.a.clone(), l.b.clone()]);
                }
                SiteKind::Fused(parts) => {
                    let loras = parts
                        .iter()
                        .map(|p| linear(block, p).lora.as_ref().ok_or_else(missing))
                        .collect::<Result<Vec<_>>>()?;
                    let bs: Vec<&Array> = loras.iter().map(|l| &l.b).collect();
                    out.extend([loras[0].a.clone(), concatenate(&bs, 1)?]);
                }
                SiteKind::Experts(i) => {
                    let l = switch_linear(block, site.part, i)
                        .and_then(|s| s.lora.as_ref())
                        .ok_or_else(missing)?;
                    out.extend([l.a.clone(), l.b.clone()]);
                }
            }
        }
        Ok(out)
    }

    /// The tensor names of the parameters, in order (`<path>.lora_a`, `<path>.lora_b`).
    pub fn names(&self) -> Vec<String> {
        self.sites
            .iter()
            .flat_map(|s| {
                let p = s.path();
                [format!("{p}.lora_a"), format!("{p}.lora_b")]
            })
            .collect()
    }

    /// Expected shape of each parameter, in order: `[in, r]`, `[r, out]` for
    /// a linear layer, `[experts, r, in]`, `[experts, out, r]` for experts.
    pub fn shapes(&self, model: &Model) -> Vec<Vec<i32>> {
        let r = self.rank as i32;
        self.dims(model)
            .into_iter()
            .flat_map(|(experts, inp, out)| match experts {
                None => [vec![inp, r], vec![r, out]],
                Some(e) => [vec![e, r, inp], vec![e, out, r]],
            })
            .collect()
    }

    /// Number of trainable scalars.
    pub(crate) fn num_params(&self, model: &Model) -> usize {
        self.shapes(model)
            .iter()
            .map(|s| s.iter().product::<i32>() as usize)
            .sum()
    }
}

/// `(experts, in_features, out_features)` of the site's base module
/// (`experts` is `None` for a linear layer).
pub(crate) fn site_dims(model: &Model, site: &Site) -> (Option<i32>, i32, i32) {
    let block = &model.decoder.layers[site.block];
    match site.kind {
        SiteKind::Linear => {
            let (out, inp) = site_linear(block, site.part, &site.key).shape();
            (None, inp, out)
        }
        SiteKind::Fused(parts) => {
            let inp = linear(block, parts[0]).shape().1;
            let out = parts.iter().map(|p| linear(block, p).shape().0).sum();
            (None, inp, out)
        }
        SiteKind::Experts(i) => {
            let (e, out, inp) = switch_linear(block, site.part, i)
                .expect("sites come from block_sites")
                .shape();
            (Some(e), inp, out)
        }
    }
}

fn linear<'a>(block: &'a Block, key: &str) -> &'a Linear {
    block_linear(block, key).expect("sites come from block_sites")
}

fn linear_mut<'a>(block: &'a mut Block, key: &str) -> &'a mut Linear {
    block_linear_mut(block, key).expect("sites come from block_sites")
}

/// The linear layer of a `SiteKind::Linear` site.
fn site_linear<'a>(block: &'a Block, part: LayerPart, key: &str) -> &'a Linear {
    let found = match part {
        LayerPart::Mlp(i) => stack_layer(block, i).and_then(|m| {
            m.linears()
                .into_iter()
                .find_map(|(k, l)| (k == key).then_some(l))
        }),
        LayerPart::Block | LayerPart::Mixer => block_linear(block, key),
    };
    found.expect("sites come from part_sites")
}

fn site_linear_mut<'a>(block: &'a mut Block, part: LayerPart, key: &str) -> &'a mut Linear {
    let found = match part {
        LayerPart::Mlp(i) => stack_layer_mut(block, i).and_then(|m| {
            m.linears_mut()
                .into_iter()
                .find_map(|(k, l)| (k == key).then_some(l))
        }),
        LayerPart::Block | LayerPart::Mixer => block_linear_mut(block, key),
    };
    found.expect("sites come from part_sites")
}
