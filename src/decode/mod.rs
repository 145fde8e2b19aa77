//! Decoding as steppable state. A [`Row`] is one sequence's sampling, grammar,
//! drafter, output and timing; producers advance rows: the serial loop
//! (`SerialDecoder`), the speculative loop
//! (`SpeculativeDecoder`, one row drafting and verifying), and [`DecodeBatch`]
//! (many rows per forward pass, drafting rows verified together), which
//! [`BatchScheduler`] feeds with prefilled rows. [`run`] takes one row to
//! its end on the serial or speculative decoder; [`generate`] builds the row.

mod batch;
mod draft_batch;
mod draft_width;
mod row;
mod scheduler;
mod serial;
mod speculative;

pub use batch::{DecodeBatch, Finished};
pub use row::{ConstraintSlot, Row};
pub use scheduler::{generate_batch, BatchItem, BatchLimits, BatchScheduler};
pub(crate) use serial::SerialDecoder;
pub(crate) use speculative::SpeculativeDecoder;

use anyhow::{bail, Result};

use crate::cache::KvCache;
use crate::constraint::TokenConstraint;
use crate::generate::{prefill, GenerateOptions, GenerationResult, Prompt, TokenEvent};
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// Generates a continuation of `prompt` (tokens, or a [`Prompt`] whose
/// first tokens are already in `caches`). `on_token` sees every emitted
/// token and returns false to cancel.
pub fn generate<'p>(
    model: &Model,
    tokenizer: &Tokenizer,
    caches: &mut [Box<dyn KvCache>],
    prompt: impl Into<Prompt<'p>>,
    opts: &GenerateOptions,
    constraint: Option<&mut (dyn TokenConstraint + 'static)>,
    on_token: &mut dyn FnMut(&TokenEvent) -> bool,
) -> Result<GenerationResult> {
    let prompt = prompt.into();
    let row = Row::new(
        model,
        tokenizer,
        prompt.tokens.to_vec(),
        prompt.cached,
        opts,
        constraint.map(ConstraintSlot::Borrowed),
        Box::new(on_token),
    )?;
    run(model, caches, row, opts.prefill_step)
}

/// Decodes `row` to its end: prefills, in chunks of `prefill_step`, the
/// prompt tokens `caches` do not hold but the last, then steps: drafting
/// and verifying when the row has a drafter, a token at a time otherwise.
pub fn run(
    model: &Model,
    caches: &mut [Box<dyn KvCache>],
    row: Row<'_>,
    prefill_step: usize,
) -> Result<GenerationResult> {
    let (prompt, cached) = (row.prompt(), row.cached());
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    if cached >= prompt.len() {
        bail!("at least one prompt token must be left to process");
    }
    if row.drafts() && !caches.iter().all(|c| c.is_trimmable()) {
        bail!("speculative decoding needs a trimmable cache");
    }
    crate::mlx_ext::reset_peak_memory();
    let (&last, rest) = prompt[cached..].split_last().expect("a token is left");
    prefill(model, caches, rest, prefill_step)?;
    let result = if row.drafts() {
        let mut decoder = SpeculativeDecoder::start(model, caches, row, last)?;
        while decoder.step()? {}
        decoder.into_result()
    } else {
        let mut decoder = SerialDecoder::start(model, caches, row, last)?;
        while decoder.step()? {}
        decoder.into_result()
    };
    // The pass queued for a token that never came is still running.
    crate::mlx_ext::synchronize()?;
    result
}
