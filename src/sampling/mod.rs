//! Logit processing and token sampling as mlx-lm does them, op for op:
//! the processors (bias, penalties) on the logits, log-softmax, then the
//! sampler chain (top-p, min-p, XTC, top-k) and a categorical draw at the
//! temperature (argmax at 0), with MLX's key semantics for seeds.

mod filters;
mod keys;
mod processors;

use std::collections::HashMap;

use anyhow::Result;
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::Array;
use serde::{Deserialize, Serialize};

use filters::as_typed;
use keys::KeyStream;

fn one() -> f32 {
    1.0
}

fn twenty() -> usize {
    20
}

fn tenth() -> f32 {
    0.1
}

fn one_token() -> usize {
    1
}

/// How the next token is drawn: temperature, top-p/top-k/min-p/XTC filters,
/// penalties, logit bias and seed (mlx-lm's sampler and logits processors).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    #[serde(default)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum to
    /// `top_p`; 1 disables.
    #[serde(default = "one")]
    pub top_p: f32,
    /// 0 disables.
    #[serde(default)]
    pub top_k: usize,
    /// Min-p: drop tokens less likely than `min_p` times the top token; 0 disables.
    #[serde(default)]
    pub min_p: f32,
    /// With min-p: tokens that always survive the filter.
    #[serde(default = "one_token")]
    pub min_tokens_to_keep: usize,
    /// XTC: the chance that a step removes its top choices; 0 disables.
    #[serde(default)]
    pub xtc_probability: f32,
    /// XTC: the probability a token needs to count as a top choice.
    #[serde(default = "tenth")]
    pub xtc_threshold: f32,
    /// Sign-aware multiplicative penalty on the last
    /// `repetition_context_size` tokens (prompt included); 1 or None disables.
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Tokens the repetition penalty looks back over.
    #[serde(default = "twenty")]
    pub repetition_context_size: usize,
    /// Subtracted once from each distinct token of the last
    /// `presence_context_size` tokens (prompt included).
    #[serde(default)]
    pub presence_penalty: f32,
    /// Tokens the presence penalty looks back over.
    #[serde(default = "twenty")]
    pub presence_context_size: usize,
    /// Subtracted once per occurrence in the last `frequency_context_size`
    /// tokens (prompt included).
    #[serde(default)]
    pub frequency_penalty: f32,
    /// Tokens the frequency penalty looks back over.
    #[serde(default = "twenty")]
    pub frequency_context_size: usize,
    /// Added to the logits of the given token ids (`logit_bias`).
    #[serde(default)]
    pub logit_bias: HashMap<u32, f32>,
    /// Seeds the request's own key stream (`mx.random.seed`); none draws
    /// from a fresh stream.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Draws taken from the seeded stream before the first token: what
    /// `mlx_lm.generate` spends building its model after seeding
    /// ([`crate::model::Model::init_draws`]). 0 for a request seeded on its
    /// own, as `mlx_lm.server` seeds.
    #[serde(default)]
    pub seed_skip: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            repetition_penalty: None,
            repetition_context_size: 20,
            presence_penalty: 0.0,
            presence_context_size: 20,
            frequency_penalty: 0.0,
            frequency_context_size: 20,
            logit_bias: HashMap::new(),
            seed: None,
            seed_skip: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (argmax), no processors: the default.
    pub fn greedy() -> Self {
        Self::default()
    }

    pub(crate) fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    pub(crate) fn has_processors(&self) -> bool {
        self.repetition_penalty
            .is_some_and(|p| p != 1.0 && p != 0.0)
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || !self.logit_bias.is_empty()
    }
}

/// Per-request sampling state: the parameters and the request's key stream.
pub(crate) struct Sampler {
    pub params: SamplingParams,
    keys: KeyStream,
    /// Tokens XTC never removes (mlx-lm: the newline and the end tokens).
    xtc_special: Vec<u32>,
}

/// A seed for a request that gave none: distinct per request and process.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        let keys = match params.seed {
            Some(seed) => KeyStream::new(seed, params.seed_skip)?,
            None => KeyStream::new(fresh_seed(), 0)?,
        };
        Ok(Self {
            params,
            keys,
            xtc_special: Vec::new(),
        })
    }

    /// Sets the tokens XTC keeps.
    pub(crate) fn with_xtc_special(mut self, ids: Vec<u32>) -> Self {
        self.xtc_special = ids;
        self
    }

    /// Applies logit bias and penalties to `logits` `[1, vocab]`; `prompt`
    /// and `generated` are the token history.
    pub fn process(&self, logits: Array, prompt: &[u32], generated: &[u32]) -> Result<Array> {
        if !self.params.has_processors() {
            return Ok(logits);
        }
        let history: Vec<u32> = prompt.iter().chain(generated).copied().collect();
        processors::process(&self.params, logits, &history)
    }

    /// Draws the next token from `logprobs` `[1, vocab]`; returns `[1]`.
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        let p = &self.params;
        if p.is_greedy() {
            return Ok(argmax_axis(logprobs, -1, None)?);
        }
        let mut lp = logprobs.clone();
        if p.top_p > 0.0 && p.top_p < 1.0 {
            lp = filters::top_p(&lp, as_typed(p.top_p))?;
        }
        if p.min_p != 0.0 {
            lp = filters::min_p(&lp, as_typed(p.min_p), p.min_tokens_to_keep)?;
        }
        if p.xtc_probability > 0.0 {
            let key = self.keys.next()?;
            lp = filters::xtc(
                &lp,
                as_typed(p.xtc_probability),
                as_typed(p.xtc_threshold),
                &self.xtc_special,
                &key,
            )?;
        }
        if p.top_k > 0 {
            lp = filters::top_k(&lp, p.top_k)?;
        }
        let key = self.keys.next()?;
        filters::categorical(&lp, as_typed(p.temperature), &key)
    }
}

/// Log-probabilities of `logits` `[1, vocab]`.
pub(crate) fn log_softmax(logits: &Array) -> Result<Array> {
    crate::kernels::log_softmax(logits)
}

#[cfg(test)]
mod tests;
