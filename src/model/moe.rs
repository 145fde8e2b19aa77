//! Sparse Mixture-of-Experts feed-forward, shared by Qwen3-MoE and Mixtral:
//! a router picks `top_k` experts per token, each expert is a SwiGLU MLP
//! whose weights are stacked `[experts, out, in]` (dense, or MLX-affine
//! quantized per expert) and run through `gather_mm` / `gather_qmm`, so only
//! the chosen experts' rows are read. As mlx-lm's `SwitchGLU`, tokens are
//! sorted by expert when there are 64 or more (token, expert) pairs.

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{
    argpartition_axis, argsort_axis, expand_dims_axes, gather_mm, gather_qmm, sigmoid, softmax_axis,
};
use mlx_rs::{stop_gradient, Array};

use super::layers::{Linear, QuantSpec};
use super::weights::Weights;

/// The weights of one projection for every expert.
#[derive(Clone)]
pub enum SwitchWeight {
    /// `[experts, out, in]`.
    Dense(Array),
    /// Packed `[experts, out, in * bits / 32]` with its scales and biases.
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        spec: QuantSpec,
    },
}

#[derive(Clone)]
pub struct SwitchLinear {
    pub weight: SwitchWeight,
}

impl SwitchLinear {
    fn load(w: &mut Weights, prefix: &str, experts: i32) -> Result<Self> {
        let name = format!("{prefix}.weight");
        let weight = w.take(&name)?;
        if weight.ndim() != 3 || weight.shape()[0] != experts {
            bail!(
                "tensor {name:?} has shape {:?}; the experts' weights are stacked [{experts}, out, in]",
                weight.shape()
            );
        }
        let weight = match w.quant_spec(prefix) {
            Some(spec) => SwitchWeight::Quantized {
                weight,
                scales: w.take(&format!("{prefix}.scales"))?,
                biases: w.take(&format!("{prefix}.biases"))?,
                spec,
            },
            None => SwitchWeight::Dense(weight),
        };
        Ok(Self { weight })
    }

    /// `x` `[..., 1, in]` through the experts `indices` picks.
    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(match &self.weight {
            SwitchWeight::Dense(w) => gather_mm(x, w.swap_axes(-1, -2)?, None, indices, sorted)?,
            SwitchWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => gather_qmm(
                x,
                weight,
                scales,
                biases,
                None,
                indices,
                true,
                spec.group_size,
                spec.bits,
                sorted,
            )?,
        })
    }
}

/// The experts' SwiGLU: `down(silu(gate(x)) * up(x))` per chosen expert.
#[derive(Clone)]
pub struct SwitchGlu {
    pub gate_proj: SwitchLinear,
    pub up_proj: SwitchLinear,
    pub down_proj: SwitchLinear,
}

impl SwitchGlu {
    /// `x` `[..., hidden]`, `indices` `[..., k]` → `[..., k, hidden]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = expand_dims_axes(x, &[-2, -3])?;
        let indices = stop_gradient(indices)?;
        let sort = indices.size() >= 64;
        let (x, idx, inverse) = if sort {
            let k = indices.shape()[indices.ndim() - 1];
            let flat = indices.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inverse = argsort_axis(&order, 0)?;
            let tokens = order.floor_divide(Array::from_int(k))?;
            let x = x.flatten(0, -3)?.take_axis(&tokens, 0)?;
            (x, flat.take_axis(&order, 0)?, Some(inverse))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up_proj.forward(&x, &idx, sort)?;
        let gate = self.gate_proj.forward(&x, &idx, sort)?;
        let act = &(&gate * &sigmoid(&gate)?) * &up;
        let mut y = self.down_proj.forward(&act, &idx, sort)?;
        if let Some(inverse) = inverse {
            let mut shape = indices.shape().to_vec();
            shape.extend_from_slice(&y.shape()[1..]);
            y = y.take_axis(&inverse, 0)?.reshape(&shape)?;
        }
        Ok(y.squeeze_axes(&[-2])?)
    }
}

/// How the router's scores become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over all experts, keep the top k, optionally renormalized
    /// (Qwen3-MoE's `norm_topk_prob`).
    SoftmaxTopK { normalize: bool },
    /// Keep the top k logits, softmax over them (Mixtral).
    TopKSoftmax,
}

/// A sparse MoE block: router (`gate`) and experts (`switch_mlp`).
#[derive(Clone)]
pub struct SparseMoe {
    pub gate: Linear,
    pub switch_mlp: SwitchGlu,
    pub top_k: i32,
    pub routing: Routing,
    /// The router's path inside the block (`mlp.gate`, `block_sparse_moe.gate`),
    /// the name its adapter gets.
    pub router_key: &'static str,
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
        expert_names: [&str; 3],
        router_key: &'static str,
    ) -> Result<Self> {
        if top_k < 1 || top_k > experts {
            bail!("num_experts_per_tok ({top_k}) must be between 1 and the number of experts ({experts})");
        }
        let mut proj = |i: usize, name: &str| -> Result<SwitchLinear> {
            let target = format!("{prefix}.switch_mlp.{name}");
            w.stack_experts(
                &format!("{prefix}.experts"),
                expert_names[i],
                &target,
                experts,
            )?;
            SwitchLinear::load(w, &target, experts)
        };
        let switch_mlp = SwitchGlu {
            gate_proj: proj(0, "gate_proj")?,
            up_proj: proj(1, "up_proj")?,
            down_proj: proj(2, "down_proj")?,
        };
        Ok(Self {
            gate: Linear::load(w, &format!("{prefix}.gate"))?,
            switch_mlp,
            top_k,
            routing,
            router_key,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let logits = self.gate.forward(x)?;
        let experts = logits.shape()[logits.ndim() - 1];
        let k = self.top_k;
        let (inds, scores) = match self.routing {
            Routing::SoftmaxTopK { normalize } => {
                let probs = softmax_axis(&logits, -1, true)?;
                let inds =
                    argpartition_axis(&probs, experts - k, -1)?.index((.., .., (experts - k)..));
                let inds = stop_gradient(&inds)?;
                let mut scores = probs.take_along_axis(&inds, -1)?;
                if normalize {
                    scores = &scores / &scores.sum_axis(-1, true)?;
                }
                (inds, scores)
            }
            Routing::TopKSoftmax => {
                let inds = argpartition_axis(&(-&logits), k - 1, -1)?.index((.., .., ..k));
                let inds = stop_gradient(&inds)?;
                let scores = logits.take_along_axis(&inds, -1)?;
                (inds, softmax_axis(&scores, -1, true)?)
            }
        };
        let y = self.switch_mlp.forward(x, &inds)?;
        let weighted = &y * &expand_dims_axes(&scores, &[-1])?;
        Ok(weighted.sum_axis(-2, false)?)
    }
}
