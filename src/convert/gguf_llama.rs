//! The LLaMA architecture in GGUF: hyperparameters from the metadata, tensor
//! names mapped to Hugging Face names, and Q/K rows restored from GGUF's RoPE
//! layout to the rotate-half layout.

use anyhow::{bail, Context, Result};
use mlx_rs::Array;
use serde_json::{json, Map, Value};

use super::gguf::GgufHeader;
use super::gguf_tokenizer::TokenizerFiles;

pub(crate) const ARCH: &str = "llama";

/// Attention head counts, needed to un-permute Q and K.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads (`llama.attention.head_count`).
    pub n_head: i32,
    /// Key/value heads (`llama.attention.head_count_kv`, defaulting to the query heads).
    pub n_kv_head: i32,
}

impl Heads {
    /// Reads the head counts from the GGUF metadata; fails if either is not positive.
    pub fn read(h: &GgufHeader) -> Result<Self> {
        let n_head = h.require_int("llama.attention.head_count")? as i32;
        let n_kv_head = h
            .int("llama.attention.head_count_kv")
            .map(|v| v as i32)
            .unwrap_or(n_head);
        if n_head <= 0 || n_kv_head <= 0 {
            bail!("the GGUF metadata gives {n_head} attention heads and {n_kv_head} KV heads");
        }
        Ok(Self { n_head, n_kv_head })
    }
}

/// The Hugging Face name of a GGUF tensor name (suffixes such as `weight`,
/// `bias`, and MLX's `scales`/`biases` are kept).
pub fn hf_name(gguf: &str) -> Result<String> {
    let (base, suffix) = gguf
        .rsplit_once('.')
        .with_context(|| format!("unexpected GGUF tensor name {gguf:?}"))?;
    let mapped = match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        "rope_freqs" => bail!(
            "the GGUF file carries rope_freqs (Llama 3.1-style RoPE scaling), which convert does not support"
        ),
        _ => {
            let rest = base
                .strip_prefix("blk.")
                .with_context(|| format!("unexpected tensor {gguf:?} in a LLaMA GGUF file"))?;
            let (layer, part) = rest
                .split_once('.')
                .with_context(|| format!("unexpected tensor {gguf:?} in a LLaMA GGUF file"))?;
            let layer: usize = layer
                .parse()
                .with_context(|| format!("bad layer number in tensor {gguf:?}"))?;
            let hf = match part {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                _ => bail!("unexpected tensor {gguf:?} in a LLaMA GGUF file"),
            };
            format!("model.layers.{layer}.{hf}")
        }
    };
    Ok(format!("{mapped}.{suffix}"))
}

/// The head count whose RoPE permutation a tensor carries, if any.
pub(crate) fn permuted_heads(gguf: &str, heads: Heads) -> Option<i32> {
    let base = gguf.rsplit_once('.').map_or(gguf, |(b, _)| b);
    if base.ends_with(".attn_q") {
        Some(heads.n_head)
    } else if base.ends_with(".attn_k") {
        Some(heads.n_kv_head)
    } else {
        None
    }
}

/// Undoes GGUF's per-head interleaving of Q/K rows. A pure row permutation,
/// so it applies equally to packed weights, scales, biases and bias vectors.
pub(crate) fn unpermute_rows(a: &Array, n_head: i32) -> Result<Array> {
    let shape = a.shape().to_vec();
    let rows = shape[0];
    if rows % (2 * n_head) != 0 {
        bail!("{rows} rows cannot be split into {n_head} rotary heads");
    }
    let mut split = vec![n_head, rows / n_head / 2, 2];
    split.extend_from_slice(&shape[1..]);
    Ok(a.reshape(&split)?.swap_axes(1, 2)?.reshape(&shape)?)
}

/// `config.json` for a LLaMA model (without the quantization entries).
pub fn config(
    h: &GgufHeader,
    tok: &TokenizerFiles,
    tied: bool,
    attention_bias: bool,
    dtype: &str,
) -> Result<Map<String, Value>> {
    let heads = Heads::read(h)?;
    let hidden = h.require_int("llama.embedding_length")?;
    let head_dim = h
        .int("llama.attention.key_length")
        .unwrap_or(hidden / heads.n_head as i64);
    let vocab = h.int("llama.vocab_size").unwrap_or(tok.vocab_size as i64);
    let mut c = Map::new();
    let mut set = |k: &str, v: Value| {
        c.insert(k.to_string(), v);
    };
    set("architectures", json!(["LlamaForCausalLM"]));
    set("model_type", json!("llama"));
    set("attention_bias", json!(attention_bias));
    set("mlp_bias", json!(false));
    set("hidden_act", json!("silu"));
    set("hidden_size", json!(hidden));
    set(
        "intermediate_size",
        json!(h.require_int("llama.feed_forward_length")?),
    );
    set("num_attention_heads", json!(heads.n_head));
    set("num_key_value_heads", json!(heads.n_kv_head));
    set(
        "num_hidden_layers",
        json!(h.require_int("llama.block_count")?),
    );
    set("head_dim", json!(head_dim));
    if let Some(ctx) = h.int("llama.context_length") {
        set("max_position_embeddings", json!(ctx));
    }
    set(
        "rms_norm_eps",
        json!(h
            .float("llama.attention.layer_norm_rms_epsilon")
            .unwrap_or(1e-5)),
    );
    set(
        "rope_theta",
        json!(h.float("llama.rope.freq_base").unwrap_or(10000.0)),
    );
    set("rope_traditional", json!(false));
    set("rope_scaling", rope_scaling(h)?);
    set("tie_word_embeddings", json!(tied));
    set("vocab_size", json!(vocab));
    for (key, id) in [
        ("bos_token_id", tok.bos_id),
        ("eos_token_id", tok.eos_id),
        ("pad_token_id", tok.pad_id),
    ] {
        if let Some(id) = id {
            set(key, json!(id));
        }
    }
    set("torch_dtype", json!(dtype));
    Ok(c)
}

fn rope_scaling(h: &GgufHeader) -> Result<Value> {
    match h.string("llama.rope.scaling.type") {
        None | Some("none") => Ok(Value::Null),
        Some("linear") => {
            let factor = h
                .float("llama.rope.scaling.factor")
                .context("linear RoPE scaling without llama.rope.scaling.factor")?;
            Ok(json!({"type": "linear", "factor": factor}))
        }
        Some(other) => {
            bail!("unsupported RoPE scaling {other:?} in the GGUF file (supported: linear)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_names() {
        assert_eq!(
            hf_name("blk.12.attn_q.scales").unwrap(),
            "model.layers.12.self_attn.q_proj.scales"
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert!(hf_name("blk.0.ssm_conv1d.weight").is_err());
    }

    #[test]
    fn unpermute_restores_rotate_half_rows() {
        // One head of 4 rows: GGUF interleaves halves [a0 b0 a1 b1] from HF [a0 a1 b0 b1].
        let gguf = Array::from_slice(&[0f32, 2.0, 1.0, 3.0], &[4, 1]);
        let hf = unpermute_rows(&gguf, 1).unwrap();
        assert_eq!(hf.as_slice::<f32>(), &[0.0, 1.0, 2.0, 3.0]);
    }
}
