//! Random-weight models of a real model's shape (for benchmarks of kernels and
//! decode speed at sizes that are not on disk, e.g. an 8B model on a GPU).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::quantize;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use super::config::ModelArgs;
use super::weights::Weights;
use super::Model;
use crate::quant::{QuantSpec, Quantization};

/// The config of a known model shape: `llama-8b` (Llama 3 8B), `llama-1b`
/// (Llama 3.2 1B) or `smollm2-135m`.
pub fn shape_config(name: &str) -> Result<serde_json::Value> {
    let (hidden, layers, heads, kv, inter, vocab, tied) = match name {
        "llama-8b" => (4096, 32, 32, 8, 14336, 128256, false),
        "llama-1b" => (2048, 16, 32, 8, 8192, 128256, true),
        "smollm2-135m" => (576, 30, 9, 3, 1536, 49152, true),
        other => bail!("unknown model shape {other:?}: use llama-8b, llama-1b or smollm2-135m"),
    };
    Ok(serde_json::json!({
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": tied,
    }))
}

impl Model {
    /// A LLaMA-layout model of `config`'s shape with random weights stored
    /// in `dtype` and computed as `compute` picks, quantized (embeddings and
    /// linear layers) when `quant` is given.
    pub fn synthetic(
        config: serde_json::Value,
        quant: Option<QuantSpec>,
        dtype: Dtype,
        compute: crate::mlx_ext::ComputeDtype,
    ) -> Result<Self> {
        crate::mlx_ext::init_runtime();
        let dtype = compute.resolve(dtype);
        let mut args: ModelArgs =
            serde_json::from_value(config.clone()).context("synthetic model config")?;
        args.resolve_quantization()
            .context("synthetic model config")?;
        args.validate().context("synthetic model config")?;
        if args.model_type != "llama" {
            bail!("synthetic models have the llama layout only");
        }
        let h = args.hidden_size;
        let heads = args.num_attention_heads;
        let kv = args.num_key_value_heads.unwrap_or(heads);
        let hd = args.head_dim.unwrap_or(h / heads);
        let inter = args.intermediate_size;
        let mut tensors = HashMap::new();
        let mut add = |name: String, shape: [i32; 2], quantized: bool| -> Result<()> {
            let w = mlx_rs::random::normal::<f32>(&shape[..], None, 0.02, None)?.as_dtype(dtype)?;
            match quant.filter(|_| quantized) {
                Some(q) => {
                    let (wq, s, b) = quantize(&w, q.group_size, q.bits)?;
                    eval([&wq, &s, &b])?;
                    tensors.insert(format!("{name}.weight"), wq);
                    tensors.insert(format!("{name}.scales"), s);
                    tensors.insert(format!("{name}.biases"), b);
                }
                None => {
                    eval([&w])?;
                    tensors.insert(format!("{name}.weight"), w);
                }
            }
            Ok(())
        };
        add("model.embed_tokens".into(), [args.vocab_size, h], true)?;
        if !args.tie_word_embeddings {
            add("lm_head".into(), [args.vocab_size, h], true)?;
        }
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            add(format!("{p}.self_attn.q_proj"), [heads * hd, h], true)?;
            add(format!("{p}.self_attn.k_proj"), [kv * hd, h], true)?;
            add(format!("{p}.self_attn.v_proj"), [kv * hd, h], true)?;
            add(format!("{p}.self_attn.o_proj"), [h, heads * hd], true)?;
            add(format!("{p}.mlp.gate_proj"), [inter, h], true)?;
            add(format!("{p}.mlp.up_proj"), [inter, h], true)?;
            add(format!("{p}.mlp.down_proj"), [h, inter], true)?;
        }
        let ones = Array::ones::<f32>(&[h])?.as_dtype(dtype)?;
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            tensors.insert(format!("{p}.input_layernorm.weight"), ones.clone());
            tensors.insert(format!("{p}.post_attention_layernorm.weight"), ones.clone());
        }
        tensors.insert("model.norm.weight".into(), ones);
        let quantization = quant.map(Quantization::uniform);
        let mut weights = Weights::from_map(tensors, quantization, dtype)?;
        Self::from_weights(&mut weights, args, &config, Path::new("<synthetic>"))
    }
}
