//! Phi-3, Phi-3.5 and Phi-4 (`model_type: phi3`): the LLaMA layer with
//! fused `qkv_proj` and `gate_up_proj`, split into the shared attention and
//! MLP at load (so batching and the quantized cache work as for LLaMA; LoRA
//! still adapts the fused projections, as mlx-lm does: see `FUSED_LINEARS`),
//! partial rotary embeddings, and su/longrope scaling: frequencies
//! times `long_factor` and rotated features times
//! `sqrt(1 + ln(max / original) / ln(original))`, as mlx-lm applies them.

use anyhow::{bail, Result};
use mlx_rs::ops::{arange, power};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{
    Activation, Attention, Block, Decoder, DecoderOptions, FeedForward, LogitsMap, Mlp, Residual,
};
use super::layers::{Embedding, Linear, RmsNorm, Rope};
use super::weights::Weights;

/// The fused projections of a Phi-3 block (mlx-lm's module names, which its
/// LoRA adapters carry) and the layers the loader split each into, in row
/// order. One adapter on a fused projection is one `a` shared by the parts
/// and a `b` whose columns are split among them.
pub(crate) const FUSED_LINEARS: [(&str, &[&str]); 2] = [
    (
        "self_attn.qkv_proj",
        &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    ),
    ("mlp.gate_up_proj", &["mlp.gate_proj", "mlp.up_proj"]),
];

/// The Phi-3 fields of `config.json`, with mlx-lm's defaults.
#[derive(Debug, Deserialize)]
pub(crate) struct Phi3Args {
    #[serde(default = "one")]
    pub partial_rotary_factor: f32,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_original_max_positions")]
    pub original_max_position_embeddings: usize,
    #[serde(default)]
    pub rope_scaling: Option<Phi3RopeScaling>,
}

/// `rope_scaling` of a Phi-3 checkpoint.
#[derive(Debug, Deserialize)]
pub(crate) struct Phi3RopeScaling {
    #[serde(rename = "type", alias = "rope_type")]
    pub kind: String,
    #[serde(default)]
    pub long_factor: Option<Factors>,
    #[serde(default)]
    pub factor: Option<f32>,
}

/// One factor for every frequency, or one each.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Factors {
    One(f32),
    Each(Vec<f32>),
}

fn one() -> f32 {
    1.0
}

fn default_max_positions() -> usize {
    131_072
}

fn default_original_max_positions() -> usize {
    4096
}

impl Phi3Args {
    fn rope(&self, head_dim: i32, args: &ModelArgs) -> Result<Rope> {
        let dims = (head_dim as f32 * self.partial_rotary_factor) as i32;
        if dims < 2 || dims % 2 != 0 || dims > head_dim {
            bail!("partial_rotary_factor {} gives {dims} rotary dims of head_dim {head_dim}; they must be even and at most head_dim", self.partial_rotary_factor);
        }
        let base = args.rope_base();
        let mut rope = Rope::new(dims, args.rope_traditional, base, None)?;
        let Some(scaling) = &self.rope_scaling else {
            return Ok(rope);
        };
        match scaling.kind.as_str() {
            "su" | "longrope" => {
                let Some(long) = &scaling.long_factor else {
                    bail!(
                        "rope_scaling.long_factor is required for {:?}",
                        scaling.kind
                    );
                };
                let long = match long {
                    Factors::One(f) => Array::from_f32(*f),
                    Factors::Each(v) if v.len() as i32 == dims / 2 => {
                        Array::from_slice(v, &[dims / 2])
                    }
                    Factors::Each(v) => bail!(
                        "rope_scaling.long_factor has {} entries; {dims} rotary dims need {}",
                        v.len(),
                        dims / 2
                    ),
                };
                let exponents = &arange::<_, f32>(0, dims, 2)? / &Array::from_f32(dims as f32);
                let freqs = power(Array::from_f32(base), &exponents)?;
                rope.freqs = Some(&long * &freqs);
                let orig = self.original_max_position_embeddings as f64;
                let factor = self.max_position_embeddings as f64 / orig;
                if factor > 1.0 {
                    rope.mscale = (1.0 + factor.ln() / orig.ln()).sqrt() as f32;
                }
            }
            "linear" => match scaling.factor {
                Some(f) if f > 0.0 => rope.scale = 1.0 / f,
                _ => bail!("rope_scaling.factor must be a positive number for linear scaling"),
            },
            other => {
                // mlx-lm warns and runs without scaling.
                tracing::warn!("rope_scaling type {other:?} is not supported by Phi-3; ignored");
            }
        }
        Ok(rope)
    }
}

fn block(w: &mut Weights, p: &str, args: &ModelArgs, rope: &Rope) -> Result<Block> {
    let (heads, kv_heads) = (args.num_attention_heads, args.kv_heads());
    let head_dim = args.hidden_size / heads;
    let qkv = Linear::load(w, &format!("{p}.self_attn.qkv_proj"))?;
    let [q_proj, k_proj, v_proj]: [Linear; 3] = qkv
        .split_rows(&[heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])?
        .try_into()
        .map_err(|_| anyhow::anyhow!("qkv_proj split"))?;
    let gate_up = Linear::load(w, &format!("{p}.mlp.gate_up_proj"))?;
    let inter = args.intermediate_size;
    let [gate_proj, up_proj]: [Linear; 2] = gate_up
        .split_rows(&[inter, inter])?
        .try_into()
        .map_err(|_| anyhow::anyhow!("gate_up_proj split"))?;
    let eps = args.rms_norm_eps;
    Ok(Block {
        self_attn: Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj: Linear::load(w, &format!("{p}.self_attn.o_proj"))?,
            q_norm: None,
            k_norm: None,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
            rope: Some(rope.clone()),
            logit_softcap: None,
            sinks: None,
            qk_norm_span: Default::default(),
            query_scaling: None,
            output_gate: false,
            latent: None,
        },
        mlp: FeedForward::Dense(Mlp {
            gate_proj,
            up_proj,
            down_proj: Linear::load(w, &format!("{p}.mlp.down_proj"))?,
            activation: Activation::Silu,
        }),
        input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), eps)?,
        post_attention_layernorm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), eps)?,
        residual: Residual::PreNorm,
        linear_attn: None,
        compiled: Default::default(),
    })
}

/// Loads a Phi-3 decoder (fused projections split, su/longrope RoPE) from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Phi3Args = family_args(raw)?;
    let rope = extra.rope(args.hidden_size / args.num_attention_heads, args)?;
    let layers = (0..args.num_hidden_layers)
        .map(|i| block(w, &format!("model.layers.{i}"), args, &rope))
        .collect::<Result<Vec<_>>>()?;
    let lm_head = if w.contains("lm_head.weight") {
        Some(Linear::load(w, "lm_head")?)
    } else {
        None
    };
    Ok(Decoder {
        embed_tokens: Embedding::load(w, "model.embed_tokens")?,
        layers,
        norm: RmsNorm::load(w, "model.norm", args.rms_norm_eps)?,
        lm_head,
        options: DecoderOptions::default(),
        embed_scale: None,
        logits_map: LogitsMap::Identity,
        pipeline: None,
    })
}
