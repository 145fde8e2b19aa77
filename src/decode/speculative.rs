//! One sequence decoded speculatively, a step at a time: emit the pending
//! token, let the row's drafter propose, verify `[pending, ...drafts]` in
//! one forward pass, keep what the row accepts and drop the rest from the
//! caches. The batch runs the same per-row verification over many rows.

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::row::Row;
use crate::cache::{trim_all, KvCache};
use crate::generate::{FinishReason, GenerationResult};
use crate::model::Model;

pub(crate) struct SpeculativeDecoder<'m, 'a> {
    model: &'m Model,
    caches: &'m mut [Box<dyn KvCache>],
    row: Row<'a>,
    /// The next token to feed; the last prompt token before the first step.
    pending: u32,
    pending_logprobs: Option<Array>,
    /// `pending` is still the prompt's, not an emitted token.
    joining: bool,
}

impl<'m, 'a> SpeculativeDecoder<'m, 'a> {
    /// `caches` hold the prompt but its `last` token; `row` has a drafter.
    pub fn start(
        model: &'m Model,
        caches: &'m mut [Box<dyn KvCache>],
        mut row: Row<'a>,
        last: u32,
    ) -> Result<Self> {
        if !row.drafts() {
            bail!("speculative decoding needs a drafter");
        }
        if row.max_tokens() == 0 {
            row.finish_with(FinishReason::Length);
        }
        Ok(Self {
            model,
            caches,
            row,
            pending: last,
            pending_logprobs: None,
            joining: true,
        })
    }

    /// One draft-and-verify round; false once the row is finished.
    pub fn step(&mut self) -> Result<bool> {
        if self.row.is_finished() {
            return Ok(false);
        }
        if !std::mem::take(&mut self.joining)
            && !self
                .row
                .emit(self.pending, self.pending_logprobs.as_ref())?
        {
            return Ok(false);
        }
        // A sliding window that wrapped can no longer drop positions.
        let proposal = if self.caches.iter().all(|c| c.is_trimmable()) {
            self.row.propose(self.pending, usize::MAX)?
        } else {
            Vec::new()
        };
        let mut input = Vec::with_capacity(proposal.len() + 1);
        input.push(self.pending as i32);
        input.extend(proposal.iter().map(|&t| t as i32));
        let input = Array::from_slice(&input, &[1, input.len() as i32]);
        let logits = self.model.forward(&input, self.caches)?.index(0);
        self.row.fed.push(self.pending);
        let verdict = self.row.verify(&logits, &proposal, None)?;
        if !trim_all(self.caches, proposal.len() - verdict.accepted) {
            bail!("the target cache cannot be trimmed");
        }
        match verdict.next {
            Some((token, logprobs)) => {
                self.pending = token;
                self.pending_logprobs = logprobs;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub fn into_result(self) -> Result<GenerationResult> {
        self.row.into_result()
    }
}
