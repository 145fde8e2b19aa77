//! A submitted request on the worker's side: its event channel, its
//! cancellation flag, and the one place that reports its end and counts it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::route::Lane;
use super::stats::{push_sample, Counters};
use super::{GatewayError, GatewayEvent, GatewayRequest};
use crate::generate::{FinishReason, GenerationResult, TokenEvent};

/// Where a request's events go, and whether anyone still listens.
#[derive(Clone)]
pub(crate) struct Client {
    pub events: UnboundedSender<GatewayEvent>,
    pub cancel: Arc<AtomicBool>,
    pub submitted: Instant,
    /// Held until the last copy of the client is gone: the request is in flight.
    pub _in_flight: Arc<InFlight>,
}

/// Counts a request in its gateway's in-flight number until dropped.
pub(crate) struct InFlight(pub Arc<AtomicUsize>);

impl InFlight {
    pub fn new(count: &Arc<AtomicUsize>) -> Arc<Self> {
        count.fetch_add(1, Ordering::SeqCst);
        Arc::new(Self(count.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Jobs the worker has received and not yet admitted or refused. Each
/// counts in the gateway's queue depth (counted in at submission) until it
/// is taken out here, whatever becomes of it.
pub(crate) struct Waiting {
    jobs: std::collections::VecDeque<Job>,
    counters: Arc<super::stats::Counters>,
}

impl Waiting {
    pub fn new(counters: Arc<super::stats::Counters>) -> Self {
        Self {
            jobs: std::collections::VecDeque::new(),
            counters,
        }
    }

    pub fn push(&mut self, job: Job) {
        self.jobs.push_back(job);
    }

    pub fn front(&self) -> Option<&Job> {
        self.jobs.front()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The oldest job, no longer counted as queued.
    pub fn pop(&mut self) -> Option<Job> {
        let job = self.jobs.pop_front()?;
        self.counters.queued.fetch_sub(1, Ordering::SeqCst);
        Some(job)
    }
}

impl Client {
    pub fn abandoned(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }

    pub fn send(&self, event: GatewayEvent) -> bool {
        self.events.send(event).is_ok()
    }

    /// Streams one emitted token; false when the client is gone or the
    /// server is stopping, which cancels the generation.
    pub(crate) fn send_token(&self, ev: &TokenEvent, abort: &AtomicBool) -> bool {
        if abort.load(Ordering::Relaxed) || self.cancel.load(Ordering::Relaxed) {
            return false;
        }
        self.send(GatewayEvent::Token {
            token: (ev.token != u32::MAX).then_some(ev.token),
            text: ev.text.to_string(),
            logprob: ev.logprob.cloned(),
        })
    }
}

pub(crate) struct Job {
    pub request: GatewayRequest,
    pub lane: Lane,
    pub client: Client,
}

/// Reports how requests end and keeps the counters.
#[derive(Clone)]
pub(crate) struct Reporter {
    pub counters: Arc<Counters>,
    pub abort: Arc<AtomicBool>,
}

impl Reporter {
    pub(crate) fn aborting(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    pub fn fail(&self, client: &Client, error: GatewayError) {
        // A request the engine refused as invalid is the client's failure.
        if !matches!(error, GatewayError::InvalidRequest(_)) {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        client.send(GatewayEvent::Failed(error));
    }

    /// A request dropped before it produced a result.
    pub fn dropped(&self, client: &Client) {
        self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        if self.aborting() {
            client.send(GatewayEvent::Failed(GatewayError::ShuttingDown));
        }
    }

    /// Sends the result (or the cancellation) and records its numbers.
    pub fn finish(&self, client: &Client, result: GenerationResult, first_token: Option<Instant>) {
        let c = &self.counters;
        c.prompt_tokens
            .fetch_add(result.prompt_tokens as u64, Ordering::Relaxed);
        c.cached_tokens
            .fetch_add(result.cached_tokens as u64, Ordering::Relaxed);
        c.completion_tokens
            .fetch_add(result.generation_tokens as u64, Ordering::Relaxed);
        if let Some(spec) = &result.speculation {
            c.drafted_tokens
                .fetch_add(spec.drafted as u64, Ordering::Relaxed);
            c.accepted_tokens
                .fetch_add(spec.accepted as u64, Ordering::Relaxed);
        }
        {
            let mut samples = c.samples.lock().unwrap();
            if let Some(t) = first_token {
                push_sample(&mut samples.ttft_s, (t - client.submitted).as_secs_f64());
            }
            if result.generation_tokens > 1 && result.generation_tps > 0.0 {
                push_sample(&mut samples.decode_tps, result.generation_tps);
            }
            push_sample(
                &mut samples.service_s,
                client.submitted.elapsed().as_secs_f64(),
            );
        }
        if result.finish_reason == FinishReason::Cancelled {
            self.dropped(client);
            return;
        }
        c.completed.fetch_add(1, Ordering::Relaxed);
        client.send(GatewayEvent::Done(Box::new(result)));
    }
}
