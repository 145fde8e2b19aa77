//! The batch lane: requests become rows of the continuous batch
//! ([`BatchScheduler`]), each with its own sampler, grammar, stop strings and
//! stream, admitted while the KV budget allows.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::admission::{Admitted, KvBudget};
use super::job::{Client, Job};
use super::worker::Shared;
use super::{GatewayError, GatewayEvent};
use crate::decode::{BatchLimits, BatchScheduler, ConstraintSlot, Finished, Row};
use crate::model::Model;
use crate::speculative::{ModelDrafter, NgramDrafter};
use crate::tokenizer::Tokenizer;

struct RowInfo {
    client: Client,
    first_token: Rc<Cell<Option<Instant>>>,
    /// Lockstep: set when every rank cancels the row (see [`BatchLane::cancel`]).
    cancelled: Rc<Cell<bool>>,
}

pub(crate) struct BatchLane<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    limits: BatchLimits,
    scheduler: BatchScheduler<'a>,
    rows: HashMap<u64, RowInfo>,
    budget: KvBudget,
    admitted: Admitted,
    next_id: u64,
    /// Sharded serving (`lockstep`): a row ends only by what every rank
    /// sees, so a client that leaves cancels its row through
    /// [`BatchLane::cancel`], never from inside a step.
    lockstep: bool,
    drafting: Option<Drafting<'a>>,
}

/// How rows of a drafting server propose tokens.
struct Drafting<'a> {
    /// The draft model; `None`: prompt lookup.
    model: Option<&'a Model>,
    per_step: usize,
    /// The rows share the draft model's forward passes (its caches batch).
    shares: bool,
}

impl<'a> Drafting<'a> {
    fn shared_model(&self) -> Option<&'a Model> {
        self.model.filter(|_| self.shares)
    }
}

impl<'a> BatchLane<'a> {
    pub fn new(
        model: &'a Model,
        tokenizer: &'a Tokenizer,
        limits: BatchLimits,
        budget: KvBudget,
    ) -> Self {
        Self {
            model,
            tokenizer,
            limits,
            scheduler: Self::scheduler(model, limits, None),
            rows: HashMap::new(),
            budget,
            admitted: Admitted::default(),
            next_id: 0,
            lockstep: false,
            drafting: None,
        }
    }

    /// The batch's scheduler, keeping prompt checkpoints for the prompt
    /// cache, with the draft model its rows share.
    fn scheduler(
        model: &'a Model,
        limits: BatchLimits,
        drafting: Option<&Drafting<'a>>,
    ) -> BatchScheduler<'a> {
        let mut scheduler = BatchScheduler::new(model, limits);
        if let Some(draft) = drafting.and_then(|d| d.shared_model()) {
            scheduler = scheduler.with_draft_model(draft);
        }
        scheduler.keep_prompt_checkpoints();
        scheduler
    }

    /// Rows draft with `draft` (or by prompt lookup when `ngram`), `per_step`
    /// tokens at a time, and verify in the batch's forward pass.
    pub(crate) fn with_drafting(
        mut self,
        draft: Option<&'a Model>,
        ngram: bool,
        per_step: usize,
    ) -> Self {
        if draft.is_some() || ngram {
            let shares = draft.is_some_and(|d| crate::cache::can_batch_speculate(&d.make_caches()));
            self.drafting = Some(Drafting {
                model: draft,
                per_step,
                shares,
            });
            self.scheduler = Self::scheduler(self.model, self.limits, self.drafting.as_ref());
        }
        self
    }

    /// `row`, drafting as the server does: with the batch's shared draft
    /// model, a draft model of its own (one whose caches cannot drop a
    /// row's rejected drafts in a batch), or prompt lookup.
    fn drafting_row(&self, row: Row<'a>, job: &Job) -> anyhow::Result<Row<'a>> {
        let Some(d) = &self.drafting else {
            return Ok(row);
        };
        let sampling = &job.request.options.sampling;
        Ok(match d.model {
            Some(_) if d.shares => row.with_shared_draft_model(sampling, d.per_step)?,
            Some(model) => {
                row.with_drafter(Box::new(ModelDrafter::new(model, sampling)?), d.per_step)
            }
            None => row.with_drafter(Box::new(NgramDrafter::default()), d.per_step),
        })
    }

    /// Rows end only through [`BatchLane::cancel`] or by their own tokens.
    pub(crate) fn in_lockstep(mut self) -> Self {
        self.lockstep = true;
        self
    }

    /// Lockstep: rows whose client left (all rows when `aborting`), not yet cancelled.
    pub(crate) fn abandoned(&self, aborting: bool) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .rows
            .iter()
            .filter(|(_, r)| !r.cancelled.get() && (aborting || r.client.abandoned()))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Lockstep: cancels rows `ids`; they leave the batch in the next step.
    pub(crate) fn cancel(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(r) = self.rows.get(id) {
                r.cancelled.set(true);
            }
        }
    }

    pub fn is_idle(&self) -> bool {
        self.rows.is_empty()
    }

    fn tokens_of(job: &Job) -> usize {
        job.request.prompt.len() + job.request.options.max_tokens
    }

    /// Whether `job` can join now (room in the batch and in the KV budget).
    pub(crate) fn can_admit(&self, job: &Job) -> bool {
        self.scheduler.has_room() && self.admitted.can_admit(&self.budget, Self::tokens_of(job))
    }

    /// Makes `job` a row: compile its grammar, reuse what the prompt cache
    /// holds, and queue it for prefill.
    pub(crate) fn admit(&mut self, shared: &mut Shared, job: Job) {
        let reporter = shared.reporter.clone();
        let constraint = match &job.request.constraint {
            Some(spec) => match shared.constraint(spec) {
                Ok(c) => Some(ConstraintSlot::Owned(c)),
                Err(e) => return reporter.fail(&job.client, e),
            },
            None => None,
        };
        let (caches, cached) = shared.cached_prefix(self.model, &job.request.prompt);
        let sent = job.client.send(GatewayEvent::Started {
            prompt_tokens: job.request.prompt.len(),
            cached_tokens: cached,
        });
        if !sent && !self.lockstep {
            return reporter.dropped(&job.client);
        }
        let first_token = Rc::new(Cell::new(None));
        let cancelled = Rc::new(Cell::new(false));
        let lockstep = self.lockstep;
        let on_token = {
            let client = job.client.clone();
            let abort = reporter.abort.clone();
            let first_token = first_token.clone();
            let cancelled = cancelled.clone();
            let never = Arc::new(AtomicBool::new(false));
            Box::new(move |ev: &crate::generate::TokenEvent| {
                if first_token.get().is_none() {
                    first_token.set(Some(Instant::now()));
                }
                if lockstep {
                    client.send_token(ev, &never);
                    !cancelled.get()
                } else {
                    client.send_token(ev, &abort)
                }
            })
        };
        let alive: Box<dyn Fn() -> bool> = if lockstep {
            let cancelled = cancelled.clone();
            Box::new(move || !cancelled.get())
        } else {
            let client = job.client.clone();
            let abort = reporter.abort.clone();
            Box::new(move || !client.abandoned() && !abort.load(Ordering::Relaxed))
        };
        let row = match Row::new(
            self.model,
            self.tokenizer,
            job.request.prompt.clone(),
            cached,
            &job.request.options,
            constraint,
            on_token,
        )
        .and_then(|row| self.drafting_row(row, &job))
        {
            Ok(row) => row.with_liveness(alive),
            Err(e) => return reporter.fail(&job.client, GatewayError::Internal(format!("{e:#}"))),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.admitted.add(id, Self::tokens_of(&job));
        self.scheduler.insert(id, row, caches);
        self.rows.insert(
            id,
            RowInfo {
                client: job.client,
                first_token,
                cancelled,
            },
        );
        reporter.counters.active.fetch_add(1, Ordering::SeqCst);
        self.publish(shared);
    }

    /// One step of the batch; finished rows get their results.
    pub fn step(&mut self, shared: &mut Shared) {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.scheduler.step()));
        for (tokens, caches) in self.scheduler.take_checkpoints() {
            shared.prefixes.checkpoint(&tokens, &caches);
        }
        match outcome {
            Ok(Ok(finished)) => {
                for f in finished {
                    self.close(shared, f);
                }
            }
            Ok(Err(e)) => self.fail_all(shared, format!("{e:#}")),
            Err(panic) => {
                let what = super::worker::panic_message(&panic);
                tracing::error!("batch step panicked: {what}");
                self.fail_all(shared, format!("the engine panicked: {what}"));
            }
        }
        self.publish(shared);
    }

    fn close(&mut self, shared: &mut Shared, f: Finished) {
        let Some(info) = self.rows.remove(&f.id) else {
            return;
        };
        self.admitted.remove(f.id);
        shared
            .reporter
            .counters
            .active
            .fetch_sub(1, Ordering::SeqCst);
        let mut result = f.result;
        let tokens = std::mem::take(&mut result.cache_tokens);
        shared
            .reporter
            .finish(&info.client, result, info.first_token.get());
        shared.prefixes.store(tokens, f.caches);
    }

    /// The engine failed mid-step: every row fails, and the batch starts over.
    fn fail_all(&mut self, shared: &mut Shared, message: String) {
        self.scheduler = Self::scheduler(self.model, self.limits, self.drafting.as_ref());
        for (_, info) in self.rows.drain() {
            shared
                .reporter
                .counters
                .active
                .fetch_sub(1, Ordering::SeqCst);
            shared
                .reporter
                .fail(&info.client, GatewayError::Internal(message.clone()));
        }
        self.admitted = Admitted::default();
    }

    fn publish(&self, shared: &Shared) {
        let c = &shared.reporter.counters;
        c.batch_rows
            .store(self.scheduler.decoding(), Ordering::Relaxed);
        c.prefilling_rows
            .store(self.scheduler.pending(), Ordering::Relaxed);
        c.kv_bytes
            .store(self.scheduler.kv_bytes(), Ordering::Relaxed);
        c.kv_projected
            .store(self.admitted.projected(&self.budget), Ordering::Relaxed);
    }
}
