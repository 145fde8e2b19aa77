//! The serial and speculative lanes: one request at a time on the worker,
//! with the prompt cache, a cancellable prefill, and the serial or the
//! draft-and-verify decoder.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::job::{Client, Job};
use super::route::Lane;
use super::worker::Shared;
use super::{GatewayError, GatewayEvent, LoadedModels};
use crate::cache::KvCache;
use crate::decode::{self, generate, ConstraintSlot, Row};
use crate::generate::{prefill, Prompt};
use crate::speculative::{DraftSource, ModelDrafter, NgramDrafter};

/// Prefill runs in steps with a cancellation check between them. Steps start
/// at this many tokens and double or halve to take about a second, so a slow
/// machine notices a dropped request quickly and a fast one prefills in
/// large, efficient steps.
const PREFILL_FIRST_STEP: usize = 32;
const PREFILL_MIN_STEP: usize = 8;
const PREFILL_STEP_TARGET: Duration = Duration::from_millis(1000);

/// Runs one request to its end on the serial or speculative lane.
pub(crate) fn run(shared: &mut Shared, models: &LoadedModels, job: &Job) {
    let request = &job.request;
    let client = &job.client;
    let reporter = shared.reporter.clone();
    let mut constraint = match &request.constraint {
        Some(spec) => match shared.constraint(spec) {
            Ok(c) => Some(c),
            Err(e) => return reporter.fail(client, e),
        },
        None => None,
    };
    let (mut caches, cached) = shared.cached_prefix(&models.model, &request.prompt);
    let sent = client.send(GatewayEvent::Started {
        prompt_tokens: request.prompt.len(),
        cached_tokens: cached,
    });
    if !sent {
        return reporter.dropped(client);
    }
    let prefill_start = Instant::now();
    let prefilled = match prefill_cancellable(shared, models, job, &mut caches, cached) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => return reporter.fail(client, GatewayError::Internal(format!("{e:#}"))),
    };
    if prefilled > cached {
        shared
            .prefixes
            .checkpoint(&request.prompt[..prefilled], &caches);
    }
    let mut first_token: Option<Instant> = None;
    let abort = reporter.abort.clone();
    let result = {
        let mut on_token = |ev: &crate::generate::TokenEvent| {
            first_token.get_or_insert_with(Instant::now);
            client.send_token(ev, &abort)
        };
        let tokenizer = shared.tokenizer.clone();
        match (job.lane, &models.draft) {
            (Lane::Speculative, draft) => {
                let drafter: Result<Box<dyn DraftSource>> = match draft {
                    Some(draft) => ModelDrafter::new(draft, &request.options.sampling)
                        .map(|d| Box::new(d) as Box<dyn DraftSource>),
                    None if shared.ngram_draft => Ok(Box::new(NgramDrafter::default())),
                    None => Err(anyhow!("no draft model is loaded")),
                };
                drafter.and_then(|drafter| {
                    let row = Row::new(
                        &models.model,
                        &tokenizer,
                        request.prompt.clone(),
                        prefilled,
                        &request.options,
                        constraint.as_deref_mut().map(ConstraintSlot::Borrowed),
                        Box::new(&mut on_token),
                    )?
                    .with_drafter(drafter, shared.num_draft_tokens);
                    decode::run(
                        &models.model,
                        &mut caches,
                        row,
                        request.options.prefill_step,
                    )
                })
            }
            _ => generate(
                &models.model,
                &tokenizer,
                &mut caches,
                Prompt::continuing(&request.prompt, prefilled),
                &request.options,
                constraint.as_deref_mut(),
                &mut on_token,
            ),
        }
    };
    match result {
        Ok(mut result) => {
            // The prefill above is part of this request's prompt processing.
            let ttft = first_token.map_or(0.0, |t| (t - prefill_start).as_secs_f64());
            result.cached_tokens = cached;
            result.ttft_s = ttft;
            result.prompt_tps = (request.prompt.len() - cached) as f64 / ttft.max(1e-9);
            let cache_tokens = std::mem::take(&mut result.cache_tokens);
            // The client has its answer before the cache is kept (the SSD
            // tier copies it to host memory here).
            reporter.finish(client, result, first_token);
            shared.prefixes.store(cache_tokens, caches);
        }
        Err(e) => reporter.fail(client, GatewayError::Internal(format!("{e:#}"))),
    }
}

fn should_stop(shared: &Shared, client: &Client) -> bool {
    shared.reporter.aborting() || client.abandoned()
}

/// Prefills all but the last prompt token in steps, checking between steps
/// whether the request was cancelled, so a long prompt whose client went
/// away does not hold the worker. Returns how many prompt tokens the caches
/// hold, or `None` when the request was dropped.
fn prefill_cancellable(
    shared: &mut Shared,
    models: &LoadedModels,
    job: &Job,
    caches: &mut Vec<Box<dyn KvCache>>,
    cached: usize,
) -> Result<Option<usize>> {
    let prompt = &job.request.prompt;
    let target = prompt.len() - 1;
    let max_step = job.request.options.prefill_step.max(1);
    let fixed = shared.fixed_prefill_step;
    let mut step = fixed.unwrap_or(PREFILL_FIRST_STEP.min(max_step)).max(1);
    let mut done = cached;
    while done < target {
        if should_stop(shared, &job.client) {
            // What was prefilled is still a valid prefix for a retry.
            shared
                .prefixes
                .store(prompt[..done].to_vec(), std::mem::take(caches));
            shared.reporter.dropped(&job.client);
            return Ok(None);
        }
        let end = (done + step).min(target);
        let started = Instant::now();
        prefill(&models.model, caches, &prompt[done..end], step)?;
        let took = started.elapsed();
        if fixed.is_none() && took < PREFILL_STEP_TARGET / 4 {
            step = (step * 2).min(max_step);
        } else if fixed.is_none() && took > PREFILL_STEP_TARGET * 2 {
            step = (step / 2).max(PREFILL_MIN_STEP.min(max_step));
        }
        done = end;
    }
    Ok(Some(done))
}
