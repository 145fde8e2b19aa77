//! Sparse Mixture-of-Experts feed-forward, shared by Qwen3-MoE, Mixtral,
//! GPT-OSS, GLM-4.5 and the hybrid Qwen families:
//! a router picks `top_k` experts per token, each expert is a SwiGLU MLP
//! whose weights are stacked `[experts, out, in]` (dense, or quantized
//! per expert in any MLX mode) and run through `gather_mm` / `gather_qmm`, so only
//! the chosen experts' rows are read. As mlx-lm's `SwitchGLU`, tokens are
//! sorted by expert when there are 64 or more (token, expert) pairs.
//! Nemotron-H's experts are ReLU² MLPs instead ([`SwitchMlp`], mlx-lm's
//! `SwitchMLP`), routed as GLM-4.5's ([`SigmoidGroupChoice`]).

use std::collections::HashMap;

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::topk_axis;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::ops::{
    argpartition_axis, argsort_axis, clip, expand_dims_axes, gather_mm, maximum, minimum, sigmoid,
    softmax_axis, unflatten,
};
use mlx_rs::{stop_gradient, Array, Dtype};

use super::decoder::Mlp;
use super::layers::{Linear, LinearWeight, Lora};
use super::weights::{stack_expert_tensors, Weights};
use crate::quant::QuantSpec;

/// The weights of one projection for every expert.
#[derive(Clone)]
pub enum SwitchWeight {
    /// `[experts, out, in]`.
    Dense(Array),
    /// Packed `[experts, out, in * bits / 32]` with its scales (and biases
    /// in affine mode).
    Quantized {
        /// The packed quantized values, `uint32`.
        weight: Array,
        /// One scale per group of `spec.group_size` inputs, per expert and row.
        scales: Array,
        /// One bias per group (affine mode); `None` in the `mxfp4`, `nvfp4` and `mxfp8` modes.
        biases: Option<Array>,
        /// Bits, group size and mode of the quantization.
        spec: QuantSpec,
    },
}

/// One projection of every expert (mlx-lm's `SwitchLinear`), run only on
/// the experts each token is routed to.
#[derive(Clone)]
pub struct SwitchLinear {
    /// The stacked weights, dense or quantized.
    pub weight: SwitchWeight,
    /// `[experts, out]` (GPT-OSS).
    pub bias: Option<Array>,
    /// Per-expert low-rank adapters (mlx-lm's `LoRASwitchLinear`):
    /// `a` `[experts, r, in]`, `b` `[experts, out, r]`.
    pub lora: Option<Lora>,
}

impl SwitchLinear {
    pub(crate) fn load(w: &mut Weights, prefix: &str, experts: i32) -> Result<Self> {
        let name = format!("{prefix}.weight");
        let spec = w.quant_spec(prefix)?;
        let weight = w.take(&name)?;
        w.count_init_draws(1 + usize::from(spec.is_some()));
        if weight.ndim() != 3 || weight.shape()[0] != experts {
            bail!(
                "tensor {name:?} has shape {:?}; the experts' weights are stacked [{experts}, out, in]",
                weight.shape()
            );
        }
        let weight = match spec {
            Some(spec) => {
                let (scales, biases) = w.take_quant_params(prefix, spec)?;
                SwitchWeight::Quantized {
                    weight,
                    scales,
                    biases,
                    spec,
                }
            }
            None => SwitchWeight::Dense(weight),
        };
        let bias = w.take_opt(&format!("{prefix}.bias"))?;
        Ok(Self {
            weight,
            bias,
            lora: None,
        })
    }

    /// `(experts, out, in)`.
    pub fn shape(&self) -> (i32, i32, i32) {
        match &self.weight {
            SwitchWeight::Dense(w) => (w.shape()[0], w.shape()[1], w.shape()[2]),
            SwitchWeight::Quantized { weight, spec, .. } => (
                weight.shape()[0],
                weight.shape()[1],
                weight.shape()[2] * 32 / spec.bits,
            ),
        }
    }

    /// `x` `[..., 1, in]` through the experts `indices` picks.
    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let y = match &self.weight {
            SwitchWeight::Dense(w) => gather_mm(x, w.swap_axes(-1, -2)?, None, indices, sorted)?,
            SwitchWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => crate::quant::gather_qmm(
                x,
                weight,
                scales,
                biases.as_ref(),
                indices,
                sorted,
                *spec,
            )?,
        };
        let y = match &self.bias {
            Some(b) => &y + &expand_dims_axes(&b.take_axis(indices, 0)?, &[-2])?,
            None => y,
        };
        match &self.lora {
            Some(lora) => Ok(&y + &(&expert_lora(lora, x, indices, sorted)? * lora.scale)),
            None => Ok(y),
        }
    }
}

/// The chosen experts' low-rank term `(dropout(x) · aᵀ) · bᵀ`, before scaling.
fn expert_lora(lora: &Lora, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
    let x = if lora.dropout > 0.0 {
        let keep = 1.0 - lora.dropout;
        let mask = mlx_rs::random::bernoulli(&Array::from_f32(keep), x.shape(), None)?;
        &(x * &mask) / keep
    } else {
        x.clone()
    };
    let z = gather_mm(&x, lora.a.swap_axes(-1, -2)?, None, indices, sorted)?;
    Ok(gather_mm(
        &z,
        lora.b.swap_axes(-1, -2)?,
        None,
        indices,
        sorted,
    )?)
}

/// The experts' gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    SwiGlu,
    /// GPT-OSS: gate clipped above at 7, up clipped to ±7,
    /// `(up + 1) * gate * sigmoid(1.702 * gate)`.
    SwiGluOai,
    /// Gemma 4: `gelu_approx(gate) * up`.
    GeluApprox,
}

impl ExpertActivation {
    fn apply(self, gate: &Array, up: &Array) -> Result<Array> {
        Ok(match self {
            ExpertActivation::SwiGlu => &(gate * &sigmoid(gate)?) * up,
            ExpertActivation::GeluApprox => &super::gemma2::gelu_approx(gate)? * up,
            ExpertActivation::SwiGluOai => {
                let limit = Array::from_f32(7.0);
                let gate = minimum(gate, &limit)?;
                let up = clip(up, (-7.0f32, 7.0f32))?;
                let glu = &gate * &sigmoid(&(&Array::from_f32(1.702) * &gate))?;
                &(&up + &Array::from_f32(1.0)) * &glu
            }
        })
    }
}

/// The experts' projections in `SwitchGlu::proj` order (their LoRA key suffixes).
pub const EXPERT_PROJS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// The experts' SwiGLU: `down(silu(gate(x)) * up(x))` per chosen expert.
#[derive(Clone)]
pub struct SwitchGlu {
    /// The experts' gate projections.
    pub gate_proj: SwitchLinear,
    /// The experts' up projections.
    pub up_proj: SwitchLinear,
    /// The experts' down projections.
    pub down_proj: SwitchLinear,
    /// How the gate and up outputs combine.
    pub activation: ExpertActivation,
}

impl SwitchGlu {
    /// Projection `i` of `EXPERT_PROJS`.
    pub(crate) fn proj(&self, i: usize) -> Option<&SwitchLinear> {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
            .get(i)
            .copied()
    }

    pub(crate) fn proj_mut(&mut self, i: usize) -> Option<&mut SwitchLinear> {
        match i {
            0 => Some(&mut self.gate_proj),
            1 => Some(&mut self.up_proj),
            2 => Some(&mut self.down_proj),
            _ => None,
        }
    }

    /// `x` `[..., hidden]`, `indices` `[..., k]` → `[..., k, hidden]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        through_chosen_experts(x, indices, |x, idx, sorted| {
            let up = self.up_proj.forward(x, idx, sorted)?;
            let gate = self.gate_proj.forward(x, idx, sorted)?;
            let act = self.activation.apply(&gate, &up)?;
            self.down_proj.forward(&act, idx, sorted)
        })
    }
}

/// Runs `experts` (given the tokens `[..., 1, 1, hidden]`, the expert
/// indices and whether they are sorted) on `x` `[..., hidden]` routed by
/// `indices` `[..., k]`, giving `[..., k, hidden]`. As mlx-lm's switch
/// layers, the (token, expert) pairs are sorted by expert first when there
/// are 64 or more.
fn through_chosen_experts(
    x: &Array,
    indices: &Array,
    experts: impl Fn(&Array, &Array, bool) -> Result<Array>,
) -> Result<Array> {
    let x = expand_dims_axes(x, &[-2, -3])?;
    let indices = stop_gradient(indices)?;
    let sort = indices.size() >= 64;
    if !sort {
        return Ok(experts(&x, &indices, false)?.squeeze_axes(&[-2])?);
    }
    let k = indices.shape()[indices.ndim() - 1];
    let flat = indices.flatten(None, None)?;
    let order = argsort_axis(&flat, 0)?;
    let inverse = argsort_axis(&order, 0)?;
    let tokens = order.floor_divide(Array::from_int(k))?;
    let x = x.flatten(0, -3)?.take_axis(&tokens, 0)?;
    let y = experts(&x, &flat.take_axis(&order, 0)?, true)?;
    let mut shape = indices.shape().to_vec();
    shape.extend_from_slice(&y.shape()[1..]);
    let y = y.take_axis(&inverse, 0)?.reshape(&shape)?;
    Ok(y.squeeze_axes(&[-2])?)
}

/// The experts' ReLU² MLP (mlx-lm's `SwitchMLP` with `nn.ReLU2`):
/// `fc2(relu(fc1(x))²)` per chosen expert (Nemotron-H).
#[derive(Clone)]
pub struct SwitchMlp {
    /// The experts' input projections.
    pub fc1: SwitchLinear,
    /// The experts' output projections.
    pub fc2: SwitchLinear,
}

/// The paths of `SwitchMlp`'s projections inside a Nemotron-H layer, in
/// `SwitchMlp::proj` order (their LoRA keys).
pub const SWITCH_MLP_KEYS: [&str; 2] = ["mixer.switch_mlp.fc1", "mixer.switch_mlp.fc2"];

impl SwitchMlp {
    /// Projection `i`: `fc1`, then `fc2`.
    pub(crate) fn proj(&self, i: usize) -> Option<&SwitchLinear> {
        [&self.fc1, &self.fc2].get(i).copied()
    }

    /// `proj`, mutable.
    pub(crate) fn proj_mut(&mut self, i: usize) -> Option<&mut SwitchLinear> {
        match i {
            0 => Some(&mut self.fc1),
            1 => Some(&mut self.fc2),
            _ => None,
        }
    }

    /// Loads `{prefix}.fc1` and `{prefix}.fc2`, stacked over `experts`.
    pub(crate) fn load(w: &mut Weights, prefix: &str, experts: i32) -> Result<Self> {
        Ok(Self {
            fc1: SwitchLinear::load(w, &format!("{prefix}.fc1"), experts)?,
            fc2: SwitchLinear::load(w, &format!("{prefix}.fc2"), experts)?,
        })
    }

    /// `x` `[..., in]`, `indices` `[..., k]` → `[..., k, in]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        through_chosen_experts(x, indices, |x, idx, sorted| {
            let up = self.fc1.forward(x, idx, sorted)?;
            let zero = Array::from_f32(0.0).as_dtype(up.dtype())?;
            let positive = maximum(&up, &zero)?;
            self.fc2.forward(&(&positive * &positive), idx, sorted)
        })
    }
}

/// `Routing::SigmoidGroups`'s choice of experts: sigmoid scores in float32
/// plus `score_bias` pick the `top_k` experts (after zeroing all but the
/// `topk_group` groups of experts whose two best scores sum highest), the
/// unbiased scores weight them, renormalized when `normalize` and
/// `top_k > 1` (with `norm_epsilon` added to the sum), then scaled by
/// `scale`.
pub(crate) struct SigmoidGroupChoice<'a> {
    pub top_k: i32,
    pub n_group: i32,
    pub topk_group: i32,
    pub normalize: bool,
    pub norm_epsilon: f32,
    pub score_bias: Option<&'a Array>,
    pub scale: f32,
}

impl SigmoidGroupChoice<'_> {
    /// The chosen experts `[.., top_k]` and their weights (float32) for the
    /// router logits `[.., experts]`.
    pub(crate) fn choose(&self, logits: &Array) -> Result<(Array, Array)> {
        let k = self.top_k;
        let probs = sigmoid(&logits.as_dtype(mlx_rs::Dtype::Float32)?)?;
        let mut scores = match self.score_bias {
            Some(bias) => &probs + bias,
            None => probs.clone(),
        };
        if self.n_group > 1 {
            scores = self.drop_weak_groups(&scores)?;
        }
        let inds = argpartition_axis(&(-&scores), k - 1, -1)?.index((Ellipsis, ..k));
        let inds = stop_gradient(&inds)?;
        let mut weights = probs.take_along_axis(&inds, -1)?;
        if k > 1 && self.normalize {
            let mut sum = weights.sum_axis(-1, true)?;
            if self.norm_epsilon != 0.0 {
                sum = &sum + &Array::from_f32(self.norm_epsilon);
            }
            weights = &weights / &sum;
        }
        let scale = Array::from_f32(self.scale);
        Ok((inds, &weights * &scale))
    }

    /// `scores` with every expert of the `n_group - topk_group` groups whose
    /// two best scores sum lowest set to zero.
    fn drop_weak_groups(&self, scores: &Array) -> Result<Array> {
        let grouped = unflatten(scores, -1, &[self.n_group, -1])?;
        let best_two = topk_axis(&grouped, 2, -1)?.sum_axis(-1, true)?;
        let dropped = self.n_group - self.topk_group;
        let groups =
            argpartition_axis(&best_two, dropped - 1, -2)?.index((Ellipsis, ..dropped, ..));
        let zero = Array::from_f32(0.0);
        Ok(grouped
            .put_along_axis(stop_gradient(&groups)?, &zero, -2)?
            .flatten(-2, -1)?)
    }
}

/// How the router's scores become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over all experts, keep the top k, optionally renormalized
    /// (Qwen3-MoE's `norm_topk_prob`).
    SoftmaxTopK {
        /// Renormalize the top k probabilities to sum to 1.
        normalize: bool,
    },
    /// Keep the top k logits, softmax over them (Mixtral).
    TopKSoftmax,
    /// The same, the top k taken from the end of the partition (GPT-OSS's
    /// order, which decides the order the experts are summed in).
    TopKLastSoftmax,
    /// GLM-4.5's `noaux_tc`: sigmoid scores in float32 plus the
    /// `score_bias` pick the experts (after zeroing all but the `topk_group`
    /// groups of experts whose two best scores sum highest), the unbiased
    /// scores weight them, renormalized when `normalize` and `k > 1`.
    SigmoidGroups {
        /// The number of groups the experts are split into.
        n_group: i32,
        /// How many groups keep their experts in the running.
        topk_group: i32,
        /// Renormalize the chosen experts' weights to sum to 1 (`norm_topk_prob`).
        normalize: bool,
    },
}

/// Where a family keeps its MoE tensors inside the block's `mlp` prefix.
#[derive(Clone, Copy, Debug)]
pub struct MoeLayout {
    /// The router: `gate` or `router`.
    pub router: &'static str,
    /// The stacked experts: `switch_mlp` or `experts`.
    pub experts: &'static str,
    /// Per-expert Hugging Face names of gate, up and down, stacked at load.
    pub hf_names: [&'static str; 3],
    /// The router's LoRA key (its path inside the block).
    pub router_key: &'static str,
    /// The experts' gate activation.
    pub activation: ExpertActivation,
}

impl MoeLayout {
    /// The block's path inside a layer: the router's parent (`mlp`,
    /// `block_sparse_moe`).
    pub(crate) fn block(&self) -> &'static str {
        self.router_key
            .rsplit_once('.')
            .map_or("", |(parent, _)| parent)
    }

    /// Stacks the `count` per-expert projections of the block at `prefix`,
    /// as Hugging Face stores them, into `{prefix}.{experts}.{gate,up,down}_proj`.
    pub(crate) fn stack_hugging_face_experts(
        &self,
        tensors: &mut HashMap<String, Array>,
        prefix: &str,
        count: i32,
    ) -> Result<()> {
        for (hf_name, name) in self.hf_names.iter().zip(EXPERT_PROJS) {
            stack_expert_tensors(
                tensors,
                &format!("{prefix}.experts"),
                hf_name,
                &format!("{prefix}.{}.{name}", self.experts),
                count,
            )?;
        }
        Ok(())
    }
}

/// A sparse MoE block: router (`gate`) and experts (`switch_mlp`).
#[derive(Clone)]
pub struct SparseMoe {
    /// The router: expert logits `[.., experts]` from the hidden states.
    pub gate: Linear,
    /// The stacked experts.
    pub switch_mlp: SwitchGlu,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: i32,
    /// How the router's scores become the chosen experts and their weights.
    pub routing: Routing,
    /// The router's path inside the block (`mlp.gate`, `block_sparse_moe.gate`),
    /// the name its adapter gets.
    pub router_key: &'static str,
    /// The experts' path inside the block (`mlp.switch_mlp`,
    /// `block_sparse_moe.switch_mlp`, `mlp.experts`): their adapters are
    /// named `{experts_key}.{gate,up,down}_proj`.
    pub experts_key: String,
    /// Where Hugging Face checkpoints keep each expert's projections
    /// (`{parent}.experts.{e}.{name}` for the names of `EXPERT_PROJS` order).
    pub hf_names: [&'static str; 3],
    /// Added to the routing scores before the experts are picked (GLM-4.5's
    /// `e_score_correction_bias`, kept in float32).
    pub score_bias: Option<Array>,
    /// Multiplies the expert weights (`routed_scaling_factor`); 1 elsewhere.
    pub routed_scale: f32,
    /// Whether the router is a linear layer in mlx-lm's class, which LoRA
    /// adapts (GLM-4.5's and DeepSeek-V3's are bare weight matrices).
    pub router_is_linear: bool,
    /// Experts every token also goes through.
    pub shared: Option<Box<SharedExperts>>,
    /// Under tensor parallelism every expert keeps a share of its
    /// intermediate columns: the output (routed and shared experts) is this
    /// rank's partial sum, summed across the group.
    pub all_sum: Option<crate::collective::Group>,
}

/// The shared experts of a sparse block: a dense MLP every token goes
/// through (GLM-4.5's `shared_experts`, Qwen3-Next's gated `shared_expert`).
#[derive(Clone)]
pub struct SharedExperts {
    /// The MLP.
    pub mlp: Mlp,
    /// A one-output linear whose sigmoid scales the MLP's output
    /// (Qwen3-Next's `shared_expert_gate`).
    pub gate: Option<Linear>,
    /// The MLP's path inside the block (`mlp.shared_experts`, Qwen3-Next's
    /// `mlp.shared_expert`), its adapters' names; empty where it is not
    /// adapted.
    pub key: &'static str,
}

impl SharedExperts {
    /// An ungated shared MLP at `key`.
    pub(crate) fn new(mlp: Mlp, key: &'static str) -> Self {
        Self {
            mlp,
            gate: None,
            key,
        }
    }
}

/// The routing settings GLM-4.5 and DeepSeek-V3 share: grouped sigmoid
/// scores with `e_score_correction_bias`, scaled by `routed_scaling_factor`.
pub(crate) struct GroupedSigmoidMoe<'a> {
    /// The family, for the error about a quantized router.
    pub family: &'a str,
    pub experts: i32,
    pub top_k: i32,
    pub n_group: i32,
    pub topk_group: i32,
    pub normalize: bool,
    pub routed_scale: f32,
    /// The checkpoint has `{prefix}.shared_experts`.
    pub shared_experts: bool,
    pub layout: MoeLayout,
}

impl GroupedSigmoidMoe<'_> {
    /// Loads the block at `prefix`: a bare router matrix (never quantized,
    /// as in mlx-lm), its score correction in float32, the experts, and the
    /// shared experts when the family has them.
    pub(crate) fn load(&self, w: &mut Weights, prefix: &str) -> Result<SparseMoe> {
        let gate = format!("{prefix}.gate");
        if w.contains(&format!("{gate}.scales")) {
            bail!(
                "{gate} is quantized; mlx-lm keeps {}'s router dense",
                self.family
            );
        }
        let router = Linear {
            weight: LinearWeight::Dense(w.take(&format!("{gate}.weight"))?),
            bias: None,
            lora: None,
            all_sum: None,
        };
        let routing = Routing::SigmoidGroups {
            n_group: self.n_group,
            topk_group: self.topk_group,
            normalize: self.normalize,
        };
        let mut moe = SparseMoe::with_router(
            w,
            prefix,
            self.experts,
            self.top_k,
            routing,
            self.layout,
            router,
        )?;
        let bias = w.take(&format!("{gate}.e_score_correction_bias"))?;
        moe.score_bias = Some(bias.as_dtype(Dtype::Float32)?);
        moe.routed_scale = self.routed_scale;
        moe.router_is_linear = false;
        if self.shared_experts {
            let shared = Mlp::load(w, &format!("{prefix}.shared_experts"))?;
            moe.shared = Some(Box::new(SharedExperts::new(shared, "mlp.shared_experts")));
        }
        Ok(moe)
    }
}

impl SparseMoe {
    /// Loads `{prefix}.gate` and `{prefix}.switch_mlp.*`, stacking per-expert
    /// tensors (`{prefix}.experts.{e}.{name}`, as Hugging Face stores them)
    /// first when the checkpoint has them.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        experts: i32,
        top_k: i32,
        routing: Routing,
        layout: MoeLayout,
    ) -> Result<Self> {
        let gate = Linear::load(w, &format!("{prefix}.{}", layout.router))?;
        Self::with_router(w, prefix, experts, top_k, routing, layout, gate)
    }

    /// As `load`, with a router the family loaded itself (GLM-4.5's is a
    /// bare weight matrix, never quantized and not randomly initialised).
    pub(crate) fn with_router(
        w: &mut Weights,
        prefix: &str,
        experts: i32,
        top_k: i32,
        routing: Routing,
        layout: MoeLayout,
        gate: Linear,
    ) -> Result<Self> {
        if top_k < 1 || top_k > experts {
            bail!("num_experts_per_tok ({top_k}) must be between 1 and the number of experts ({experts})");
        }
        w.stack_moe_experts(&layout, prefix, experts)?;
        let mut proj = |name: &str| -> Result<SwitchLinear> {
            SwitchLinear::load(w, &format!("{prefix}.{}.{name}", layout.experts), experts)
        };
        let switch_mlp = SwitchGlu {
            gate_proj: proj("gate_proj")?,
            up_proj: proj("up_proj")?,
            down_proj: proj("down_proj")?,
            activation: layout.activation,
        };
        let parent = layout.block();
        Ok(Self {
            gate,
            switch_mlp,
            top_k,
            routing,
            router_key: layout.router_key,
            experts_key: format!("{parent}.{}", layout.experts),
            hf_names: layout.hf_names,
            score_bias: None,
            routed_scale: 1.0,
            router_is_linear: true,
            shared: None,
            all_sum: None,
        })
    }

    /// The shared experts' linear layers by their path inside the block, as
    /// mlx-lm names them (LoRA sites): `{key}.{gate,up,down}_proj`, then
    /// Qwen3-Next's `{key}_gate`.
    pub(crate) fn shared_linears(&self) -> Vec<(String, &Linear)> {
        let Some(shared) = self.shared.as_deref().filter(|s| !s.key.is_empty()) else {
            return Vec::new();
        };
        let (key, mlp) = (shared.key, &shared.mlp);
        let mut out = vec![
            (format!("{key}.gate_proj"), &mlp.gate_proj),
            (format!("{key}.up_proj"), &mlp.up_proj),
            (format!("{key}.down_proj"), &mlp.down_proj),
        ];
        out.extend(shared.gate.as_ref().map(|g| (format!("{key}_gate"), g)));
        out
    }

    /// `shared_linears`, mutable, in the same order.
    pub(crate) fn shared_linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let Some(shared) = self.shared.as_deref_mut().filter(|s| !s.key.is_empty()) else {
            return Vec::new();
        };
        let SharedExperts { mlp, gate, key } = shared;
        let key = *key;
        let mut out = vec![
            (format!("{key}.gate_proj"), &mut mlp.gate_proj),
            (format!("{key}.up_proj"), &mut mlp.up_proj),
            (format!("{key}.down_proj"), &mut mlp.down_proj),
        ];
        out.extend(gate.as_mut().map(|g| (format!("{key}_gate"), g)));
        out
    }

    /// `Routing::SigmoidGroups`: the chosen experts and their weights.
    fn sigmoid_groups(
        &self,
        logits: &Array,
        n_group: i32,
        topk_group: i32,
        normalize: bool,
    ) -> Result<(Array, Array)> {
        SigmoidGroupChoice {
            top_k: self.top_k,
            n_group,
            topk_group,
            normalize,
            norm_epsilon: 0.0,
            score_bias: self.score_bias.as_ref(),
            scale: self.routed_scale,
        }
        .choose(logits)
    }

    /// The block's output `[.., hidden]` for `x` `[.., hidden]`: the routed
    /// experts' outputs summed by their weights, plus any shared experts.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.gate.forward(x)?;
        let experts = logits.shape()[logits.ndim() - 1];
        let k = self.top_k;
        let (inds, scores) = match self.routing {
            Routing::SoftmaxTopK { normalize } => {
                let probs = softmax_axis(&logits, -1, true)?;
                let inds =
                    argpartition_axis(&probs, experts - k, -1)?.index((Ellipsis, (experts - k)..));
                let inds = stop_gradient(&inds)?;
                let mut scores = probs.take_along_axis(&inds, -1)?;
                if normalize {
                    scores = &scores / &scores.sum_axis(-1, true)?;
                }
                (inds, scores)
            }
            Routing::TopKSoftmax => {
                let inds = argpartition_axis(&(-&logits), k - 1, -1)?.index((Ellipsis, ..k));
                let inds = stop_gradient(&inds)?;
                let scores = logits.take_along_axis(&inds, -1)?;
                (inds, softmax_axis(&scores, -1, true)?)
            }
            Routing::TopKLastSoftmax => {
                let inds =
                    argpartition_axis(&logits, experts - k, -1)?.index((Ellipsis, (experts - k)..));
                let inds = stop_gradient(&inds)?;
                let scores = logits.take_along_axis(&inds, -1)?;
                (inds, softmax_axis(&scores, -1, true)?)
            }
            Routing::SigmoidGroups {
                n_group,
                topk_group,
                normalize,
            } => self.sigmoid_groups(&logits, n_group, topk_group, normalize)?,
        };
        let y = self.switch_mlp.forward(x, &inds)?;
        let weighted = &y * &expand_dims_axes(&scores, &[-1])?;
        let out = weighted.sum_axis(-2, false)?.as_dtype(y.dtype())?;
        let Some(shared) = &self.shared else {
            return self.summed(out);
        };
        let y = shared.mlp.forward(x)?;
        let out = match &shared.gate {
            Some(gate) => &out + &(&sigmoid(&gate.forward(x)?)? * &y),
            None => &out + &y,
        };
        self.summed(out)
    }

    /// `y` summed across the ranks when the experts are split.
    fn summed(&self, y: Array) -> Result<Array> {
        match &self.all_sum {
            Some(group) => group.all_sum(&y),
            None => Ok(y),
        }
    }
}
