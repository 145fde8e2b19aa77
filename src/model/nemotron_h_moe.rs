//! Nemotron-H's mixture-of-experts layers (`E` in `hybrid_override_pattern`,
//! mlx-lm's `NemotronHMoE`): a router (a bare weight matrix, never
//! quantized) whose sigmoid scores plus `e_score_correction_bias` pick
//! `num_experts_per_tok` ReLU² experts over `n_group` groups of experts
//! (see [`SigmoidGroupChoice`]), their outputs weighted by the unbiased
//! scores (renormalized when `norm_topk_prob`) times
//! `routed_scaling_factor`; plus a shared ReLU² MLP when `n_shared_experts`
//! is set. With `moe_latent_size` the experts run in a narrower space:
//! `fc1_latent_proj` before them, `fc2_latent_proj` after the weighted sum.
//! Hugging Face's per-expert `experts.{e}.up_proj` / `down_proj` are
//! stacked into `switch_mlp.fc1` / `fc2` as mlx-lm's `sanitize` does.

use std::collections::HashMap;

use anyhow::{bail, Result};
use mlx_rs::ops::expand_dims_axes;
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::layers::{Linear, Lora, RmsNorm};
use super::moe::{SigmoidGroupChoice, SwitchMlp};
use super::weights::{stack_expert_tensors, Weights};

/// The mixture-of-experts fields of a Nemotron-H `config.json`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ExpertsArgs {
    #[serde(default)]
    n_routed_experts: Option<i32>,
    #[serde(default)]
    num_experts_per_tok: Option<i32>,
    #[serde(default)]
    n_shared_experts: Option<i32>,
    #[serde(default)]
    n_group: Option<i32>,
    #[serde(default)]
    topk_group: Option<i32>,
    #[serde(default)]
    norm_topk_prob: Option<bool>,
    #[serde(default)]
    routed_scaling_factor: Option<f32>,
}

/// How every experts layer of a model routes its tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertRouting {
    /// The number of routed experts (`n_routed_experts`).
    pub experts: i32,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: i32,
    /// The groups the experts are split into (`n_group`).
    pub n_group: i32,
    /// The groups that keep their experts in the running (`topk_group`).
    pub topk_group: i32,
    /// Renormalize the chosen experts' weights (`norm_topk_prob`).
    pub normalize: bool,
    /// Multiplies the chosen experts' weights (`routed_scaling_factor`).
    pub scale: f32,
    /// Whether the layers have shared experts (`n_shared_experts` set).
    pub shared: bool,
}

fn required<T: Copy>(value: Option<T>, name: &str) -> Result<T> {
    value.ok_or_else(|| anyhow::anyhow!("the config has experts layers (E) but no {name}"))
}

impl ExpertsArgs {
    /// The routing the config describes, checked as usable.
    pub(crate) fn routing(&self) -> Result<ExpertRouting> {
        let routing = ExpertRouting {
            experts: required(self.n_routed_experts, "n_routed_experts")?,
            top_k: required(self.num_experts_per_tok, "num_experts_per_tok")?,
            n_group: required(self.n_group, "n_group")?,
            topk_group: required(self.topk_group, "topk_group")?,
            normalize: self.norm_topk_prob.unwrap_or(false),
            scale: required(self.routed_scaling_factor, "routed_scaling_factor")?,
            shared: self.n_shared_experts.is_some(),
        };
        routing.check()?;
        Ok(routing)
    }
}

impl ExpertRouting {
    fn check(&self) -> Result<()> {
        let (experts, groups, k) = (self.experts, self.n_group, self.top_k);
        if k < 1 || k > experts {
            bail!("num_experts_per_tok ({k}) must be between 1 and n_routed_experts ({experts})");
        }
        if groups < 1 || experts % groups != 0 {
            bail!("n_group ({groups}) must divide n_routed_experts ({experts})");
        }
        if groups > 1 {
            if !(1..=groups).contains(&self.topk_group) {
                bail!(
                    "topk_group ({}) must be between 1 and n_group ({groups})",
                    self.topk_group
                );
            }
            if experts / groups < 2 {
                bail!("each of the n_group groups needs at least 2 experts");
            }
        }
        Ok(())
    }
}

/// `down(relu(up(x))²)`.
pub(crate) fn relu_squared(up: &Linear, down: &Linear, x: &Array) -> Result<Array> {
    let up = up.forward(x)?;
    let zero = Array::from_f32(0.0).as_dtype(up.dtype())?;
    let positive = mlx_rs::ops::maximum(&up, &zero)?;
    down.forward(&(&positive * &positive))
}

/// A pair of linear layers run as `second(relu(first(x))²)` (the shared
/// experts) or one after the other around the experts (the latent
/// projections).
#[derive(Clone)]
pub struct LinearPair {
    /// Applied first (`up_proj`, `fc1_latent_proj`).
    pub first: Linear,
    /// Applied last (`down_proj`, `fc2_latent_proj`).
    pub second: Linear,
}

/// One `E` layer: `h + moe(norm(h))`.
#[derive(Clone)]
pub struct ExpertsLayer {
    /// The RMS norm before the experts.
    pub norm: RmsNorm,
    /// The router's weight `[experts, hidden]`.
    pub router: Array,
    /// Added to the routing scores before the experts are picked (float32).
    pub score_bias: Array,
    /// The routed experts.
    pub switch_mlp: SwitchMlp,
    /// The shared experts' `up_proj` and `down_proj`.
    pub shared_experts: Option<LinearPair>,
    /// `fc1_latent_proj` and `fc2_latent_proj` (with `moe_latent_size`).
    pub latent: Option<LinearPair>,
    /// How tokens are routed.
    pub routing: ExpertRouting,
    /// Sums the output across ranks when the experts are split.
    pub all_sum: Option<crate::collective::Group>,
}

impl ExpertsLayer {
    /// Loads the experts layer `{prefix}.mixer` with its norm.
    pub(crate) fn load(
        w: &mut Weights,
        prefix: &str,
        norm: RmsNorm,
        routing: ExpertRouting,
    ) -> Result<Self> {
        let mixer = format!("{prefix}.mixer");
        let gate = format!("{mixer}.gate");
        if w.contains(&format!("{gate}.scales")) {
            bail!("{gate} is quantized; mlx-lm keeps Nemotron-H's router dense");
        }
        let router = w.take(&format!("{gate}.weight"))?;
        let score_bias = w
            .take(&format!("{gate}.e_score_correction_bias"))?
            .as_dtype(Dtype::Float32)?;
        stack_hugging_face_experts(w.tensors_mut(), &mixer, routing.experts)?;
        let switch_mlp = SwitchMlp::load(w, &format!("{mixer}.switch_mlp"), routing.experts)?;
        let shared_experts = match routing.shared {
            true => Some(pair(
                w,
                &format!("{mixer}.shared_experts"),
                "up_proj",
                "down_proj",
            )?),
            false => None,
        };
        let latent = match w.contains(&format!("{mixer}.fc1_latent_proj.weight")) {
            true => Some(pair(w, &mixer, "fc1_latent_proj", "fc2_latent_proj")?),
            false => None,
        };
        Ok(Self {
            norm,
            router,
            score_bias,
            switch_mlp,
            shared_experts,
            latent,
            routing,
            all_sum: None,
        })
    }

    /// Its linear layers by their path inside its layer, as mlx-lm names
    /// them (the LoRA sites): the shared experts', then the latent
    /// projections.
    pub(crate) fn linears(&self) -> Vec<(&'static str, &Linear)> {
        let mut out = Vec::new();
        if let Some(shared) = &self.shared_experts {
            out.push(("mixer.shared_experts.up_proj", &shared.first));
            out.push(("mixer.shared_experts.down_proj", &shared.second));
        }
        if let Some(latent) = &self.latent {
            out.push(("mixer.fc1_latent_proj", &latent.first));
            out.push(("mixer.fc2_latent_proj", &latent.second));
        }
        out
    }

    /// `linears`, mutable, in the same order.
    pub(crate) fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = Vec::new();
        if let Some(shared) = &mut self.shared_experts {
            out.push(("mixer.shared_experts.up_proj", &mut shared.first));
            out.push(("mixer.shared_experts.down_proj", &mut shared.second));
        }
        if let Some(latent) = &mut self.latent {
            out.push(("mixer.fc1_latent_proj", &mut latent.first));
            out.push(("mixer.fc2_latent_proj", &mut latent.second));
        }
        out
    }

    /// Every adapter the layer holds: the routed experts', then those of
    /// `linears`.
    pub(crate) fn loras_mut(&mut self) -> Vec<&mut Lora> {
        let Self {
            switch_mlp,
            shared_experts,
            latent,
            ..
        } = self;
        let switch = [&mut switch_mlp.fc1.lora, &mut switch_mlp.fc2.lora];
        let pairs = shared_experts.iter_mut().chain(latent.iter_mut());
        let linears = pairs.flat_map(|p| [&mut p.first.lora, &mut p.second.lora]);
        switch
            .into_iter()
            .chain(linears)
            .filter_map(Option::as_mut)
            .collect()
    }

    /// The layer's output: `h` plus the experts of its norm.
    pub fn forward(&self, h: &Array) -> Result<Array> {
        Ok(h + &self.experts(&self.norm.forward(h)?)?)
    }

    /// The routed experts' weighted sum plus the shared experts, for `x`.
    fn experts(&self, x: &Array) -> Result<Array> {
        let (inds, scores) = self.choose(x)?;
        let routed_input = match &self.latent {
            Some(latent) => latent.first.forward(x)?,
            None => x.clone(),
        };
        let y = self.switch_mlp.forward(&routed_input, &inds)?;
        let weighted = &y * &expand_dims_axes(&scores, &[-1])?;
        let mut out = weighted.sum_axis(-2, false)?.as_dtype(y.dtype())?;
        if let Some(latent) = &self.latent {
            out = latent.second.forward(&out)?;
        }
        if let Some(shared) = &self.shared_experts {
            out = &out + &relu_squared(&shared.first, &shared.second, x)?;
        }
        match &self.all_sum {
            Some(group) => group.all_sum(&out),
            None => Ok(out),
        }
    }

    /// The chosen experts `[.., top_k]` and their weights for `x`.
    fn choose(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = x.matmul(self.router.swap_axes(-1, -2)?)?;
        let r = &self.routing;
        SigmoidGroupChoice {
            top_k: r.top_k,
            n_group: r.n_group,
            topk_group: r.topk_group,
            normalize: r.normalize,
            norm_epsilon: 1e-20,
            score_bias: Some(&self.score_bias),
            scale: r.scale,
        }
        .choose(&logits)
    }
}

fn pair(w: &mut Weights, prefix: &str, first: &str, second: &str) -> Result<LinearPair> {
    Ok(LinearPair {
        first: Linear::load(w, &format!("{prefix}.{first}"))?,
        second: Linear::load(w, &format!("{prefix}.{second}"))?,
    })
}

/// Stacks Hugging Face's per-expert `{mixer}.experts.{e}.up_proj` and
/// `down_proj` into `{mixer}.switch_mlp.fc1` and `fc2`; a no-op for
/// checkpoints already stacked.
pub(crate) fn stack_hugging_face_experts(
    tensors: &mut HashMap<String, Array>,
    mixer: &str,
    experts: i32,
) -> Result<()> {
    for (hf_name, name) in [("up_proj", "fc1"), ("down_proj", "fc2")] {
        stack_expert_tensors(
            tensors,
            &format!("{mixer}.experts"),
            hf_name,
            &format!("{mixer}.switch_mlp.{name}"),
            experts,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: serde_json::Value) -> ExpertsArgs {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn routing_needs_its_fields_and_consistent_groups() {
        let ok = serde_json::json!({
            "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4,
            "topk_group": 2, "routed_scaling_factor": 2.5, "n_shared_experts": 1,
        });
        let routing = args(ok.clone()).routing().unwrap();
        assert_eq!((routing.experts, routing.top_k), (8, 2));
        assert!(routing.shared && !routing.normalize);
        let mut missing = ok.clone();
        missing
            .as_object_mut()
            .unwrap()
            .remove("routed_scaling_factor");
        let err = args(missing).routing().unwrap_err().to_string();
        assert!(err.contains("routed_scaling_factor"), "{err}");
        let mut bad = ok.clone();
        bad["n_group"] = 3.into();
        assert!(args(bad).routing().is_err());
        let mut bad = ok;
        bad["num_experts_per_tok"] = 9.into();
        assert!(args(bad).routing().is_err());
    }
}
