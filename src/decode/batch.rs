//! Many rows decoded together, one token per row per step, as mlx-lm's
//! `GenerationBatch`: one forward pass over `[rows, 1]` with a batch cache,
//! then per-row sampling (a single argmax when every row is plain greedy).
//! The next forward pass is queued before the tokens are read, so host work
//! (detokenizing, stop strings, grammar masks, streaming) overlaps compute.
//! Rows join with their own prefilled cache and leave the step they finish.
//! Drafting rows verify their drafts in the same pass, as many as the
//! measured step times say pay ([`DraftWidths`]).

use std::time::Instant;

use anyhow::{ensure, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype};

use super::draft_batch::DraftBatch;
use super::draft_width::{DraftOutlook, DraftWidths};
use super::row::Row;
use crate::cache::{empty_batch_like, KvCache};
use crate::generate::{FinishReason, GenerationResult};
use crate::model::Model;

/// A row that left the batch: its result and its cache (which holds
/// `result.cache_tokens`), for the prompt cache.
pub struct Finished {
    /// The id the row was inserted with.
    pub id: u64,
    /// The row's generation result.
    pub result: GenerationResult,
    /// The row's own cache per layer, cut from the batch cache.
    pub caches: Vec<Box<dyn KvCache>>,
}

struct Member<'a> {
    id: u64,
    row: Row<'a>,
    /// The row's input this step is its last prompt token, not a sampled one.
    joining: bool,
    /// Log-probabilities of the distribution its pending token was drawn from.
    logprobs: Option<Array>,
}

/// Rows decoding together, one token per row per forward pass, over one batch cache
/// (mlx-lm's `GenerationBatch`).
pub struct DecodeBatch<'a> {
    model: &'a Model,
    members: Vec<Member<'a>>,
    caches: Vec<Box<dyn KvCache>>,
    /// `[rows]` int32: each row's next input token (lazy).
    inputs: Option<Array>,
    /// The draft model rows may share (`Row::with_shared_draft_model`).
    draft: Option<DraftBatch<'a>>,
    /// `None`: every drafting row verifies all it may take.
    widths: Option<DraftWidths>,
}

impl<'a> DecodeBatch<'a> {
    /// An empty batch for `model`.
    pub fn new(model: &'a Model) -> Self {
        Self {
            model,
            members: Vec::new(),
            caches: Vec::new(),
            inputs: None,
            draft: None,
            widths: Some(DraftWidths::default()),
        }
    }

    /// Whether drafting rows verify as many drafts as measured step times
    /// say pay (the default) or all they may take.
    pub fn measuring_draft_width(mut self, on: bool) -> Self {
        self.widths = on.then(DraftWidths::default);
        self
    }

    /// Rows that draft with `draft` share its forward passes: one pass per
    /// drafted position for all of them (prompts prefilled in chunks of
    /// `prefill_step` as they join).
    pub fn with_draft_model(mut self, draft: &'a Model, prefill_step: usize) -> Self {
        self.draft = Some(DraftBatch::new(draft, prefill_step));
        self
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The ids of the rows in the batch, in row order.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.members.iter().map(|m| m.id)
    }

    /// Device bytes of the batch's keys and values.
    pub fn kv_bytes(&self) -> usize {
        crate::cache::total_bytes(&self.caches)
    }

    /// Adds a row whose `caches` hold all of its prompt but the last token,
    /// `last`, which becomes its input at the next step.
    pub fn join(
        &mut self,
        id: u64,
        row: Row<'a>,
        caches: Vec<Box<dyn KvCache>>,
        last: u32,
    ) -> Result<()> {
        ensure!(
            caches.len() == self.model.decoder.cache_count(),
            "a joining row has {} cache layers, the model {}",
            caches.len(),
            self.model.decoder.cache_count()
        );
        if self.caches.is_empty() {
            self.caches = empty_batch_like(&caches)?;
        }
        for (batch, single) in self.caches.iter_mut().zip(caches) {
            let batch = batch
                .as_batch_mut()
                .expect("batch layers hold batch caches");
            batch.push_row(single.as_ref())?;
        }
        let token = Array::from_slice(&[last as i32], &[1]);
        self.inputs = Some(match self.inputs.take() {
            Some(inputs) => concatenate(&[inputs, token], 0)?,
            None => token,
        });
        self.members.push(Member {
            id,
            row,
            joining: true,
            logprobs: None,
        });
        Ok(())
    }

    /// One step: forward every row's input, emit the tokens drawn at the
    /// previous step, sample the next ones, and let finished rows go.
    pub fn step(&mut self) -> Result<Vec<Finished>> {
        if self.members.iter().any(|m| m.row.drafts()) {
            return self.speculative_step();
        }
        let Some(inputs) = self.inputs.take() else {
            return Ok(Vec::new());
        };
        let rows = self.members.len() as i32;
        let logits = self
            .model
            .forward_last(&inputs.reshape(&[rows, 1])?, &mut self.caches)?;
        async_eval([&logits])?;
        let tokens: Vec<i32> = inputs.as_slice::<i32>().to_vec();

        let mut keep = Vec::with_capacity(self.members.len());
        for (i, m) in self.members.iter_mut().enumerate() {
            let token = tokens[i] as u32;
            m.row.fed.push(token);
            let alive = if m.joining {
                m.joining = false;
                m.row.is_alive()
            } else {
                m.row.emit(token, m.logprobs.as_ref())? && m.row.is_alive()
            };
            if alive {
                keep.push(i);
            } else if !m.row.is_finished() {
                m.row.finish_with(FinishReason::Cancelled);
            }
        }
        let finished = self.release(&keep)?;
        if keep.is_empty() {
            return Ok(finished);
        }

        let logits = if keep.len() == tokens.len() {
            logits
        } else {
            let ids: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
            logits.take_axis(Array::from_slice(&ids, &[ids.len() as i32]), 0)?
        };
        let next = if self.members.iter().all(|m| m.row.is_plain_greedy()) {
            self.members.iter_mut().for_each(|m| m.logprobs = None);
            argmax_axis(&logits, -1, None)?.as_dtype(Dtype::Int32)?
        } else {
            let mut drawn = Vec::with_capacity(self.members.len());
            for (j, m) in self.members.iter_mut().enumerate() {
                let j = j as i32;
                let (token, logprobs) = m.row.sample(logits.index(j..j + 1))?;
                drawn.push(token.as_dtype(Dtype::Int32)?);
                m.logprobs = Some(logprobs);
            }
            concatenate(&drawn, 0)?
        };
        async_eval([&next])?;
        self.inputs = Some(next);
        Ok(finished)
    }

    /// A step with drafts: emit every row's pending token, choose how many
    /// drafts pay this step, let each drafting row propose up to that many
    /// (a sampled row: its `k`), verify all rows in one forward pass over
    /// `[rows, 1 + widest proposal]` (shorter rows padded), walk each row's
    /// proposal with its own sampler and grammar, and drop every row's
    /// rejected positions from the caches.
    fn speculative_step(&mut self) -> Result<Vec<Finished>> {
        let start = Instant::now();
        let Some(inputs) = self.inputs.take() else {
            return Ok(Vec::new());
        };
        let inputs = inputs.as_dtype(Dtype::Int32)?;
        eval([&inputs])?;
        let pending: Vec<u32> = inputs.as_slice::<i32>().iter().map(|&t| t as u32).collect();

        let mut keep = Vec::with_capacity(self.members.len());
        for (i, m) in self.members.iter_mut().enumerate() {
            let alive = if m.joining {
                m.joining = false;
                m.row.is_alive()
            } else {
                m.row.emit(pending[i], m.logprobs.as_ref())? && m.row.is_alive()
            };
            if alive {
                keep.push(i);
            } else if !m.row.is_finished() {
                m.row.finish_with(FinishReason::Cancelled);
            }
        }
        let mut finished = self.release(&keep)?;
        if self.members.is_empty() {
            return Ok(finished);
        }
        let pending: Vec<u32> = keep.iter().map(|&i| pending[i]).collect();

        let chosen = match self.widths.as_mut() {
            Some(widths) => {
                let outlooks: Vec<DraftOutlook> = self
                    .members
                    .iter()
                    .filter_map(|m| m.row.draft_outlook())
                    .collect();
                widths.choose(self.members.len(), &outlooks)
            }
            None => usize::MAX,
        };
        let rows_verified = self.members.len();
        let drafts = self.propose(&pending, chosen)?;
        let width = drafts.iter().map(Vec::len).max().unwrap_or(0);
        let mut input = Vec::with_capacity(pending.len() * (width + 1));
        for (&p, d) in pending.iter().zip(&drafts) {
            input.push(p as i32);
            input.extend(d.iter().map(|&t| t as i32));
            input.extend(std::iter::repeat_n(p as i32, width - d.len()));
        }
        let rows = pending.len() as i32;
        let input = Array::from_slice(&input, &[rows, width as i32 + 1]);
        let logits = self.model.forward(&input, &mut self.caches)?;
        let greedy: Option<Vec<i32>> = if self.members.iter().any(|m| m.row.is_plain_greedy()) {
            let g = argmax_axis(&logits, -1, None)?.as_dtype(Dtype::Int32)?;
            eval([&g])?;
            Some(g.as_slice::<i32>().to_vec())
        } else {
            None
        };

        let mut keep = Vec::with_capacity(self.members.len());
        let mut next = Vec::with_capacity(self.members.len());
        let mut trims = Vec::with_capacity(self.members.len());
        let stride = width + 1;
        for (r, m) in self.members.iter_mut().enumerate() {
            let proposal = &drafts[r];
            m.row.fed.push(pending[r]);
            let positions = (proposal.len() + 1) as i32;
            let row_logits = logits.index((r as i32, ..positions, ..));
            let row_greedy = greedy.as_ref().map(|g| &g[r * stride..(r + 1) * stride]);
            let verdict = m.row.verify(&row_logits, proposal, row_greedy)?;
            trims.push(width - verdict.accepted);
            match verdict.next {
                Some((token, logprobs)) if m.row.is_alive() => {
                    keep.push(r);
                    next.push(token as i32);
                    m.logprobs = logprobs;
                }
                _ => {
                    if !m.row.is_finished() {
                        m.row.finish_with(FinishReason::Cancelled);
                    }
                }
            }
        }
        for c in self.caches.iter_mut() {
            c.as_batch_mut()
                .expect("batch layers hold batch caches")
                .trim_rows(&trims)?;
        }
        finished.extend(self.release(&keep)?);
        if !next.is_empty() {
            self.inputs = Some(Array::from_slice(&next, &[next.len() as i32]));
        }
        if let Some(widths) = self.widths.as_mut() {
            widths.record(rows_verified, chosen, start.elapsed().as_secs_f64());
        }
        Ok(finished)
    }

    /// Every row's drafts to follow its `pending` token, at most `width`
    /// (a sampled row: all it may take): rows sharing the draft model draft
    /// together, the others each with its own drafter.
    fn propose(&mut self, pending: &[u32], width: usize) -> Result<Vec<Vec<u32>>> {
        let cap = |row: &Row| {
            if row.draft_width_fixed() {
                usize::MAX
            } else {
                width
            }
        };
        let mut drafts = vec![Vec::new(); self.members.len()];
        let mut shared = Vec::new();
        for (i, (m, &p)) in self.members.iter_mut().zip(pending).enumerate() {
            if !m.row.shares_draft_model() {
                drafts[i] = m.row.propose(p, cap(&m.row))?;
            } else {
                shared.push(i);
            }
        }
        if shared.is_empty() {
            return Ok(drafts);
        }
        let Some(draft) = self.draft.as_mut() else {
            anyhow::bail!("rows share a draft model, but the batch has none");
        };
        let mut requests = Vec::with_capacity(shared.len());
        for (i, m) in self.members.iter_mut().enumerate() {
            let cap = cap(&m.row);
            if let Some(request) = m.row.draft_request(pending[i], cap) {
                requests.push(request);
            }
        }
        // Rows join the draft cache in the round after they join the batch,
        // so those in it are the first ones, in batch order.
        let proposals = draft.propose(&mut requests)?;
        for (i, d) in shared.into_iter().zip(proposals) {
            drafts[i] = d;
        }
        Ok(drafts)
    }

    /// Removes every row not in `keep` (indices into the current members),
    /// handing back its result and its cache.
    fn release(&mut self, keep: &[usize]) -> Result<Vec<Finished>> {
        if keep.len() == self.members.len() {
            return Ok(Vec::new());
        }
        if let Some(draft) = self.draft.as_mut() {
            let mut cached = 0;
            let mut kept = Vec::new();
            for (i, m) in self.members.iter().enumerate() {
                if m.row.in_draft_cache() {
                    if keep.contains(&i) {
                        kept.push(cached);
                    }
                    cached += 1;
                }
            }
            draft.filter(&kept)?;
        }
        let mut finished = Vec::new();
        let members = std::mem::take(&mut self.members);
        for (i, m) in members.into_iter().enumerate() {
            if keep.contains(&i) {
                self.members.push(m);
                continue;
            }
            let caches = self
                .caches
                .iter_mut()
                .map(|c| -> Result<Box<dyn KvCache>> {
                    let batch = c.as_batch_mut().expect("batch layers hold batch caches");
                    batch.extract(i)
                })
                .collect::<Result<Vec<_>>>()?;
            finished.push(Finished {
                id: m.id,
                result: m.row.into_result()?,
                caches,
            });
        }
        for c in self.caches.iter_mut() {
            c.as_batch_mut()
                .expect("batch layers hold batch caches")
                .filter(keep)?;
        }
        if self.members.is_empty() {
            self.caches.clear();
        }
        Ok(finished)
    }
}
