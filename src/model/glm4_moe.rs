//! GLM-4.5 / 4.6 / 4.7 (`glm4_moe`): attention with q/k/v biases, optional
//! per-head q/k RMS norm (`use_qk_norm`) and partial rotary embeddings
//! (`partial_rotary_factor` of each head, RoPE without scaling); the first
//! `first_k_dense_replace` layers keep a dense MLP, the others a sparse MoE
//! routed by sigmoid scores with a correction bias over groups of experts
//! (`noaux_tc`, see `Routing::SigmoidGroups`), scaled by
//! `routed_scaling_factor`, plus `n_shared_experts` experts' worth of shared
//! dense MLP. As mlx-lm's `sanitize`, the multi-token-prediction layer
//! (`model.layers.{num_hidden_layers}`) is dropped.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp};
use super::layers::Rope;
use super::moe::{ExpertActivation, GroupedSigmoidMoe, MoeLayout, SparseMoe};
use super::weights::Weights;

/// The GLM-4.5 fields of `config.json` (required as in mlx-lm).
#[derive(Debug, Deserialize)]
pub(crate) struct Glm4MoeArgs {
    pub n_routed_experts: Option<i32>,
    pub n_shared_experts: Option<i32>,
    pub num_experts_per_tok: i32,
    pub first_k_dense_replace: usize,
    pub n_group: i32,
    pub topk_group: i32,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    pub partial_rotary_factor: f64,
    pub use_qk_norm: bool,
    #[serde(default = "default_scoring")]
    pub scoring_func: String,
    #[serde(default = "default_topk_method")]
    pub topk_method: String,
}

fn default_scoring() -> String {
    "sigmoid".into()
}

fn default_topk_method() -> String {
    "noaux_tc".into()
}

pub(crate) const LAYOUT: MoeLayout = MoeLayout {
    router: "gate",
    experts: "switch_mlp",
    hf_names: ["gate_proj", "up_proj", "down_proj"],
    router_key: "mlp.gate",
    activation: ExpertActivation::SwiGlu,
};

impl Glm4MoeArgs {
    fn check(&self) -> Result<()> {
        if self.topk_method != "noaux_tc" || self.scoring_func != "sigmoid" {
            bail!(
                "topk_method {:?} with scoring_func {:?} is not supported (only noaux_tc, sigmoid)",
                self.topk_method,
                self.scoring_func
            );
        }
        if let Some(experts) = self.n_routed_experts {
            let groups = self.n_group;
            if groups < 1 || experts % groups != 0 {
                bail!("n_group ({groups}) must divide n_routed_experts ({experts})");
            }
            if groups > 1 && !(1..=groups).contains(&self.topk_group) {
                bail!(
                    "topk_group ({}) must be between 1 and n_group ({groups})",
                    self.topk_group
                );
            }
            if groups > 1 && experts / groups < 2 {
                bail!("each of the n_group groups needs at least 2 experts");
            }
        }
        if !(self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0) {
            bail!(
                "partial_rotary_factor must be in (0, 1], got {}",
                self.partial_rotary_factor
            );
        }
        Ok(())
    }
}

fn sparse_layer(
    w: &mut Weights,
    prefix: &str,
    extra: &Glm4MoeArgs,
    experts: i32,
) -> Result<SparseMoe> {
    GroupedSigmoidMoe {
        family: "GLM-4.5",
        experts,
        top_k: extra.num_experts_per_tok,
        n_group: extra.n_group,
        topk_group: extra.topk_group,
        normalize: extra.norm_topk_prob,
        routed_scale: extra.routed_scaling_factor,
        shared_experts: extra.n_shared_experts.is_some(),
        layout: LAYOUT,
    }
    .load(w, prefix)
}

/// Loads a GLM-4.5 (`glm4_moe`) decoder, dropping the multi-token-prediction
/// layer, from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Glm4MoeArgs = family_args(raw)?;
    extra.check()?;
    let n = args.num_hidden_layers as usize;
    let mtp = format!("model.layers.{n}.");
    for name in w.remaining() {
        if name.starts_with(&mtp) {
            w.take(&name)?;
        }
    }
    let head_dim = args.head_dim();
    let rotary = (head_dim as f64 * extra.partial_rotary_factor) as i32;
    let options = DecoderOptions {
        qk_norm: extra.use_qk_norm,
        layer_windows: Vec::new(),
    };
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut self_attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            self_attn.rope = Some(Rope::new(rotary, false, args.rope_base(), None)?);
            let mlp = match extra.n_routed_experts {
                Some(experts) if i >= extra.first_k_dense_replace => {
                    FeedForward::Sparse(sparse_layer(w, &format!("{p}.mlp"), &extra, experts)?)
                }
                _ => FeedForward::Dense(Mlp::load(w, &format!("{p}.mlp"))?),
            };
            Block::pre_norm(w, &p, args.rms_norm_eps, self_attn, mlp)
        })
        .collect::<Result<Vec<_>>>()?;
    let decoder = Decoder::assemble(w, args, layers, options)?;
    if decoder.lm_head.is_none() {
        bail!("missing tensor \"lm_head.weight\": GLM-4.5 models have an untied output head");
    }
    Ok(decoder)
}
