//! The pre-norm decoder-only transformer that the LLaMA and Qwen families share:
//! RMS norm, grouped-query attention with RoPE, SwiGLU MLP.
//! The architecture files only say which options their family uses.

use anyhow::Result;
use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::sigmoid;
use mlx_rs::Array;

use super::config::ModelArgs;
use super::layers::{Embedding, Linear, RmsNorm, Rope};
use super::quantized_attention::quantized_sdpa;
use super::weights::Weights;
use crate::cache::{KvCache, KvQuantization, Mask, QuantizedCache, RotatingCache, StandardCache};

/// What differs between the families.
#[derive(Clone, Debug, Default)]
pub struct DecoderOptions {
    /// RMS norm on queries and keys per head (Qwen3).
    pub qk_norm: bool,
    /// Per layer: the sliding attention window, or `None` for full attention.
    /// Empty means full attention everywhere.
    pub layer_windows: Vec<Option<usize>>,
}

#[derive(Clone)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub scale: f32,
    pub rope: Rope,
}

impl Attention {
    fn load(
        w: &mut Weights,
        prefix: &str,
        args: &ModelArgs,
        opts: &DecoderOptions,
    ) -> Result<Self> {
        let head_dim = args.head_dim();
        let norm = |w: &mut Weights, name: &str| -> Result<Option<RmsNorm>> {
            if opts.qk_norm {
                Ok(Some(RmsNorm::load(
                    w,
                    &format!("{prefix}.{name}"),
                    args.rms_norm_eps,
                )?))
            } else {
                Ok(None)
            }
        };
        Ok(Self {
            q_proj: Linear::load(w, &format!("{prefix}.q_proj"))?,
            k_proj: Linear::load(w, &format!("{prefix}.k_proj"))?,
            v_proj: Linear::load(w, &format!("{prefix}.v_proj"))?,
            o_proj: Linear::load(w, &format!("{prefix}.o_proj"))?,
            q_norm: norm(w, "q_norm")?,
            k_norm: norm(w, "k_norm")?,
            n_heads: args.num_attention_heads,
            n_kv_heads: args.kv_heads(),
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
            rope: Rope::new(
                head_dim,
                args.rope_traditional,
                args.rope_base(),
                args.rope_scaling(),
            )?,
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = |proj: &Linear, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let y = proj.forward(x)?.reshape(&[b, l, n, -1])?;
            let y = match norm {
                Some(norm) => norm.forward(&y)?,
                None => y,
            };
            Ok(y.transpose_axes(&[0, 2, 1, 3])?)
        };
        let q = heads(&self.q_proj, self.n_heads, &self.q_norm)?;
        let k = heads(&self.k_proj, self.n_kv_heads, &self.k_norm)?;
        let v = heads(&self.v_proj, self.n_kv_heads, &None)?;
        let positions = cache.positions();
        let q = self.rope.forward_at(&q, &positions)?;
        let k = self.rope.forward_at(&k, &positions)?;
        if let Some(kv) = cache.update_quantized(&k, &v)? {
            let mask = cache.mask(l, kv.len())?;
            let out = quantized_sdpa(&q, &kv, self.scale, mask)?;
            let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
            return self.o_proj.forward(&out);
        }
        let (k, v) = cache.update_and_fetch(&k, &v)?;
        let out = match cache.mask(l, k.shape()[2])? {
            Mask::None => scaled_dot_product_attention(&q, &k, &v, self.scale, None, None)?,
            Mask::Causal => scaled_dot_product_attention(
                &q,
                &k,
                &v,
                self.scale,
                ScaledDotProductAttentionMask::Causal,
                None,
            )?,
            Mask::Array(m) => scaled_dot_product_attention(&q, &k, &v, self.scale, &m, None)?,
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out)
    }
}

#[derive(Clone)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    fn load(w: &mut Weights, prefix: &str) -> Result<Self> {
        Ok(Self {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"))?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"))?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"))?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        let act = &(&gate * &sigmoid(&gate)?) * &up;
        self.down_proj.forward(&act)
    }
}

#[derive(Clone)]
pub struct Block {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub input_layernorm: RmsNorm,
    pub post_attention_layernorm: RmsNorm,
}

impl Block {
    pub fn forward(&self, x: &Array, cache: &mut dyn KvCache) -> Result<Array> {
        let h = x + &self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, cache)?;
        let out = &h
            + &self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&h)?)?;
        Ok(out)
    }
}

#[derive(Clone)]
pub struct Decoder {
    pub embed_tokens: Embedding,
    pub layers: Vec<Block>,
    pub norm: RmsNorm,
    pub lm_head: Option<Linear>,
    pub options: DecoderOptions,
    /// This rank's place in a layer pipeline (`crate::distributed::shard`).
    pub pipeline: Option<crate::distributed::shard::PipelineStage>,
}

impl Decoder {
    pub fn load(w: &mut Weights, args: &ModelArgs, options: DecoderOptions) -> Result<Self> {
        let embed_tokens = Embedding::load(w, "model.embed_tokens")?;
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Block {
                    self_attn: Attention::load(w, &format!("{p}.self_attn"), args, &options)?,
                    mlp: Mlp::load(w, &format!("{p}.mlp"))?,
                    input_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.input_layernorm"),
                        args.rms_norm_eps,
                    )?,
                    post_attention_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm"),
                        args.rms_norm_eps,
                    )?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(w, "model.norm", args.rms_norm_eps)?;
        let lm_head = if w.contains("lm_head.weight") {
            Some(Linear::load(w, "lm_head")?)
        } else {
            None
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            options,
            pipeline: None,
        })
    }

    /// Hidden states after the final norm, `[B, L, hidden]`.
    pub fn hidden(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        if let Some(stage) = &self.pipeline {
            h = stage.receive(&h)?;
        }
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache.as_mut())?;
        }
        if let Some(stage) = &self.pipeline {
            h = stage.pass_on(&h)?;
        }
        self.norm.forward(&h)
    }

    pub fn project(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.as_linear(hidden),
        }
    }

    /// Logits `[B, L, vocab]` for `inputs` `[B, L]`.
    pub fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let h = self.hidden(inputs, caches)?;
        self.project(&h)
    }

    /// Logits of the last position only, `[B, vocab]`.
    pub fn forward_last(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let h = self.hidden(inputs, caches)?;
        let last = h.index((.., -1, ..));
        self.project(&last)
    }

    /// Caches bounded to `max_kv_size` positions (mlx-lm's
    /// `RotatingKVCache` keeping the first 4) or quantized from
    /// `kv.start` on. Layers with their own sliding window keep it.
    pub fn make_caches_with(
        &self,
        max_kv_size: Option<usize>,
        kv: Option<KvQuantization>,
    ) -> Result<Vec<Box<dyn KvCache>>> {
        if max_kv_size.is_some() && kv.is_some() {
            anyhow::bail!("--max-kv-size and --kv-bits cannot be combined (as in mlx-lm)");
        }
        if max_kv_size.is_some_and(|n| n <= 4) {
            anyhow::bail!("--max-kv-size must exceed the 4 positions it always keeps");
        }
        Ok((0..self.layers.len())
            .map(|i| -> Box<dyn KvCache> {
                match (
                    self.options.layer_windows.get(i).copied().flatten(),
                    max_kv_size,
                    kv,
                ) {
                    (Some(w), _, _) => Box::new(RotatingCache::new(w, 0)),
                    (None, Some(n), _) => Box::new(RotatingCache::new(n, 4)),
                    (None, None, Some(q)) => Box::new(QuantizedCache::new(q)),
                    (None, None, None) => Box::new(StandardCache::new()),
                }
            })
            .collect())
    }

    pub fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        (0..self.layers.len())
            .map(|i| -> Box<dyn KvCache> {
                match self.options.layer_windows.get(i).copied().flatten() {
                    Some(w) => Box::new(RotatingCache::new(w, 0)),
                    None => Box::new(StandardCache::new()),
                }
            })
            .collect()
    }
}
