//! One sequence decoded one token per step, the next forward pass queued
//! before the host reads the current token (as mlx-lm's async evaluation
//! does), so host work (detokenizing, grammar masks, streaming) overlaps the
//! device's compute.

use anyhow::Result;
use mlx_rs::transforms::async_eval;
use mlx_rs::Array;

use super::row::Row;
use crate::cache::KvCache;
use crate::generate::{FinishReason, GenerationResult};
use crate::model::Model;

/// One sequence decoded one token per step, the next forward pass queued
/// before the current token is read.
pub(crate) struct SerialDecoder<'m, 'a> {
    model: &'m Model,
    caches: &'m mut [Box<dyn KvCache>],
    row: Row<'a>,
    pending: Array,
    pending_logprobs: Array,
}

impl<'m, 'a> SerialDecoder<'m, 'a> {
    /// Forwards the last prompt token and samples the first new one.
    pub fn start(
        model: &'m Model,
        caches: &'m mut [Box<dyn KvCache>],
        mut row: Row<'a>,
        last: u32,
    ) -> Result<Self> {
        let input = Array::from_slice(&[last as i32], &[1, 1]);
        let logits = model.forward_last(&input, caches)?;
        row.fed.push(last);
        let (pending, pending_logprobs) = row.sample(logits)?;
        async_eval([&pending, &pending_logprobs])?;
        if row.max_tokens() == 0 {
            row.finish_with(FinishReason::Length);
        }
        Ok(Self {
            model,
            caches,
            row,
            pending,
            pending_logprobs,
        })
    }

    /// Emits the pending token and queues the next; false once finished.
    pub fn step(&mut self) -> Result<bool> {
        if self.row.is_finished() {
            return Ok(false);
        }
        let room = self.row.generated() + 1 < self.row.max_tokens();
        let next_logits = if room {
            let input = self.pending.reshape(&[1, 1])?;
            let logits = self.model.forward_last(&input, self.caches)?;
            async_eval([&logits])?;
            Some(logits)
        } else {
            None
        };
        let token = self.pending.item_cast::<u32>();
        if next_logits.is_some() {
            self.row.fed.push(token);
        }
        if !self.row.emit(token, Some(&self.pending_logprobs))? {
            return Ok(false);
        }
        let Some(logits) = next_logits else {
            self.row.finish_with(FinishReason::Length);
            return Ok(false);
        };
        (self.pending, self.pending_logprobs) = self.row.sample(logits)?;
        async_eval([&self.pending, &self.pending_logprobs])?;
        Ok(true)
    }

    pub fn into_result(self) -> Result<GenerationResult> {
        self.row.into_result()
    }
}
