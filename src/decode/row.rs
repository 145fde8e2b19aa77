//! One sequence's decoding state, whatever produces its logits: sampling
//! (penalties, grammar mask, sampler with its own key), emitting (the
//! [`OutputSink`]), the tokens in its cache and its timings. The serial,
//! speculative and batch producers all decode through a `Row`.

use std::time::Instant;

use anyhow::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::draft_batch::{DraftRequest, SharedDraft};
use super::draft_width::{AcceptanceEstimate, DraftOutlook};
use crate::constraint::TokenConstraint;
use crate::generate::{
    apply_mask, token_logprob, FinishReason, GenerateOptions, GenerationResult, OutputSink,
    SpeculationStats, TokenEvent,
};
use crate::model::Model;
use crate::sampling::{log_softmax, Sampler};
use crate::speculative::DraftSource;
use crate::tokenizer::Tokenizer;

/// A row's grammar constraint: borrowed from the caller (one call decodes
/// one sequence) or owned (a row that lives in a batch).
pub enum ConstraintSlot<'a> {
    /// The caller's constraint, borrowed for one call.
    Borrowed(&'a mut (dyn TokenConstraint + 'static)),
    /// A constraint the row owns.
    Owned(Box<dyn TokenConstraint>),
}

impl ConstraintSlot<'_> {
    fn get(&mut self) -> &mut dyn TokenConstraint {
        match self {
            ConstraintSlot::Borrowed(c) => &mut **c,
            ConstraintSlot::Owned(c) => c.as_mut(),
        }
    }
}

/// The tokens XTC never removes, as mlx-lm picks them: the newline's ids
/// and the end-of-sequence ids.
fn xtc_special_tokens(tokenizer: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids = tokenizer.encode("\n")?;
    ids.extend(tokenizer.eos_ids.iter().copied());
    Ok(ids)
}

/// The outcome of checking a row's drafts against the target's logits.
pub(crate) struct Verdict {
    /// Drafts the target agreed with (emitted, and in the cache).
    pub accepted: usize,
    /// The target's own token after them, with its log-probabilities when
    /// the row reports them; `None` once the row finished.
    pub next: Option<(u32, Option<Array>)>,
}

/// Where a row's drafts come from.
enum Drafter<'a> {
    /// Its own drafter (prompt lookup, or a draft model with its own cache).
    Own(Box<dyn DraftSource + 'a>),
    /// The batch's draft model, whose forward passes the rows share.
    Shared(SharedDraft),
}

/// A row's drafter: proposes tokens that one forward pass then verifies.
struct Drafting<'a> {
    drafter: Drafter<'a>,
    per_step: usize,
    /// The drafter has seen the prompt.
    primed: bool,
    stats: SpeculationStats,
    /// Drafts the row could take at its last proposal.
    offered: usize,
    acceptance: AcceptanceEstimate,
}

/// One sequence being decoded: its prompt, sampler, constraint, output and timings,
/// whichever decoder (serial, speculative or batch) runs it.
pub struct Row<'a> {
    prompt: Vec<u32>,
    cached: usize,
    sampler: Sampler,
    constraint: Option<ConstraintSlot<'a>>,
    logprobs_k: Option<usize>,
    max_tokens: usize,
    sink: OutputSink<'a>,
    /// Tokens whose keys and values are in this row's cache, in order.
    pub(crate) fed: Vec<u32>,
    start: Instant,
    first_token_at: Option<Instant>,
    vocab: usize,
    /// Polled between steps: false once the consumer is gone.
    alive: Option<Box<dyn Fn() -> bool + 'a>>,
    drafting: Option<Drafting<'a>>,
    prefill_step: usize,
}

impl<'a> Row<'a> {
    /// A row for `prompt`, whose first `cached` tokens the caches already hold,
    /// decoded with `opts`; `on_token` sees every emitted token and returning false
    /// cancels the row.
    pub fn new(
        model: &Model,
        tokenizer: &'a Tokenizer,
        prompt: Vec<u32>,
        cached: usize,
        opts: &GenerateOptions,
        constraint: Option<ConstraintSlot<'a>>,
        on_token: Box<dyn FnMut(&TokenEvent) -> bool + 'a>,
    ) -> Result<Self> {
        model.check_token_ids(&prompt)?;
        let fed = prompt[..prompt.len().saturating_sub(1)].to_vec();
        let mut sampler = Sampler::new(opts.sampling.clone())?;
        if opts.sampling.xtc_probability > 0.0 {
            sampler = sampler.with_xtc_special(xtc_special_tokens(tokenizer)?);
        }
        Ok(Self {
            sampler,
            constraint,
            logprobs_k: opts.logprobs,
            max_tokens: opts.max_tokens,
            sink: OutputSink::boxed(tokenizer, opts, on_token),
            fed,
            prompt,
            cached,
            start: Instant::now(),
            first_token_at: None,
            vocab: model.vocab_size(),
            alive: None,
            drafting: None,
            prefill_step: opts.prefill_step,
        })
    }

    /// Decodes speculatively: `drafter` proposes up to `per_step` tokens at
    /// every step, which the batch's forward pass verifies.
    pub fn with_drafter(self, drafter: Box<dyn DraftSource + 'a>, per_step: usize) -> Self {
        self.drafting_with(Drafter::Own(drafter), per_step)
    }

    /// Decodes speculatively with the batch's draft model (see
    /// [`super::DecodeBatch::with_draft_model`]), `per_step` tokens at a
    /// time, sampling drafts as `sampling` asks.
    pub fn with_shared_draft_model(
        self,
        sampling: &crate::sampling::SamplingParams,
        per_step: usize,
    ) -> Result<Self> {
        Ok(self.drafting_with(Drafter::Shared(SharedDraft::new(sampling)?), per_step))
    }

    fn drafting_with(mut self, drafter: Drafter<'a>, per_step: usize) -> Self {
        self.drafting = Some(Drafting {
            drafter,
            per_step: per_step.max(1),
            primed: false,
            stats: SpeculationStats::default(),
            offered: 0,
            acceptance: AcceptanceEstimate::default(),
        });
        self
    }

    /// What the batch's choice of a draft width needs to know of the row;
    /// `None` for a row without a drafter.
    pub(crate) fn draft_outlook(&self) -> Option<DraftOutlook> {
        let d = self.drafting.as_ref()?;
        Some(DraftOutlook {
            want: d.per_step.min(self.remaining()),
            acceptance: d.acceptance.probability(),
            fixed: self.draft_width_fixed(),
        })
    }

    /// Whether the row's output depends on how many drafts it verifies: a
    /// sampled row draws every verified position with one key, so it always
    /// verifies all it may take.
    pub(crate) fn draft_width_fixed(&self) -> bool {
        !self.sampler.params.is_greedy()
    }

    /// Tokens the row may still emit.
    fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.sink.tokens.len())
    }

    pub(crate) fn drafts(&self) -> bool {
        self.drafting.is_some()
    }

    /// Whether the row drafts with the batch's draft model.
    pub(crate) fn shares_draft_model(&self) -> bool {
        matches!(
            self.drafting,
            Some(Drafting {
                drafter: Drafter::Shared(_),
                ..
            })
        )
    }

    /// Whether the row's history is in the batch's draft cache.
    pub(crate) fn in_draft_cache(&self) -> bool {
        match &self.drafting {
            Some(Drafting {
                drafter: Drafter::Shared(s),
                ..
            }) => s.is_primed(),
            _ => false,
        }
    }

    /// What a row drafting with the batch's draft model asks of this round,
    /// `pending` being the token this step feeds.
    /// At most `cap` drafts.
    pub(crate) fn draft_request(&mut self, pending: u32, cap: usize) -> Option<DraftRequest<'_>> {
        let remaining = self.remaining();
        let Some(Drafting {
            drafter: Drafter::Shared(state),
            per_step,
            offered,
            ..
        }) = self.drafting.as_mut()
        else {
            return None;
        };
        // As mlx-lm: never more drafts than tokens left to emit.
        *offered = (*per_step).min(remaining).min(cap);
        let mut history = Vec::with_capacity(self.fed.len() + 1);
        history.extend_from_slice(&self.fed);
        history.push(pending);
        Some(DraftRequest {
            state,
            history,
            want: *offered,
            guide: self.constraint.as_mut().map(|c| c.get()),
        })
    }

    /// The drafter's proposal to follow `pending` (the token this step
    /// feeds), at most `cap` tokens, under the row's grammar; empty for a
    /// row without a drafter.
    pub(crate) fn propose(&mut self, pending: u32, cap: usize) -> Result<Vec<u32>> {
        let remaining = self.remaining();
        let Some(d) = self.drafting.as_mut() else {
            return Ok(Vec::new());
        };
        let Drafter::Own(drafter) = &mut d.drafter else {
            anyhow::bail!("a row drafting with the batch's draft model drafts through the batch");
        };
        if !d.primed {
            drafter.prefill(&self.fed, self.prefill_step)?;
            d.primed = true;
        }
        // As mlx-lm: never more drafts than tokens left to emit.
        let want = d.per_step.min(remaining).min(cap);
        d.offered = want;
        if want == 0 {
            return Ok(Vec::new());
        }
        let mut history = Vec::with_capacity(self.fed.len() + 1);
        history.extend_from_slice(&self.fed);
        history.push(pending);
        let guide = self.constraint.as_mut().map(|c| c.get());
        let Some(drafts) = drafter.draft(&history, want, guide)? else {
            return Ok(Vec::new());
        };
        let drafts = drafts.as_dtype(mlx_rs::Dtype::Uint32)?;
        mlx_rs::transforms::eval([&drafts])?;
        Ok(drafts.as_slice::<u32>().to_vec())
    }

    /// Checks `proposal` against the target's `logits` `[n + 1, vocab]` (the
    /// positions after this row's pending token, whose key the caller has
    /// put in `fed`): position `i` is sampled as it would be without drafts
    /// (penalties over what was emitted before it, the grammar after it);
    /// drafts are accepted while they equal the samples, and each accepted
    /// one is emitted. `greedy`, the argmax of each position when the caller
    /// computed it for many rows, serves plain greedy rows. Rows without a
    /// grammar or penalties draw every position in one sampler call, as
    /// mlx-lm's speculative loop does.
    pub(crate) fn verify(
        &mut self,
        logits: &Array,
        proposal: &[u32],
        greedy: Option<&[i32]>,
    ) -> Result<Verdict> {
        let n = proposal.len();
        let at_once = self.constraint.is_none() && !self.sampler.params.has_processors();
        let (drawn, logprobs): (Option<Vec<u32>>, Option<Array>) = match greedy {
            Some(g) if self.is_plain_greedy() => {
                (Some(g[..=n].iter().map(|&t| t as u32).collect()), None)
            }
            _ if at_once => {
                let logprobs = log_softmax(logits)?;
                let tokens = self
                    .sampler
                    .sample(&logprobs)?
                    .as_dtype(mlx_rs::Dtype::Uint32)?;
                mlx_rs::transforms::eval([&tokens])?;
                let keep = self.logprobs_k.is_some().then_some(logprobs);
                (Some(tokens.as_slice::<u32>().to_vec()), keep)
            }
            _ => (None, None),
        };
        let mut accepted = 0;
        // Accepted drafts that reached the output (an end token does not).
        let mut delivered = 0;
        for i in 0..=n {
            let at = i as i32;
            let (token, lp) = match &drawn {
                Some(tokens) => (tokens[i], logprobs.as_ref().map(|l| l.index(at..at + 1))),
                None => {
                    let (t, lp) = self.sample(logits.index(at..at + 1))?;
                    (t.item_cast::<u32>(), Some(lp))
                }
            };
            if i == n || token != proposal[i] {
                self.settle_drafts(n, accepted, delivered)?;
                return Ok(Verdict {
                    accepted,
                    next: Some((token, lp)),
                });
            }
            accepted += 1;
            self.fed.push(token);
            let before = self.generated();
            let go_on = self.emit(token, lp.as_ref())?;
            delivered += usize::from(self.generated() > before);
            if !go_on {
                break;
            }
        }
        self.settle_drafts(n, accepted, delivered)?;
        Ok(Verdict {
            accepted,
            next: None,
        })
    }

    /// Tells the drafter how many of its `drafted` tokens were accepted;
    /// counts the `delivered` ones.
    fn settle_drafts(&mut self, drafted: usize, accepted: usize, delivered: usize) -> Result<()> {
        let Some(d) = self.drafting.as_mut() else {
            return Ok(());
        };
        match &mut d.drafter {
            Drafter::Own(drafter) => drafter.rewind(drafted, accepted)?,
            Drafter::Shared(state) => state.rewind(drafted, accepted),
        }
        d.acceptance
            .observe(std::mem::take(&mut d.offered), accepted);
        d.stats.target_calls += 1;
        d.stats.drafted += drafted;
        d.stats.accepted += delivered;
        Ok(())
    }

    /// Adds a check the batch polls between steps (client still connected).
    pub(crate) fn with_liveness(mut self, alive: Box<dyn Fn() -> bool + 'a>) -> Self {
        self.alive = Some(alive);
        self
    }

    /// The prompt's token ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// How many leading prompt tokens came from the prompt cache.
    pub fn cached(&self) -> usize {
        self.cached
    }

    /// The most tokens the row may generate.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens emitted so far.
    pub fn generated(&self) -> usize {
        self.sink.tokens.len()
    }

    /// Whether the row has ended (a finish reason is set).
    pub fn is_finished(&self) -> bool {
        self.sink.finish.is_some()
    }

    /// Whether the consumer still wants this row.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.as_ref().is_none_or(|f| f())
    }

    /// Greedy with nothing that needs per-row logits work: a batch of such
    /// rows samples with one argmax.
    pub(crate) fn is_plain_greedy(&self) -> bool {
        self.sampler.params.is_greedy()
            && !self.sampler.params.has_processors()
            && self.constraint.is_none()
            && self.logprobs_k.is_none()
    }

    /// Samples the next token from `logits` `[1, vocab]`: penalties and bias,
    /// the grammar mask, log-softmax, then the sampler. Returns the token
    /// `[1]` and the log-probabilities `[1, vocab]`, both still lazy.
    pub fn sample(&mut self, logits: Array) -> Result<(Array, Array)> {
        let mut logits = self
            .sampler
            .process(logits, &self.prompt, &self.sink.tokens)?;
        if let Some(c) = self.constraint.as_mut() {
            if let Some(mask) = c.get().mask(self.vocab)? {
                logits = apply_mask(&logits, &mask)?;
            }
        }
        let logprobs = log_softmax(&logits)?;
        let token = self.sampler.sample(&logprobs)?;
        Ok((token, logprobs))
    }

    /// Emits a sampled token (its log-probabilities from the step that drew
    /// it) and advances the grammar; false once the row is finished.
    pub(crate) fn emit(&mut self, token: u32, logprobs: Option<&Array>) -> Result<bool> {
        self.first_token_at.get_or_insert_with(Instant::now);
        let logprob = match (self.logprobs_k, logprobs) {
            (Some(k), Some(lp)) => Some(token_logprob(lp, token, k)?),
            _ => None,
        };
        if !self.sink.emit(token, logprob)? {
            return Ok(false);
        }
        if let Some(c) = self.constraint.as_mut() {
            let c = c.get();
            c.commit(token)?;
            if c.is_finished() {
                self.sink.finish_with(FinishReason::Stop);
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(crate) fn finish_with(&mut self, reason: FinishReason) {
        self.sink.finish_with(reason);
    }

    /// Closes the row: held-back text, timings, counts.
    pub(crate) fn into_result(self) -> Result<GenerationResult> {
        let Row {
            prompt,
            cached,
            sink,
            fed,
            start,
            first_token_at,
            drafting,
            ..
        } = self;
        let speculation = drafting.map(|d| d.stats);
        sink.into_result(&prompt, cached, start, first_token_at, fed, speculation)
    }
}
