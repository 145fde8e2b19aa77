//! Model loading and the forward pass.

pub mod compiled;
pub mod config;
pub mod decoder;
pub mod deepseek_v3;
pub mod exaone4;
pub mod gated_delta;
pub mod gemma2;
pub mod gemma3_text;
pub mod gemma4_text;
pub mod glm4_moe;
pub mod gpt_oss;
pub mod granite;
pub mod granitemoehybrid;
pub mod layers;
pub mod lfm2;
pub mod llama;
pub mod llama4_text;
pub mod mamba2;
pub mod ministral3;
pub mod mistral3;
pub mod mixtral;
pub mod moe;
pub mod nemotron_h;
pub mod nemotron_h_moe;
pub mod olmo3;
pub mod phi3;
pub mod pipeline;
pub mod quantized_attention;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod seed_oss;
pub mod smollm3;
pub mod synthetic;
pub mod weights;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;
pub use crate::mlx_ext::ComputeDtype;
use config::ModelArgs;
use decoder::Decoder;
use weights::Weights;

/// A loaded model: its config and its weights, ready to run.
#[derive(Clone)]
pub struct Model {
    /// The shared `config.json` fields.
    pub args: ModelArgs,
    /// The network.
    pub decoder: Decoder,
    /// The dtype the model computes in (its float weights cast to it).
    pub dtype: Dtype,
    /// The model directory it was loaded from.
    pub path: PathBuf,
    /// Bytes of all weights as loaded.
    pub weight_bytes: usize,
    /// Random draws mlx-lm's model class makes while it is built: a seed
    /// set before loading (`mlx_lm.generate --seed`) has advanced this far
    /// when the first token is sampled.
    pub init_draws: usize,
}

/// Every `model_type` this crate loads.
pub(crate) const SUPPORTED: [&str; 29] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "qwen3_moe",
    "mixtral",
    "smollm3",
    "granite",
    "gpt_oss",
    "seed_oss",
    "llama4_text",
    "glm4_moe",
    "olmo3",
    "exaone4",
    "ministral3",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "lfm2",
    "deepseek_v3",
    "kimi_k2",
    "nemotron_h",
    "gemma4_text",
    "gemma4",
    "granitemoehybrid",
    "mistral3",
];

fn unsupported(model_type: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "unsupported architecture {model_type:?} (supported: {})",
        SUPPORTED.join(", ")
    )
}

/// Builds the decoder of each supported `model_type` from its weights,
/// after checking their shapes against the config.
fn load_decoder(w: &mut Weights, args: &ModelArgs, raw: &serde_json::Value) -> Result<Decoder> {
    // The hybrid families' layers differ from the shapes `check_shapes` knows.
    match args.model_type.as_str() {
        "qwen3_next" => return qwen3_next::load(w, args, raw),
        "qwen3_5" | "qwen3_5_moe" => return qwen3_5::load(w, args, raw),
        "lfm2" => return lfm2::load(w, args, raw),
        // Per-layer head sizes, KV-shared layers without k_proj / v_proj.
        "gemma4_text" | "gemma4" => return gemma4_text::load(w, args, raw),
        "nemotron_h" => return nemotron_h::load(w, args, raw),
        "granitemoehybrid" => return granitemoehybrid::load(w, args, raw),
        // Latent attention: no k_proj / v_proj for `check_shapes` to read.
        "deepseek_v3" | "kimi_k2" => return deepseek_v3::load(w, args, raw),
        // Tensors under `language_model.`, the decoder named by `text_config`.
        "mistral3" => return mistral3::load(w, args, raw),
        _ => {}
    }
    let qk_norm = matches!(
        args.model_type.as_str(),
        "qwen3" | "gemma3_text" | "qwen3_moe" | "glm4_moe" | "exaone4"
    );
    w.check_shapes(args, qk_norm)
        .context("the weights do not match config.json")?;
    match args.model_type.as_str() {
        "llama" | "mistral" => Decoder::load(w, args, llama::options(args)),
        "qwen2" => Decoder::load(w, args, qwen2::options(args)),
        "qwen3" => Decoder::load(w, args, qwen3::options(args)),
        "gemma2" => gemma2::load(w, args, raw),
        "gemma3_text" => gemma3_text::load(w, args, raw),
        "phi3" => phi3::load(w, args, raw),
        "qwen3_moe" => qwen3_moe::load(w, args, raw),
        "mixtral" => mixtral::load(w, args, raw),
        "smollm3" => smollm3::load(w, args, raw),
        "granite" => granite::load(w, args, raw),
        "gpt_oss" => gpt_oss::load(w, args, raw),
        "seed_oss" => seed_oss::load(w, args),
        "llama4_text" => llama4_text::load(w, args, raw),
        "glm4_moe" => glm4_moe::load(w, args, raw),
        "olmo3" => olmo3::load(w, args, raw),
        "exaone4" => exaone4::load(w, args, raw),
        "ministral3" => ministral3::load(w, args, raw),
        other => Err(unsupported(other)),
    }
}

/// Reads `dir/config.json`: the shared fields, checked, and the raw JSON the
/// families read their own fields from (a multimodal or nested config
/// flattened to its text decoder's).
pub fn read_config(dir: &Path) -> Result<(ModelArgs, serde_json::Value)> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let raw: serde_json::Value = nemotron_h::parse_config_text(&text)
        .with_context(|| format!("parsing {}", path.display()))?;
    let raw = match raw.get("model_type").and_then(|t| t.as_str()) {
        Some("qwen3_5" | "qwen3_5_moe") => qwen3_5::flatten_text_config(raw),
        Some("lfm2") => lfm2::shared_config(raw),
        Some("gemma4") => gemma4_text::flatten_config(raw),
        Some("mistral3") => mistral3::flatten_config(raw),
        Some("nemotron_h") => nemotron_h::shared_config(raw),
        _ => raw,
    };
    // The path names the field: `hidden_size: invalid type: string "wide"`.
    let mut args: ModelArgs = serde_path_to_error::deserialize(raw.clone())
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner()))
        .with_context(|| format!("invalid model config {}", path.display()))?;
    args.resolve_quantization()
        .with_context(|| format!("invalid model config {}", path.display()))?;
    args.validate()
        .with_context(|| format!("invalid model config {}", path.display()))?;
    Ok((args, raw))
}

impl Model {
    /// Loads an mlx-lm model directory, computing as `--compute-dtype auto`.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_as(dir, ComputeDtype::Auto)
    }

    /// Loads an mlx-lm model directory, computing in the dtype `compute`
    /// picks for the dtype its weights are stored in.
    pub fn load_as(dir: &Path, compute: ComputeDtype) -> Result<Self> {
        crate::mlx_ext::init_runtime();
        if !dir.is_dir() {
            bail!("model directory {} does not exist", dir.display());
        }
        let (args, raw) = read_config(dir)?;
        if !SUPPORTED.contains(&args.model_type.as_str()) {
            return Err(unsupported(&args.model_type));
        }
        let mut weights = Weights::load_dir(dir, args.quantization.clone(), compute)?;
        Self::from_weights(&mut weights, args, &raw, dir)
    }

    fn from_weights(
        w: &mut Weights,
        args: ModelArgs,
        raw: &serde_json::Value,
        dir: &Path,
    ) -> Result<Self> {
        let weight_bytes = w.total_bytes();
        let decoder = load_decoder(w, &args, raw).with_context(|| {
            format!("loading {} weights from {}", args.model_type, dir.display())
        })?;
        let left: Vec<_> = w
            .remaining()
            .into_iter()
            .filter(|n| !n.contains("rotary_emb.inv_freq"))
            .collect();
        if !left.is_empty() {
            tracing::warn!("{} unused tensors, e.g. {}", left.len(), left[0]);
        }
        let model = Self {
            init_draws: w.init_draws(),
            dtype: w.compute_dtype(),
            args,
            decoder,
            path: dir.to_path_buf(),
            weight_bytes,
        };
        Ok(model)
    }

    /// Logits `[B, L, vocab]`.
    pub fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.decoder.forward(inputs, caches)
    }

    /// Logits of the last position, `[B, vocab]`.
    pub(crate) fn forward_last(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn KvCache>],
    ) -> Result<Array> {
        self.decoder.forward_last(inputs, caches)
    }

    /// Reads every weight onto the device now, as mlx-lm's `load` does: MLX
    /// loads lazily, so otherwise the first prompt pays for reading the files
    /// (about 2 s of a 4 GB model's time to first token on a GPU). One
    /// forward pass of one token touches every layer. Not for a model split
    /// across ranks, whose forward passes talk to the other ranks.
    pub fn materialize(&self) -> Result<()> {
        let mut caches = self.make_caches();
        let logits = self.forward(&Array::from_slice(&[0i32], &[1, 1]), &mut caches)?;
        mlx_rs::transforms::eval([&logits]).context("loading the weights")?;
        back_weights_with_huge_pages();
        Ok(())
    }

    /// One fresh cache per layer that keeps one ([`Decoder::make_caches`]).
    pub fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        self.decoder.make_caches()
    }

    /// Device bytes the weights occupy.
    pub(crate) fn resident_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.decoder.layers.len()
    }

    /// Refuses work that does not cover recurrent (gated DeltaNet, short
    /// convolution, Mamba-2) layers yet, rather than silently skipping them.
    pub fn refuse_recurrent_layers(&self, what: &str) -> Result<()> {
        let recurrent = self
            .decoder
            .layers
            .iter()
            .filter(|b| b.linear_attn.is_some())
            .count();
        if recurrent > 0 {
            anyhow::bail!(
                "{what} does not cover this model's {recurrent} recurrent (gated DeltaNet, \
                 short convolution or Mamba-2) layers yet ({})",
                self.args.model_type
            );
        }
        Ok(())
    }

    /// Number of token ids the model's embedding covers.
    pub fn vocab_size(&self) -> usize {
        self.decoder.embed_tokens.vocab_size() as usize
    }

    /// Refuses token ids past the embeddings: the lookup reads no bounds, so
    /// a tokenizer larger than the model would read memory outside it.
    pub fn check_token_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => bail!(
                "token id {id} is outside the model's vocabulary of {vocab}: the tokenizer does \
                 not belong to this model"
            ),
            None => Ok(()),
        }
    }

    /// Whether rows of this model can share a batch: every layer's cache
    /// has a batch layout.
    pub fn supports_batching(&self) -> bool {
        crate::cache::can_batch(&self.make_caches())
    }

    /// KV bytes one position costs across the attention layers (a gated
    /// DeltaNet layer's state does not grow with the positions).
    pub fn kv_bytes_per_token(&self) -> usize {
        let item = match self.dtype {
            Dtype::Float32 => 4,
            _ => 2,
        };
        let per_head = (self.args.kv_heads() * self.args.head_dim()) as usize;
        let elements: usize = self
            .decoder
            .layers
            .iter()
            .filter(|l| l.linear_attn.is_none())
            // A latent attention layer caches its latent and shared rotary key.
            .map(|l| match &l.self_attn.latent {
                Some(m) => (m.kv_lora_rank + m.qk_rope_head_dim) as usize,
                None => 2 * per_head,
            })
            .sum();
        elements * item
    }
}

/// On the CPU, once the weights are in memory: collapses them into huge
/// pages (settings permitting), so decode steps streaming them miss the TLB
/// less.
pub(crate) fn back_weights_with_huge_pages() {
    if crate::mlx_ext::on_gpu() || !crate::settings::get().huge_pages {
        return;
    }
    let started = std::time::Instant::now();
    let bytes = crate::huge_pages::collapse_populated_mappings();
    tracing::debug!(
        "{} MiB of weights and buffers on huge pages in {:.0?}",
        bytes >> 20,
        started.elapsed()
    );
}
