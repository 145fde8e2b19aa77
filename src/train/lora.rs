//! Where LoRA adapters sit in a model (the "sites": block index + linear
//! layer), how they are initialized, and moving their arrays in and out of a
//! model as the flat parameter list the optimizer and autodiff work on.

use anyhow::{bail, Result};
use mlx_rs::{random, Array, Dtype};

use super::config::LoraParameters;
use crate::model::decoder::{Block, FeedForward};
use crate::model::layers::{Linear, Lora};
use crate::model::Model;

/// The linear layers of a decoder block, by their path inside the block
/// (mlx-lm's `lora_parameters.keys` names). A block has a subset: a sparse
/// Mixture-of-Experts layer has its router (`mlp.gate` in Qwen3-MoE,
/// `block_sparse_moe.gate` in Mixtral, `mlp.router` in GPT-OSS) instead of a dense MLP.
pub(crate) const BLOCK_LINEARS: [&str; 10] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "mlp.gate",
    "block_sparse_moe.gate",
    "mlp.router",
];

pub(crate) fn block_linear<'a>(block: &'a Block, key: &str) -> Option<&'a Linear> {
    Some(match (key, &block.mlp) {
        ("self_attn.q_proj", _) => &block.self_attn.q_proj,
        ("self_attn.k_proj", _) => &block.self_attn.k_proj,
        ("self_attn.v_proj", _) => &block.self_attn.v_proj,
        ("self_attn.o_proj", _) => &block.self_attn.o_proj,
        ("mlp.gate_proj", FeedForward::Dense(m)) => &m.gate_proj,
        ("mlp.up_proj", FeedForward::Dense(m)) => &m.up_proj,
        ("mlp.down_proj", FeedForward::Dense(m)) => &m.down_proj,
        (k, FeedForward::Sparse(moe)) if k == moe.router_key => &moe.gate,
        _ => return None,
    })
}

pub(crate) fn block_linear_mut<'a>(block: &'a mut Block, key: &str) -> Option<&'a mut Linear> {
    Some(match (key, &mut block.mlp) {
        ("self_attn.q_proj", _) => &mut block.self_attn.q_proj,
        ("self_attn.k_proj", _) => &mut block.self_attn.k_proj,
        ("self_attn.v_proj", _) => &mut block.self_attn.v_proj,
        ("self_attn.o_proj", _) => &mut block.self_attn.o_proj,
        ("mlp.gate_proj", FeedForward::Dense(m)) => &mut m.gate_proj,
        ("mlp.up_proj", FeedForward::Dense(m)) => &mut m.up_proj,
        ("mlp.down_proj", FeedForward::Dense(m)) => &mut m.down_proj,
        (k, FeedForward::Sparse(moe)) if k == moe.router_key => &mut moe.gate,
        _ => return None,
    })
}

/// One adapted linear layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub layer: usize,
    pub key: String,
}

impl Site {
    /// The module path mlx-lm uses, e.g. `model.layers.29.self_attn.q_proj`.
    pub fn path(&self) -> String {
        format!("model.layers.{}.{}", self.layer, self.key)
    }
}

/// The adapters of a model: their sites, rank and scale.
#[derive(Clone, Debug)]
pub struct AdapterLayout {
    pub sites: Vec<Site>,
    pub rank: usize,
    pub scale: f32,
    pub dropout: f32,
}

impl AdapterLayout {
    /// Sites on the last `num_layers` blocks (all blocks when it is not
    /// positive, as mlx-lm does), for `params.keys` or every linear layer.
    pub fn new(model: &Model, num_layers: i64, params: &LoraParameters) -> Result<Self> {
        let total = model.num_layers();
        if num_layers > total as i64 {
            bail!("requested to adapt {num_layers} layers but the model only has {total}");
        }
        let first = if num_layers <= 0 {
            0
        } else {
            total - num_layers as usize
        };
        let keys: Vec<String> = match &params.keys {
            Some(keys) => {
                if keys.is_empty() {
                    bail!("lora_parameters.keys is empty");
                }
                for k in keys {
                    if !BLOCK_LINEARS.contains(&k.as_str()) {
                        bail!(
                            "unsupported LoRA key {k:?} (supported: {})",
                            BLOCK_LINEARS.join(", ")
                        );
                    }
                }
                keys.clone()
            }
            None => BLOCK_LINEARS.iter().map(|s| s.to_string()).collect(),
        };
        // Each block adapts the keys it has (a sparse layer has no dense MLP).
        let blocks = &model.decoder.layers;
        let sites: Vec<Site> = (first..total)
            .flat_map(|layer| {
                keys.iter()
                    .filter(move |key| block_linear(&blocks[layer], key).is_some())
                    .map(move |key| Site {
                        layer,
                        key: key.clone(),
                    })
            })
            .collect();
        if params.keys.is_some() {
            for k in &keys {
                if !sites.iter().any(|s| &s.key == k) {
                    bail!(
                        "LoRA key {k:?} names no layer of this {} model",
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

    /// `(in_features, out_features)` of each site's base layer.
    pub fn dims(&self, model: &Model) -> Vec<(i32, i32)> {
        self.sites
            .iter()
            .map(|s| {
                let (out, inp) = linear(model, s).shape();
                (inp, out)
            })
            .collect()
    }

    /// Fresh adapters as mlx-lm makes them: `a ~ U(-1/sqrt(in), 1/sqrt(in))`,
    /// `b = 0`, drawn from `seed`. Returns the flat parameter list.
    pub(crate) fn init_params(&self, model: &Model, seed: u64) -> Result<Vec<Array>> {
        let mut key = random::key(seed)?;
        let mut params = Vec::with_capacity(2 * self.sites.len());
        for (inp, out) in self.dims(model) {
            let (next, sub) = random::split(&key, 2)?;
            key = next;
            let bound = 1.0 / (inp as f32).sqrt();
            let shape = [inp, self.rank as i32];
            params.push(random::uniform::<_, f32>(-bound, bound, &shape[..], &sub)?);
            params.push(Array::zeros::<f32>(&[self.rank as i32, out])?);
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
        for (site, ab) in self.sites.iter().zip(params.chunks(2)) {
            let lin = linear_mut(model, site);
            lin.lora = Some(Lora {
                a: ab[0].clone(),
                b: ab[1].clone(),
                scale: self.scale,
                dropout,
            });
        }
        Ok(())
    }

    /// The adapter arrays currently in `model`, in parameter order.
    pub fn params(&self, model: &Model) -> Result<Vec<Array>> {
        let mut out = Vec::with_capacity(2 * self.sites.len());
        for site in &self.sites {
            let Some(lora) = &linear(model, site).lora else {
                bail!("{} has no adapter", site.path());
            };
            out.push(lora.a.clone());
            out.push(lora.b.clone());
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

    /// Expected shape of each parameter, in order.
    pub fn shapes(&self, model: &Model) -> Vec<Vec<i32>> {
        let r = self.rank as i32;
        self.dims(model)
            .into_iter()
            .flat_map(|(inp, out)| [vec![inp, r], vec![r, out]])
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

fn linear<'a>(model: &'a Model, site: &Site) -> &'a Linear {
    block_linear(&model.decoder.layers[site.layer], &site.key)
        .expect("sites are validated against BLOCK_LINEARS")
}

fn linear_mut<'a>(model: &'a mut Model, site: &Site) -> &'a mut Linear {
    block_linear_mut(&mut model.decoder.layers[site.layer], &site.key)
        .expect("sites are validated against BLOCK_LINEARS")
}

/// Casts adapter arrays to `dtype` (inference keeps activations in the model dtype).
pub(crate) fn cast_params(params: Vec<Array>, dtype: Dtype) -> Result<Vec<Array>> {
    params
        .into_iter()
        .map(|p| crate::mlx_ext::cast_float(p, dtype))
        .collect()
}
