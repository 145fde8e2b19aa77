//! Llama 4 (text-only, dense): the LLaMA layer with its MLP named
//! `feed_forward` (of `intermediate_size_mlp`), traditional RoPE on the
//! layers `no_rope_layers` marks 1 (the others use no positional encoding),
//! and, with `use_qk_norm`, RMS norm without a learned scale on each query
//! and key head. An untied output head is named `output`. mlx-lm's class
//! has no chunked attention: every layer attends over the whole context.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::config::{family_args, ModelArgs};
use super::decoder::{Attention, Block, Decoder, DecoderOptions, FeedForward, Mlp};
use super::layers::{Linear, RmsNorm, Rope};
use super::weights::Weights;

/// The Llama 4 text fields of `config.json` (all required, as in mlx-lm).
#[derive(Debug, Deserialize)]
pub(crate) struct Llama4TextArgs {
    pub intermediate_size_mlp: i32,
    pub no_rope_layers: Vec<u8>,
    pub use_qk_norm: bool,
}

/// Loads a dense Llama 4 text decoder from the checkpoint's tensors `w`, the shared config `args` and the raw `config.json`.
pub fn load(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    let extra: Llama4TextArgs = family_args(raw)?;
    let n = args.num_hidden_layers as usize;
    if extra.no_rope_layers.len() != n {
        bail!(
            "no_rope_layers has {} entries but num_hidden_layers is {n}",
            extra.no_rope_layers.len()
        );
    }
    let head_dim = args.head_dim();
    let eps = args.rms_norm_eps;
    let options = DecoderOptions::default();
    let layers = (0..n)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut self_attn = Attention::load(w, &format!("{p}.self_attn"), args, &options)?;
            self_attn.rope = match extra.no_rope_layers[i] {
                0 => None,
                _ => Some(Rope::new(head_dim, true, args.rope_base(), None)?),
            };
            if extra.use_qk_norm {
                let norm = RmsNorm::unscaled(head_dim, eps, w.compute_dtype())?;
                self_attn.q_norm = Some(norm.clone());
                self_attn.k_norm = Some(norm);
            }
            let mlp = Mlp::load(w, &format!("{p}.feed_forward"))?;
            let (rows, _) = mlp.gate_proj.shape();
            if rows != extra.intermediate_size_mlp {
                bail!(
                    "{p}.feed_forward.gate_proj has {rows} rows, but intermediate_size_mlp is {}",
                    extra.intermediate_size_mlp
                );
            }
            Block::pre_norm(w, &p, eps, self_attn, FeedForward::Dense(mlp))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut decoder = Decoder::assemble(w, args, layers, options)?;
    if !args.tie_word_embeddings {
        decoder.lm_head = Some(Linear::load(w, "output")?);
    }
    Ok(decoder)
}
