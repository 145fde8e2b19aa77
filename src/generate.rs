//! What generating one sequence takes and gives: options, the prompt,
//! results, the output sink (end tokens, detokenizing, stop strings,
//! streaming) and prefill. The decoders that use them are in
//! [`crate::decode`].

use std::time::Instant;

use anyhow::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, full, select};
use mlx_rs::transforms::eval;
use mlx_rs::Array;
use serde::Serialize;

use crate::cache::KvCache;
use crate::model::Model;
use crate::sampling::SamplingParams;
use crate::stop::{StopMatcher, StopOutcome};
use crate::tokenizer::{StreamingDetokenizer, Tokenizer};

/// Prompt tokens run through the model per prefill chunk unless a request says
/// otherwise (mlx-lm's `prefill_step_size`).
pub const DEFAULT_PREFILL_STEP: usize = 2048;

/// How to generate one sequence: token limit, sampling, stop strings,
/// log-probabilities and prefill chunking.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// The most tokens to generate (`max_tokens`).
    pub max_tokens: usize,
    /// How each next token is drawn from the logits.
    pub sampling: SamplingParams,
    /// Strings that end generation when they appear in the output (`stop`); the
    /// output ends before them.
    pub stop: Vec<String>,
    /// `Some(k)`: report the chosen token's log-probability and the top `k`.
    pub logprobs: Option<usize>,
    /// Prompt tokens per prefill chunk.
    pub prefill_step: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            logprobs: None,
            prefill_step: DEFAULT_PREFILL_STEP,
        }
    }
}

/// Why generation ended (the API's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string ended it, or its constraint was
    /// complete.
    Stop,
    /// It reached `max_tokens`.
    Length,
    /// The caller stopped it (the client went away or the server is stopping).
    Cancelled,
}

impl FinishReason {
    /// The reason as the API spells it: `"stop"`, `"length"` or `"cancelled"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// A generated token's log-probability and, when asked for, the most likely
/// alternatives at its position.
#[derive(Clone, Debug, Serialize)]
pub struct TokenLogprob {
    /// The token id.
    pub token: u32,
    /// Its natural-log probability: the log-softmax of the logits after penalties,
    /// bias and any grammar mask, before temperature.
    pub logprob: f32,
    /// The most likely tokens at this position as `(token id, log-probability)`,
    /// most likely first; empty unless top-`k` was asked for.
    pub top: Vec<(u32, f32)>,
}

/// One emitted token and the text it made final.
pub struct TokenEvent<'a> {
    /// The token id; `u32::MAX` for text released at the end that belongs to no new
    /// token.
    pub token: u32,
    /// The text this token made final (may be empty while the detokenizer or a stop
    /// string holds text back).
    pub text: &'a str,
    /// Its log-probability, when the request asked for them.
    pub logprob: Option<&'a TokenLogprob>,
}

/// How speculative decoding went: tokens drafted, kept, and target-model passes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SpeculationStats {
    /// Tokens the drafter proposed.
    pub drafted: usize,
    /// Proposed tokens the target model accepted and that reached the output.
    pub accepted: usize,
    /// Forward passes of the target model that verified drafts.
    pub target_calls: usize,
}

/// One finished generation: its text and tokens, counts, speeds and why it ended.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationResult {
    /// The generated text, stop strings excluded.
    pub text: String,
    /// The generated token ids.
    pub token_ids: Vec<u32>,
    /// Tokens in the prompt, cached ones included.
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose keys/values came from the prompt cache.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub generation_tokens: usize,
    /// Prompt tokens processed per second (uncached tokens over the time to first token).
    pub prompt_tps: f64,
    /// Tokens generated per second after the first.
    pub generation_tps: f64,
    /// Seconds from the start to the first generated token.
    pub ttft_s: f64,
    /// MLX's peak memory use, in bytes, when generation ended.
    pub peak_memory_bytes: usize,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Drafting counts, when the sequence was decoded speculatively.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationStats>,
    /// Tokens whose keys/values are in the cache after generation, in order.
    #[serde(skip)]
    pub cache_tokens: Vec<u32>,
    /// Each generated token's log-probability, when the request asked for them.
    #[serde(skip)]
    pub logprobs: Vec<TokenLogprob>,
}

/// Turns emitted tokens into final text: end-of-sequence, detokenizing, stop
/// strings, the token limit and the caller's callback, in that order. Both
/// the plain and the speculative loop emit through it.
pub(crate) struct OutputSink<'a> {
    tokenizer: &'a Tokenizer,
    detok: StreamingDetokenizer,
    stops: StopMatcher,
    max_tokens: usize,
    pub text: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    stopped_by_string: bool,
    on_token: Box<dyn FnMut(&TokenEvent) -> bool + 'a>,
}

impl<'a> OutputSink<'a> {
    /// A sink that owns its callback (rows of a batch outlive any one call).
    pub(crate) fn boxed(
        tokenizer: &'a Tokenizer,
        opts: &GenerateOptions,
        on_token: Box<dyn FnMut(&TokenEvent) -> bool + 'a>,
    ) -> Self {
        Self {
            tokenizer,
            detok: StreamingDetokenizer::new(),
            stops: StopMatcher::new(&opts.stop),
            max_tokens: opts.max_tokens,
            text: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            stopped_by_string: false,
            on_token,
        }
    }

    /// Emits one token; returns false once generation must end.
    pub(crate) fn emit(&mut self, token: u32, logprob: Option<TokenLogprob>) -> Result<bool> {
        if self.finish.is_some() {
            return Ok(false);
        }
        if self.tokenizer.is_eos(token) {
            self.finish = Some(FinishReason::Stop);
            return Ok(false);
        }
        self.tokens.push(token);
        let piece = self.detok.push(self.tokenizer, token)?;
        let (piece, stopped) = match self.stops.push(&piece) {
            StopOutcome::Continue(t) => (t, false),
            StopOutcome::Stopped(t) => (t, true),
        };
        self.text.push_str(&piece);
        let keep_going = (self.on_token)(&TokenEvent {
            token,
            text: &piece,
            logprob: logprob.as_ref(),
        });
        if let Some(lp) = logprob {
            self.logprobs.push(lp);
        }
        if stopped {
            self.finish = Some(FinishReason::Stop);
            self.stopped_by_string = true;
        } else if !keep_going {
            self.finish = Some(FinishReason::Cancelled);
        } else if self.tokens.len() >= self.max_tokens {
            self.finish = Some(FinishReason::Length);
        }
        Ok(self.finish.is_none())
    }

    /// Closes the sink and assembles the result with timings and counts.
    pub(crate) fn into_result(
        mut self,
        prompt: &[u32],
        cached: usize,
        start: Instant,
        first_token_at: Option<Instant>,
        cache_tokens: Vec<u32>,
        speculation: Option<SpeculationStats>,
    ) -> Result<GenerationResult> {
        let finish = self.close()?;
        let end = Instant::now();
        let first = first_token_at.unwrap_or(end);
        let prompt_secs = (first - start).as_secs_f64().max(1e-9);
        let n = self.tokens.len();
        let gen_secs = (end - first).as_secs_f64();
        Ok(GenerationResult {
            text: self.text,
            token_ids: self.tokens,
            prompt_tokens: prompt.len(),
            cached_tokens: cached,
            generation_tokens: n,
            prompt_tps: (prompt.len() - cached) as f64 / prompt_secs,
            generation_tps: if n > 1 && gen_secs > 0.0 {
                (n - 1) as f64 / gen_secs
            } else {
                0.0
            },
            ttft_s: prompt_secs,
            peak_memory_bytes: crate::mlx_ext::peak_memory_bytes(),
            finish_reason: finish,
            speculation,
            cache_tokens,
            logprobs: self.logprobs,
        })
    }

    /// Ends generation for a reason found outside the sink (grammar complete).
    pub(crate) fn finish_with(&mut self, reason: FinishReason) {
        if self.finish.is_none() {
            self.finish = Some(reason);
        }
    }

    /// Releases held-back text once generation is over.
    pub fn close(&mut self) -> Result<FinishReason> {
        let finish = self.finish.unwrap_or(FinishReason::Length);
        if !self.stopped_by_string {
            let mut tail = self.detok.flush(self.tokenizer)?;
            tail.push_str(&self.stops.flush());
            if !tail.is_empty() {
                self.text.push_str(&tail);
                (self.on_token)(&TokenEvent {
                    token: u32::MAX,
                    text: &tail,
                    logprob: None,
                });
            }
        }
        Ok(finish)
    }
}

/// Masks disallowed tokens to -inf. `mask` is a `[vocab]` bool array.
pub(crate) fn apply_mask(logits: &Array, mask: &Array) -> Result<Array> {
    let vocab = logits.shape()[logits.ndim() - 1];
    let mask = if mask.shape()[0] < vocab {
        // The model's vocabulary may be padded beyond the tokenizer's.
        let pad = full::<bool>(&[vocab - mask.shape()[0]], &Array::from_bool(false))?;
        mlx_rs::ops::concatenate(&[mask.clone(), pad], 0)?
    } else {
        mask.clone()
    };
    let neg = Array::from_f32(f32::NEG_INFINITY).as_dtype(logits.dtype())?;
    Ok(select(&mask, logits, &neg)?)
}

/// Runs `tokens` through the model to fill the caches, in chunks, without
/// computing logits.
pub fn prefill(
    model: &Model,
    caches: &mut [Box<dyn KvCache>],
    tokens: &[u32],
    step: usize,
) -> Result<()> {
    prefill_with_progress(model, caches, tokens, step, &mut |_, _| {})
}

/// `prefill` reporting the tokens processed so far (and the total) after
/// every chunk.
pub(crate) fn prefill_with_progress(
    model: &Model,
    caches: &mut [Box<dyn KvCache>],
    tokens: &[u32],
    step: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let mut done = 0;
    for chunk in tokens.chunks(step.max(1)) {
        let ids: Vec<i32> = chunk.iter().map(|&t| t as i32).collect();
        let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
        model.decoder.hidden(&input, caches)?;
        eval_caches(caches)?;
        done += chunk.len();
        progress(done, tokens.len());
    }
    Ok(())
}

/// Evaluates every cache's arrays.
pub(crate) fn eval_caches(caches: &[Box<dyn KvCache>]) -> Result<()> {
    let arrays: Vec<Array> = caches.iter().flat_map(|c| c.arrays()).collect();
    eval(arrays.iter())?;
    Ok(())
}

/// The log-probability of `token` and the `k` most likely tokens, from
/// `logprobs` `[1, vocab]` in the model's dtype, read as float32.
pub(crate) fn token_logprob(logprobs: &Array, token: u32, k: usize) -> Result<TokenLogprob> {
    let row = logprobs.index((0, ..)).as_dtype(mlx_rs::Dtype::Float32)?;
    let logprob = row.index(token as i32).item_cast::<f32>();
    let mut top = Vec::new();
    if k > 0 {
        let vocab = row.shape()[0];
        let k = (k as i32).min(vocab);
        let part = argpartition_axis(&(-&row), k - 1, -1)?;
        let ids = part.index(..k);
        let vals = row.take(&ids)?;
        eval([&ids, &vals])?;
        let ids: Vec<u32> = ids.as_slice::<u32>().to_vec();
        let vals: Vec<f32> = vals.as_slice::<f32>().to_vec();
        top = ids.into_iter().zip(vals).collect();
        top.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
    }
    Ok(TokenLogprob {
        token,
        logprob,
        top,
    })
}

/// A prompt's tokens, and how many of the first ones the caches already
/// hold (a prompt-cache hit). A token slice converts into a prompt none of
/// whose tokens is cached.
#[derive(Clone, Copy, Debug)]
pub struct Prompt<'a> {
    /// The prompt's token ids.
    pub tokens: &'a [u32],
    /// How many of the first `tokens` the caches already hold.
    pub cached: usize,
}

impl<'a> Prompt<'a> {
    /// `tokens` whose first `cached` are already in the caches.
    pub fn continuing(tokens: &'a [u32], cached: usize) -> Self {
        Self { tokens, cached }
    }
}

impl<'a> From<&'a [u32]> for Prompt<'a> {
    fn from(tokens: &'a [u32]) -> Self {
        Self { tokens, cached: 0 }
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for Prompt<'a> {
    fn from(tokens: &'a [u32; N]) -> Self {
        Self { tokens, cached: 0 }
    }
}

impl<'a> From<&'a Vec<u32>> for Prompt<'a> {
    fn from(tokens: &'a Vec<u32>) -> Self {
        Self { tokens, cached: 0 }
    }
}
