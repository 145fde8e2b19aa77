//! A draft model shared by the rows of a batch: one draft cache holding every
//! drafting row, and one forward pass of the draft model per drafted
//! position for all of them, where each row drafting alone would run its own
//! passes. Each row keeps what [`crate::speculative::ModelDrafter`] keeps for
//! one sequence (its sampler, how much of its history the draft cache holds)
//! in a [`SharedDraft`], so a row drafts the tokens it would draft alone.

use anyhow::{ensure, Result};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use crate::cache::{empty_batch_like, KvCache};
use crate::constraint::TokenConstraint;
use crate::generate::{apply_mask, prefill};
use crate::model::Model;
use crate::sampling::{log_softmax, Sampler, SamplingParams};
use crate::speculative::draft_sampling;

/// One row's drafting state against the shared draft cache.
pub(crate) struct SharedDraft {
    sampler: Sampler,
    /// The row's history is in the draft cache (it joined the cache).
    primed: bool,
    /// History tokens the draft cache holds for the row.
    seen: usize,
    /// History length when the row last drafted.
    history_len: usize,
    /// Positions to drop from the row's draft cache once verified.
    trim: usize,
}

impl SharedDraft {
    /// A row drafting with the request's temperature, top-p, top-k and min-p
    /// (its seed plus one), as a draft model drafting alone does.
    pub(crate) fn new(sampling: &SamplingParams) -> Result<Self> {
        Ok(Self {
            sampler: Sampler::new(draft_sampling(sampling))?,
            primed: false,
            seen: 0,
            history_len: 0,
            trim: 0,
        })
    }

    pub(crate) fn is_primed(&self) -> bool {
        self.primed
    }

    /// After verification: of `drafted` tokens, `accepted` were accepted.
    /// The cache keeps the accepted drafts it was fed (all but the last
    /// draft); the rest is dropped at the next [`DraftBatch::settle`].
    pub(crate) fn rewind(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let keep = accepted.min(drafted - 1);
        self.trim += (drafted - 1) - keep;
        self.seen = self.history_len + keep;
    }
}

/// What a row asks of one drafting round.
pub(crate) struct DraftRequest<'r> {
    pub state: &'r mut SharedDraft,
    /// The row's tokens so far: in its cache, then the pending one.
    pub history: Vec<u32>,
    /// Drafts it may take (0: none this round).
    pub want: usize,
    /// The row's grammar after `history`, which drafts must follow.
    pub guide: Option<&'r mut dyn TokenConstraint>,
}

/// The draft model and its batch cache, one row per primed drafting row, in
/// the batch's row order.
pub(crate) struct DraftBatch<'a> {
    model: &'a Model,
    caches: Vec<Box<dyn KvCache>>,
    /// Rows in the draft cache.
    rows: usize,
    prefill_step: usize,
}

impl<'a> DraftBatch<'a> {
    pub(crate) fn new(model: &'a Model, prefill_step: usize) -> Self {
        Self {
            model,
            caches: Vec::new(),
            rows: 0,
            prefill_step,
        }
    }

    /// Puts a row's history but its last token into the cache, as a row of
    /// its own appended after the others.
    fn prime(&mut self, state: &mut SharedDraft, history: &[u32]) -> Result<()> {
        let fed = &history[..history.len() - 1];
        let mut single = self.model.make_caches();
        prefill(self.model, &mut single, fed, self.prefill_step)?;
        if self.caches.is_empty() {
            self.caches = empty_batch_like(&single)?;
        }
        for (batch, one) in self.caches.iter_mut().zip(single) {
            batch
                .as_batch_mut()
                .expect("draft layers hold batch caches")
                .push_row(one.as_ref())?;
        }
        self.rows += 1;
        state.primed = true;
        state.seen = fed.len();
        Ok(())
    }

    /// Drops what each row's verification rejected (`requests` are every
    /// primed row, in order).
    fn settle(&mut self, states: &mut [&mut SharedDraft]) -> Result<()> {
        if states.iter().all(|s| s.trim == 0) {
            return Ok(());
        }
        let trims: Vec<usize> = states
            .iter_mut()
            .map(|s| std::mem::take(&mut s.trim))
            .collect();
        self.trim_rows(&trims)
    }

    fn trim_rows(&mut self, trims: &[usize]) -> Result<()> {
        if trims.iter().all(|&t| t == 0) {
            return Ok(());
        }
        for c in self.caches.iter_mut() {
            c.as_batch_mut()
                .expect("draft layers hold batch caches")
                .trim_rows(trims)?;
        }
        Ok(())
    }

    /// Keeps the rows at `keep` (indices into the draft cache's rows).
    pub(crate) fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if keep.len() == self.rows {
            return Ok(());
        }
        self.rows = keep.len();
        if keep.is_empty() {
            self.caches.clear();
            return Ok(());
        }
        for c in self.caches.iter_mut() {
            c.as_batch_mut()
                .expect("draft layers hold batch caches")
                .filter(keep)?;
        }
        Ok(())
    }

    /// Drafts for every request at once: requests are the rows that draft
    /// with this model, in the batch's order, those already in the cache
    /// first (a row joins the cache at its first round). Returns each row's
    /// drafts (at most its `want`; fewer once its grammar is complete).
    pub(crate) fn propose(&mut self, requests: &mut [DraftRequest<'_>]) -> Result<Vec<Vec<u32>>> {
        let primed = requests.iter().filter(|r| r.state.primed).count();
        ensure!(
            primed == self.rows && requests[..primed].iter().all(|r| r.state.primed),
            "the draft cache holds {} rows, the batch {primed} primed ones",
            self.rows
        );
        {
            let mut states: Vec<&mut SharedDraft> = requests[..primed]
                .iter_mut()
                .map(|r| &mut *r.state)
                .collect();
            self.settle(&mut states)?;
        }
        for r in requests.iter_mut().skip(primed) {
            self.prime(r.state, &r.history)?;
        }
        let steps = requests.iter().map(|r| r.want).max().unwrap_or(0);
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
        if steps == 0 || requests.is_empty() {
            return Ok(drafts);
        }
        let mut guides: Vec<Option<Box<dyn TokenConstraint>>> = requests
            .iter_mut()
            .map(|r| match r.guide.as_mut() {
                Some(g) if !g.is_finished() => g.fork().ok(),
                _ => None,
            })
            .collect();
        // The first pass feeds each row's fresh history (one or two tokens),
        // right-padded to the widest; the padding is dropped after it.
        let fresh: Vec<&[u32]> = requests
            .iter()
            .map(|r| &r.history[r.state.seen.min(r.history.len())..])
            .collect();
        let width = fresh.iter().map(|f| f.len()).max().unwrap_or(1).max(1);
        let mut input = Vec::with_capacity(requests.len() * width);
        for f in &fresh {
            let pad = f.last().copied().unwrap_or(0);
            input.extend(f.iter().map(|&t| t as i32));
            input.extend(std::iter::repeat_n(pad as i32, width - f.len()));
        }
        let rows = requests.len() as i32;
        let mut logits = self.model.forward(
            &Array::from_slice(&input, &[rows, width as i32]),
            &mut self.caches,
        )?;
        let pads: Vec<usize> = fresh.iter().map(|f| width - f.len()).collect();
        let last: Vec<i32> = fresh.iter().map(|f| f.len().max(1) as i32 - 1).collect();
        logits = logits.take_along_axis(Array::from_slice(&last, &[rows, 1, 1]), 1)?;
        self.trim_rows(&pads)?;
        let vocab = self.model.vocab_size();
        let mut done: Vec<bool> = requests.iter().map(|r| r.want == 0).collect();
        for step in 0..steps {
            let last = logits.reshape(&[rows, -1])?;
            let tokens = self.sample(requests, &mut guides, &done, &last, vocab)?;
            for (i, r) in requests.iter().enumerate() {
                if done[i] {
                    continue;
                }
                drafts[i].push(tokens[i]);
                let finished = guides[i].as_ref().is_some_and(|g| g.is_finished());
                if drafts[i].len() >= r.want || finished {
                    done[i] = true;
                }
            }
            if step + 1 == steps || done.iter().all(|&d| d) {
                break;
            }
            let next: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
            logits = self
                .model
                .forward(&Array::from_slice(&next, &[rows, 1]), &mut self.caches)?;
        }
        // Passes after the first fed `passes - 1` tokens per row; a row keeps
        // the fresh tokens and all its drafts but the last, as drafting alone.
        let passes = drafts.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut junk = Vec::with_capacity(requests.len());
        for (r, d) in requests.iter_mut().zip(&drafts) {
            let fed_after_fresh = passes - 1;
            if d.is_empty() {
                junk.push(fresh_len(r) + fed_after_fresh);
            } else {
                junk.push(fed_after_fresh - (d.len() - 1));
                r.state.history_len = r.history.len();
            }
        }
        self.trim_rows(&junk)?;
        Ok(drafts)
    }

    /// One token per row from `logits` `[rows, vocab]`: each row's grammar
    /// mask and sampler, or one argmax when every row is greedy and free.
    fn sample(
        &self,
        requests: &mut [DraftRequest<'_>],
        guides: &mut [Option<Box<dyn TokenConstraint>>],
        done: &[bool],
        logits: &Array,
        vocab: usize,
    ) -> Result<Vec<u32>> {
        let plain = requests.iter().all(|r| r.state.sampler.params.is_greedy())
            && guides.iter().all(Option::is_none);
        let tokens: Vec<u32> = if plain {
            let t = argmax_axis(logits, -1, None)?.as_dtype(Dtype::Int32)?;
            eval([&t])?;
            t.as_slice::<i32>().iter().map(|&t| t as u32).collect()
        } else {
            let mut drawn = Vec::with_capacity(requests.len());
            for (i, r) in requests.iter_mut().enumerate() {
                if done[i] {
                    // A row that stopped draws nothing, so its sampler's
                    // keys follow the ones it would draw alone.
                    drawn.push(Array::from_slice(&[0i32], &[1]));
                    continue;
                }
                let j = i as i32;
                let mut row = logits.index(j..j + 1);
                if let Some(g) = guides[i].as_mut() {
                    if let Some(mask) = g.mask(vocab)? {
                        row = apply_mask(&row, &mask)?;
                    }
                }
                drawn.push(r.state.sampler.sample(&log_softmax(&row)?)?);
            }
            let all = mlx_rs::ops::concatenate(&drawn, 0)?.as_dtype(Dtype::Int32)?;
            eval([&all])?;
            all.as_slice::<i32>().iter().map(|&t| t as u32).collect()
        };
        for (i, g) in guides.iter_mut().enumerate() {
            if let Some(g) = g.as_mut().filter(|_| !done[i]) {
                g.commit(tokens[i])?;
            }
        }
        Ok(tokens)
    }
}

/// Tokens of a request's history the draft cache had not seen.
fn fresh_len(r: &DraftRequest<'_>) -> usize {
    r.history.len() - r.state.seen.min(r.history.len())
}
