//! The worker: the one thread that owns the models. It takes requests from
//! the queue in order, admits each to its lane when the lane can take it
//! (the batch lane: room and KV budget; the serial and speculative lanes:
//! when the batch is empty, as they run a request to its end), and steps
//! the batch between admissions.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use anyhow::Result;

use super::admission::KvBudget;
use super::batch_lane::BatchLane;
use super::job::{Job, Reporter, Waiting};
use super::route::Lane;
use super::{serial, GatewayError, LoadedModels, Readiness};
use crate::cache::KvCache;
use crate::cache::KvSettings;
use crate::constraint::TokenConstraint;
use crate::decode::BatchLimits;
use crate::grammar::{ConstraintSpec, GrammarEngine};
use crate::model::Model;
use crate::prefix::PrefixStore;
use crate::tokenizer::Tokenizer;

/// What every lane uses: the tokenizer, the grammar engine, the prefix
/// store (the prompt cache in RAM, and the SSD tier when there is one), the
/// KV cache settings, and the reporter.
pub(crate) struct Shared {
    pub tokenizer: Arc<Tokenizer>,
    pub grammar: Option<GrammarEngine>,
    pub prefixes: PrefixStore,
    pub reporter: Reporter,
    pub num_draft_tokens: usize,
    /// Prompt-lookup drafting when no draft model is loaded.
    pub ngram_draft: bool,
    pub kv: KvSettings,
    /// Prefill in chunks of exactly this many tokens (`--prefill-step-size`).
    pub fixed_prefill_step: Option<usize>,
}

impl Shared {
    pub fn constraint(
        &mut self,
        spec: &ConstraintSpec,
    ) -> Result<Box<dyn TokenConstraint>, GatewayError> {
        if self.grammar.is_none() {
            let engine = GrammarEngine::new(&self.tokenizer)
                .map_err(|e| GatewayError::Internal(format!("{e:#}")))?;
            self.grammar = Some(engine);
        }
        let engine = self.grammar.as_ref().unwrap();
        engine
            .constraint(spec)
            .map_err(|e| GatewayError::InvalidRequest(format!("{e:#}")))
    }

    /// Empty caches of the server's kind.
    fn fresh_caches(&self, model: &Model) -> Vec<Box<dyn KvCache>> {
        if self.kv.is_default() {
            return model.make_caches();
        }
        model
            .decoder
            .make_caches_with(self.kv.max_kv_size, self.kv.quantization)
            .expect("the server made these caches once before it started")
    }

    /// Caches holding the longest stored prefix of `prompt`, and its
    /// length; empty caches of the server's kind when none is stored.
    pub(crate) fn cached_prefix(
        &mut self,
        model: &Model,
        prompt: &[u32],
    ) -> (Vec<Box<dyn KvCache>>, usize) {
        match self.prefixes.longest(model, prompt) {
            Some(hit) => (hit.caches, hit.cached),
            None => (self.fresh_caches(model), 0),
        }
    }
}

pub(crate) struct WorkerPlan {
    pub limits: BatchLimits,
    pub warmup: super::Warmup,
    pub budget: KvBudget,
    /// The model is sharded: run in lockstep with the other ranks.
    pub sharding: Option<super::lockstep::Sharding>,
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
        .to_string()
}

/// One forward pass on a single token, so the first request does not pay for
/// first-use setup.
fn warm_up(model: &Model) -> Result<()> {
    let mut caches = model.make_caches();
    let input = mlx_rs::Array::from_slice(&[0i32], &[1, 1]);
    let logits = model.forward_last(&input, &mut caches)?;
    mlx_rs::transforms::eval([&logits])?;
    crate::model::back_weights_with_huge_pages();
    Ok(())
}

/// On a GPU, MLX compiles each kernel the first time a shape class is used
/// (tens of seconds in all). Before the server says it is ready, run what a
/// request will: prefill chunks of every tile class of MLX's quantized
/// matmul (short cached-suffix prefills to long prompts), decode steps at
/// every batch size up to `decode_concurrency` (rows that finish one after
/// another shrink the batch through each size), and the sampling paths:
/// greedy, seeded and unseeded sampling with top-p, top-k and min-p, with and
/// without log-probabilities.
fn warm_up_kernels(model: &Model, tokenizer: &Tokenizer, limits: BatchLimits) -> Result<()> {
    use crate::decode::{BatchScheduler, Row};
    use crate::generate::GenerateOptions;
    use crate::sampling::SamplingParams;
    const PROMPT_LENGTHS: [usize; 6] = [5, 20, 40, 100, 600, 12];
    let vocab = model.vocab_size().max(2) as u32;
    let mut scheduler = BatchScheduler::new(model, limits);
    let rows = limits.decode_concurrency.max(PROMPT_LENGTHS.len());
    for i in 0..rows {
        let len = PROMPT_LENGTHS[i % PROMPT_LENGTHS.len()];
        let prompt: Vec<u32> = (0..len as u32)
            .map(|t| 1 + (t * 7 + i as u32) % (vocab - 1))
            .collect();
        let sampling = match i % 4 {
            0 => SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            1 => SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                seed: Some(i as u64),
                ..SamplingParams::default()
            },
            2 => SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                ..SamplingParams::default()
            },
            _ => SamplingParams {
                temperature: 0.8,
                top_k: 20,
                min_p: 0.05,
                ..SamplingParams::default()
            },
        };
        let opts = GenerateOptions {
            max_tokens: 2 + i,
            sampling,
            logprobs: (i % 2 == 1).then_some(2),
            ..GenerateOptions::default()
        };
        let row = Row::new(model, tokenizer, prompt, 0, &opts, None, Box::new(|_| true))?;
        scheduler.insert(i as u64, row, Vec::new());
    }
    while !scheduler.is_idle() {
        scheduler.step()?;
    }
    Ok(())
}

/// The warm-up `plan.warmup` asks for: a failing forward pass fails it; a
/// kernel of the full pass that cannot be compiled here only fails the
/// requests that need it, so that one is logged and the rest is served.
fn warm_up_all(models: &LoadedModels, tokenizer: &Tokenizer, plan: &WorkerPlan) -> Result<()> {
    if !plan.warmup.runs_basic() {
        return Ok(());
    }
    warm_up(&models.model)?;
    if let Some(d) = &models.draft {
        warm_up(d)?;
    }
    if plan.warmup.runs_full() {
        if let Err(e) = warm_up_kernels(&models.model, tokenizer, plan.limits) {
            tracing::warn!("warm-up: {e:#}");
        }
    }
    Ok(())
}

pub(crate) fn run(
    models: LoadedModels,
    mut shared: Shared,
    plan: WorkerPlan,
    rx: Receiver<Job>,
    readiness: &Readiness,
) {
    let started = std::time::Instant::now();
    let warm = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        warm_up_all(&models, &shared.tokenizer, &plan)
    }))
    .unwrap_or_else(|panic| Err(anyhow::anyhow!("panicked: {}", panic_message(&panic))));
    match &warm {
        Ok(()) => tracing::info!("warm-up took {:.2} s", started.elapsed().as_secs_f64()),
        Err(e) => tracing::error!("warm-up failed, the model cannot serve: {e:#}"),
    }
    let failed = warm.is_err();
    *readiness.state.lock().unwrap() = Some(warm.map_err(|e| format!("warm-up failed: {e:#}")));
    readiness.changed.notify_all();
    if failed {
        return;
    }
    let tokenizer = shared.tokenizer.clone();
    let mut batch = BatchLane::new(&models.model, &tokenizer, plan.limits, plan.budget)
        .with_drafting(
            models.draft.as_ref(),
            shared.ngram_draft,
            shared.num_draft_tokens,
        );
    if let Some(sharding) = &plan.sharding {
        let mut batch = batch.in_lockstep();
        return super::lockstep::run(&sharding.group, &mut shared, &mut batch, rx);
    }
    let mut waiting = Waiting::new(shared.reporter.counters.clone());
    let mut open = true;
    loop {
        if batch.is_idle() && waiting.is_empty() {
            if !open {
                break;
            }
            match rx.recv() {
                Ok(job) => waiting.push(job),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(job) => waiting.push(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if shared.reporter.aborting() {
            while let Some(job) = waiting.pop() {
                job.client
                    .send(super::GatewayEvent::Failed(GatewayError::ShuttingDown));
            }
        }
        admit(&mut shared, &models, &mut batch, &mut waiting);
        if !batch.is_idle() {
            batch.step(&mut shared);
        }
    }
}

/// Admits waiting jobs in order while their lane can take them.
fn admit(
    shared: &mut Shared,
    models: &LoadedModels,
    batch: &mut BatchLane<'_>,
    waiting: &mut Waiting,
) {
    let counters = shared.reporter.counters.clone();
    while let Some(front) = waiting.front() {
        if front.client.abandoned() {
            let job = waiting.pop().unwrap();
            shared.reporter.dropped(&job.client);
            continue;
        }
        match front.lane {
            Lane::Batch => {
                if !batch.can_admit(front) {
                    if batch.is_idle() {
                        // Submission refuses what can never fit; this is a guard.
                        let job = waiting.pop().unwrap();
                        shared.reporter.fail(
                            &job.client,
                            GatewayError::InvalidRequest(
                                "the request needs more KV memory than the budget".into(),
                            ),
                        );
                        continue;
                    }
                    break;
                }
                let job = waiting.pop().unwrap();
                batch.admit(shared, job);
            }
            Lane::Serial | Lane::Speculative => {
                if !batch.is_idle() {
                    break;
                }
                let job = waiting.pop().unwrap();
                counters.active.fetch_add(1, Ordering::SeqCst);
                // A panic in one request must not take the server down with it.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serial::run(shared, models, &job)
                }));
                if let Err(panic) = outcome {
                    let what = panic_message(&panic);
                    tracing::error!("generation panicked: {what}");
                    shared.reporter.fail(
                        &job.client,
                        GatewayError::Internal(format!("the engine panicked: {what}")),
                    );
                }
                counters.active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}
