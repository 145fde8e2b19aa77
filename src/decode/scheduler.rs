//! Continuous batching, as mlx-lm's `BatchGenerator`: rows wait, prefill in
//! chunks (up to `prompt_concurrency` at once) interleaved with decode steps
//! of the running batch (up to `decode_concurrency` rows), join it when their
//! prompt is in, and leave as soon as they finish. The server's batch lane
//! and `generate --batch-file` both run on it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use super::batch::{DecodeBatch, Finished};
use super::row::{ConstraintSlot, Row};
use crate::cache::KvCache;
use crate::constraint::TokenConstraint;
use crate::generate::{prefill, FinishReason, GenerateOptions, GenerationResult, TokenEvent};
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// How much a [`BatchScheduler`] runs at once and how it chunks prefill.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Rows decoding at once.
    pub decode_concurrency: usize,
    /// Prompts prefilling at once.
    pub prompt_concurrency: usize,
    /// Largest prefill chunk per row and step.
    pub prefill_step: usize,
    /// `Some(t)`: size prefill chunks so that a step spends about `t` on
    /// prefill, so that running rows keep streaming while a long prompt comes
    /// in and a prompt whose client left is dropped soon (the server).
    /// `None`: always `prefill_step` tokens, as mlx-lm (offline batches).
    pub prefill_target: Option<Duration>,
    /// Drafting rows verify as many drafts per step as measured step times
    /// say pay (`DraftWidths`). Off: every row verifies all it may take, as
    /// mlx-lm does (ranks in lockstep need that: their timings differ).
    pub measured_draft_width: bool,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            decode_concurrency: 8,
            prompt_concurrency: 4,
            prefill_step: crate::generate::DEFAULT_PREFILL_STEP,
            prefill_target: None,
            measured_draft_width: true,
        }
    }
}

/// Prefill chunks with a time target start at this many tokens and never
/// go below the smaller one.
const FIRST_TIMED_CHUNK: usize = 32;
const MIN_TIMED_CHUNK: usize = 16;

struct Prefilling<'a> {
    id: u64,
    row: Row<'a>,
    caches: Vec<Box<dyn KvCache>>,
    /// Prompt tokens already in `caches`.
    done: usize,
}

/// Continuous batching (mlx-lm's `BatchGenerator`): queues rows, prefills them in
/// chunks between decode steps, and runs the decoding ones as one [`DecodeBatch`].
pub struct BatchScheduler<'a> {
    model: &'a Model,
    limits: BatchLimits,
    waiting: VecDeque<Prefilling<'a>>,
    prefilling: Vec<Prefilling<'a>>,
    batch: DecodeBatch<'a>,
    /// Tokens per second of recent prefill chunks, to size interleaved chunks.
    prefill_rate: f64,
    /// When kept: copies of the caches of rows whose prompt is in, taken
    /// before they join the batch, for caches that cannot drop positions.
    checkpoints: Option<Vec<Checkpoint>>,
}

/// A row's caches at the end of its prompt (all but the last token) and
/// the tokens they hold.
pub type Checkpoint = (Vec<u32>, Vec<Box<dyn KvCache>>);

impl<'a> BatchScheduler<'a> {
    /// A scheduler for `model` under `limits` (each limit at least 1).
    pub fn new(model: &'a Model, limits: BatchLimits) -> Self {
        Self {
            model,
            limits: BatchLimits {
                decode_concurrency: limits.decode_concurrency.max(1),
                prompt_concurrency: limits.prompt_concurrency.max(1),
                prefill_step: limits.prefill_step.max(1),
                ..limits
            },
            waiting: VecDeque::new(),
            prefilling: Vec::new(),
            batch: DecodeBatch::new(model).measuring_draft_width(limits.measured_draft_width),
            prefill_rate: 0.0,
            checkpoints: None,
        }
    }

    /// Rows that share the draft model (`Row::with_shared_draft_model`)
    /// draft with `draft`, one forward pass per drafted position for all.
    pub fn with_draft_model(mut self, draft: &'a Model) -> Self {
        let batch = std::mem::replace(&mut self.batch, DecodeBatch::new(self.model));
        self.batch = batch.with_draft_model(draft, self.limits.prefill_step);
        self
    }

    /// Keeps a copy of each row's caches when its prompt is in, if they
    /// cannot drop positions (recurrent states): a prompt cache can then
    /// continue a later prompt that shares the prompt but not the reply.
    pub fn keep_prompt_checkpoints(&mut self) {
        self.checkpoints.get_or_insert_with(Vec::new);
    }

    /// The checkpoints taken since the last call.
    pub fn take_checkpoints(&mut self) -> Vec<Checkpoint> {
        self.checkpoints
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Queues a row. `caches` hold its first `row.cached()` prompt tokens
    /// (a prompt-cache hit) or nothing.
    pub fn insert(&mut self, id: u64, row: Row<'a>, caches: Vec<Box<dyn KvCache>>) {
        let done = row.cached();
        let caches = if caches.is_empty() {
            self.model.make_caches()
        } else {
            caches
        };
        self.waiting.push_back(Prefilling {
            id,
            row,
            caches,
            done,
        });
    }

    /// Rows decoding.
    pub fn decoding(&self) -> usize {
        self.batch.len()
    }

    /// Rows prefilling or waiting to.
    pub fn pending(&self) -> usize {
        self.waiting.len() + self.prefilling.len()
    }

    /// Whether no row is decoding, prefilling or waiting.
    pub fn is_idle(&self) -> bool {
        self.batch.is_empty() && self.pending() == 0
    }

    /// Whether another row could start prefilling or decoding soon.
    pub(crate) fn has_room(&self) -> bool {
        self.batch.len() + self.pending() < self.limits.decode_concurrency
    }

    /// Device bytes of the running batch's keys and values.
    pub fn kv_bytes(&self) -> usize {
        self.batch.kv_bytes()
            + self
                .prefilling
                .iter()
                .map(|p| crate::cache::total_bytes(&p.caches))
                .sum::<usize>()
    }

    /// One decode step of the running batch, then one prefill chunk for each
    /// prefilling row; rows whose prompt is in join the batch. Returns the
    /// rows that finished (or were dropped) during the step.
    pub fn step(&mut self) -> Result<Vec<Finished>> {
        let mut finished = self.batch.step()?;
        self.drop_abandoned(&mut finished)?;
        self.admit();
        self.prefill_chunks(&mut finished)?;
        Ok(finished)
    }

    /// Moves waiting rows into prefill while both limits allow.
    fn admit(&mut self) {
        while self.prefilling.len() < self.limits.prompt_concurrency
            && self.batch.len() + self.prefilling.len() < self.limits.decode_concurrency
        {
            match self.waiting.pop_front() {
                Some(p) => self.prefilling.push(p),
                None => break,
            }
        }
    }

    /// Rows whose consumer left before they decoded: out, with what they prefilled.
    fn drop_abandoned(&mut self, finished: &mut Vec<Finished>) -> Result<()> {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].row.is_alive() {
                i += 1;
            } else {
                let p = self.waiting.remove(i).unwrap();
                finished.push(close(p, FinishReason::Cancelled)?);
            }
        }
        let mut i = 0;
        while i < self.prefilling.len() {
            if self.prefilling[i].row.is_alive() {
                i += 1;
            } else {
                let p = self.prefilling.remove(i);
                finished.push(close(p, FinishReason::Cancelled)?);
            }
        }
        Ok(())
    }

    fn chunk_size(&self) -> usize {
        let step = self.limits.prefill_step;
        // Timed chunks only keep decoding rows streaming; alone, a prompt
        // prefills as `generate` prefills it.
        let Some(target) = self
            .limits
            .prefill_target
            .filter(|_| !self.batch.is_empty())
        else {
            return step;
        };
        if self.prefill_rate <= 0.0 {
            return FIRST_TIMED_CHUNK.min(step);
        }
        let rows = self.prefilling.len().max(1) as f64;
        let tokens = self.prefill_rate * target.as_secs_f64() / rows;
        (tokens as usize).clamp(MIN_TIMED_CHUNK.min(step), step)
    }

    fn prefill_chunks(&mut self, finished: &mut Vec<Finished>) -> Result<()> {
        let chunk = self.chunk_size();
        let mut still = Vec::with_capacity(self.prefilling.len());
        for mut p in std::mem::take(&mut self.prefilling) {
            if p.row.max_tokens() == 0 {
                finished.push(close(p, FinishReason::Length)?);
                continue;
            }
            let target = p.row.prompt().len() - 1;
            if p.done < target {
                let end = (p.done + chunk).min(target);
                let started = Instant::now();
                prefill(
                    self.model,
                    &mut p.caches,
                    &p.row.prompt()[p.done..end],
                    chunk,
                )?;
                let secs = started.elapsed().as_secs_f64().max(1e-6);
                let rate = (end - p.done) as f64 / secs;
                self.prefill_rate = if self.prefill_rate == 0.0 {
                    rate
                } else {
                    0.7 * self.prefill_rate + 0.3 * rate
                };
                p.done = end;
            }
            if p.done < target {
                still.push(p);
                continue;
            }
            let fresh = p.done > p.row.cached();
            if let Some(kept) = self.checkpoints.as_mut().filter(|_| fresh) {
                if !p.caches.iter().all(|c| c.is_trimmable()) {
                    let tokens = p.row.prompt()[..target].to_vec();
                    kept.push((tokens, crate::cache::clone_all(&p.caches)));
                }
            }
            let last = p.row.prompt()[target];
            self.batch.join(p.id, p.row, p.caches, last)?;
        }
        self.prefilling = still;
        Ok(())
    }
}

fn close(p: Prefilling<'_>, reason: FinishReason) -> Result<Finished> {
    let mut row = p.row;
    row.finish_with(reason);
    let mut result = row.into_result()?;
    // The caches hold only the prompt tokens prefilled so far.
    result.cache_tokens.truncate(p.done);
    Ok(Finished {
        id: p.id,
        result,
        caches: p.caches,
    })
}

/// One prompt of an offline batch.
pub struct BatchItem<'a> {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Token limit, sampling, stop strings and log-probabilities.
    pub options: GenerateOptions,
    /// A grammar the output must follow.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Sees every token the row emits; false cancels the row.
    pub on_token: Box<dyn FnMut(&TokenEvent) -> bool + 'a>,
    /// The row's empty caches (`--kv-bits`, `--max-kv-size`); none: the
    /// model's own.
    pub caches: Vec<Box<dyn KvCache>>,
}

/// Runs `items` as rows of one continuous batch and returns their results in
/// input order (`generate --batch-file`).
pub fn generate_batch<'a>(
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    items: Vec<BatchItem<'a>>,
    limits: BatchLimits,
) -> Result<Vec<GenerationResult>> {
    let n = items.len();
    let mut scheduler = BatchScheduler::new(model, limits);
    for (id, item) in items.into_iter().enumerate() {
        ensure!(!item.prompt.is_empty(), "prompt {} is empty", id + 1);
        let row = Row::new(
            model,
            tokenizer,
            item.prompt,
            0,
            &item.options,
            item.constraint.map(ConstraintSlot::Owned),
            item.on_token,
        )?;
        scheduler.insert(id as u64, row, item.caches);
    }
    let mut results: Vec<Option<GenerationResult>> = (0..n).map(|_| None).collect();
    while !scheduler.is_idle() {
        for f in scheduler.step()? {
            results[f.id as usize] = Some(f.result);
        }
    }
    // Rows that ended left a queued pass behind; it must finish before the
    // caller may exit the process.
    crate::mlx_ext::synchronize()?;
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| anyhow::anyhow!("row {} produced no result", i + 1)))
        .collect()
}
