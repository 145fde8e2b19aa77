//! Logit processing (penalties, bias) and token sampling, following mlx-lm's
//! order: processors on logits, then log-softmax, then top-p, min-p, top-k
//! filters and a categorical draw at the temperature (argmax at 0).

use std::collections::HashMap;

use anyhow::Result;
use mlx_rs::ops::indexing::{argmax_axis, take_along_axis, IndexOp};
use mlx_rs::ops::{argsort_axis, cumsum, exp, full, gt, logsumexp_axis, lt, select};
use mlx_rs::{random, Array};
use serde::{Deserialize, Serialize};

fn one() -> f32 {
    1.0
}

fn twenty() -> usize {
    20
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    #[serde(default)]
    pub temperature: f32,
    #[serde(default = "one")]
    pub top_p: f32,
    /// 0 disables.
    #[serde(default)]
    pub top_k: usize,
    #[serde(default)]
    pub min_p: f32,
    /// Multiplicative penalty on recently seen tokens (mlx-lm semantics); 1 or None disables.
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default = "twenty")]
    pub repetition_context_size: usize,
    /// OpenAI-style additive penalties over the generated tokens.
    #[serde(default)]
    pub presence_penalty: f32,
    #[serde(default)]
    pub frequency_penalty: f32,
    #[serde(default)]
    pub logit_bias: HashMap<u32, f32>,
    #[serde(default)]
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: None,
            repetition_context_size: 20,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: HashMap::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub(crate) fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    pub(crate) fn has_processors(&self) -> bool {
        self.repetition_penalty.is_some_and(|p| p != 1.0)
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || !self.logit_bias.is_empty()
    }
}

/// Per-request sampling state (its own random key when seeded).
pub(crate) struct Sampler {
    pub params: SamplingParams,
    key: Option<Array>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        let key = match params.seed {
            Some(seed) => Some(random::key(seed)?),
            None => None,
        };
        Ok(Self { params, key })
    }

    /// Applies logit bias and penalties. `prompt` and `generated` are the
    /// token history; `logits` is `[1, vocab]`.
    pub fn process(&self, logits: Array, prompt: &[u32], generated: &[u32]) -> Result<Array> {
        let p = &self.params;
        if !p.has_processors() {
            return Ok(logits);
        }
        let vocab = logits.shape()[logits.ndim() - 1] as usize;
        let mut logits = logits;
        if !p.logit_bias.is_empty() || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut add = vec![0f32; vocab];
            for (&id, &b) in &p.logit_bias {
                if (id as usize) < vocab {
                    add[id as usize] += b;
                }
            }
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (&t, &c) in &counts {
                if (t as usize) < vocab {
                    add[t as usize] -= p.presence_penalty + p.frequency_penalty * c as f32;
                }
            }
            let add = Array::from_slice(&add, &[1, vocab as i32]).as_dtype(logits.dtype())?;
            logits = &logits + &add;
        }
        if let Some(penalty) = p.repetition_penalty.filter(|&x| x != 1.0) {
            let history: Vec<u32> = prompt.iter().chain(generated).copied().collect();
            let start = history.len().saturating_sub(p.repetition_context_size);
            let mut mask = vec![false; vocab];
            for &t in &history[start..] {
                if (t as usize) < vocab {
                    mask[t as usize] = true;
                }
            }
            let mask = Array::from_slice(&mask, &[1, vocab as i32]);
            let neg = lt(&logits, Array::from_f32(0.0))?;
            let penalized = select(&neg, &(&logits * penalty), &(&logits / penalty))?;
            logits = select(&mask, &penalized, &logits)?;
        }
        Ok(logits)
    }

    /// Draws the next token from `logprobs` `[1, vocab]`; returns `[1]` int32.
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        let p = &self.params;
        if p.is_greedy() {
            return Ok(argmax_axis(logprobs, -1, None)?);
        }
        let mut lp = logprobs.clone();
        if p.top_p > 0.0 && p.top_p < 1.0 {
            lp = apply_top_p(&lp, p.top_p)?;
        }
        if p.min_p > 0.0 {
            lp = apply_min_p(&lp, p.min_p)?;
        }
        if p.top_k > 0 && (p.top_k as i32) < lp.shape()[1] {
            lp = apply_top_k(&lp, p.top_k as i32)?;
        }
        let scaled = &lp * (1.0 / p.temperature);
        let key = match self.key.take() {
            Some(k) => {
                let (next, sub) = random::split(&k, 2)?;
                self.key = Some(next);
                Some(sub)
            }
            None => None,
        };
        Ok(random::categorical(&scaled, -1, None, key.as_ref())?)
    }
}

/// Log-probabilities of `logits` `[1, vocab]`.
pub(crate) fn log_softmax(logits: &Array) -> Result<Array> {
    Ok(logits - &logsumexp_axis(logits, -1, true)?)
}

fn neg_inf_like(a: &Array) -> Result<Array> {
    Ok(full::<f32>(a.shape(), &Array::from_f32(f32::NEG_INFINITY))?.as_dtype(a.dtype())?)
}

fn apply_top_p(lp: &Array, top_p: f32) -> Result<Array> {
    let probs = exp(lp)?;
    let order = argsort_axis(lp, -1)?; // ascending
    let sorted = take_along_axis(&probs, &order, -1)?;
    let cum = cumsum(&sorted, -1, None, None)?;
    // Keep the tokens whose ascending cumulative mass exceeds 1 - top_p.
    let keep_sorted = gt(&cum, Array::from_f32(1.0 - top_p))?;
    let lp_sorted = take_along_axis(lp, &order, -1)?;
    let kept_sorted = select(&keep_sorted, &lp_sorted, &neg_inf_like(&lp_sorted)?)?;
    // Scatter back to vocabulary order via the inverse permutation.
    let inverse = argsort_axis(&order, -1)?;
    Ok(take_along_axis(&kept_sorted, &inverse, -1)?)
}

fn apply_min_p(lp: &Array, min_p: f32) -> Result<Array> {
    let top = lp.max_axis(-1, true)?;
    let threshold = &top + (min_p.ln());
    let drop = lt(lp, &threshold)?;
    Ok(select(&drop, &neg_inf_like(lp)?, lp)?)
}

fn apply_top_k(lp: &Array, k: i32) -> Result<Array> {
    let order = argsort_axis(&(-lp), -1)?; // descending
    let kth = order.index((.., k - 1..k));
    let kth_val = take_along_axis(lp, &kth, -1)?;
    let drop = lt(lp, &kth_val)?;
    Ok(select(&drop, &neg_inf_like(lp)?, lp)?)
}
