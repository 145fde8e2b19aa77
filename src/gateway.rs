//! The gateway: the one place that decides how each generation request runs.
//!
//! Requests enter a bounded queue; a dedicated worker thread owns the model
//! (MLX arrays may move between threads but must not be shared), picks the
//! lane a request runs on, and streams events back over a channel. There are
//! two lanes today, serial and speculative (with a draft model), both with
//! the prompt cache; a batch lane plugs in as one more predicate in [`route`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::cache::KvCache;
use crate::generate::{
    generate, prefill, FinishReason, GenerateOptions, GenerationResult, TokenLogprob,
};
use crate::grammar::{ConstraintSpec, GrammarEngine};
use crate::model::Model;
use crate::prompt_cache::{PromptCache, PromptCacheStats};
use crate::speculative::{generate_speculative, ModelDrafter};
use crate::tokenizer::Tokenizer;

/// How many recent requests the latency percentiles are computed over.
const SAMPLE_WINDOW: usize = 1024;

/// Prefill runs in steps with a cancellation check between them. Steps start
/// at this many tokens and double or halve to take about a second, so a slow
/// machine notices a dropped request quickly and a fast one prefills in
/// large, efficient steps.
const PREFILL_FIRST_STEP: usize = 32;
const PREFILL_MIN_STEP: usize = 8;
const PREFILL_STEP_TARGET: Duration = Duration::from_millis(1000);

pub struct GatewayConfig {
    /// Requests that may wait for the worker; more are refused.
    pub max_queue: usize,
    /// Byte cap of the RAM prompt cache; 0 disables it.
    pub prompt_cache_bytes: usize,
    /// Tokens the draft model proposes per round (speculative lane).
    pub num_draft_tokens: usize,
}

/// The models the worker serves: the target and an optional draft.
pub struct LoadedModels {
    pub model: Model,
    pub draft: Option<Model>,
}

/// One generation request, already tokenized and validated.
pub struct GatewayRequest {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Structured-output constraint, compiled by the worker.
    pub constraint: Option<ConstraintSpec>,
}

/// What the request looks like, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestShape {
    pub has_grammar: bool,
    pub has_draft: bool,
    pub wants_logprobs: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// One request at a time on the worker, with the prompt cache.
    Serial,
    /// Draft-and-verify decoding with the server's draft model.
    Speculative,
}

/// The routing rule. A draft model sends requests to the speculative lane
/// (as mlx-lm does), except those asking for log-probabilities, which only
/// the serial lane reports. A future batch lane adds its predicate here.
pub fn route(shape: RequestShape) -> Lane {
    if shape.has_draft && !shape.wants_logprobs {
        Lane::Speculative
    } else {
        Lane::Serial
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GatewayError {
    /// The request cannot run as asked (e.g. its grammar does not compile).
    InvalidRequest(String),
    /// The server cannot run this kind of request.
    Unsupported(String),
    /// The server is stopping.
    ShuttingDown,
    /// The engine failed.
    Internal(String),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::InvalidRequest(m) | GatewayError::Unsupported(m) => f.write_str(m),
            GatewayError::ShuttingDown => f.write_str("the server is shutting down"),
            GatewayError::Internal(m) => write!(f, "generation failed: {m}"),
        }
    }
}

/// What the worker reports about a request, in order: `Started`, any number
/// of `Token`s, then `Done` or `Failed` (which may also come first).
#[derive(Debug)]
pub enum GatewayEvent {
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Token {
        /// `None` for text released at the end that belongs to no new token.
        token: Option<u32>,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done(Box<GenerationResult>),
    Failed(GatewayError),
}

#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull { retry_after_secs: u64 },
    ShuttingDown,
}

/// A submitted request: its events, and cancellation when dropped.
pub struct Ticket {
    pub events: UnboundedReceiver<GatewayEvent>,
    cancel: Arc<AtomicBool>,
}

impl Ticket {
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.cancel();
    }
}

struct Job {
    request: GatewayRequest,
    lane: Lane,
    events: UnboundedSender<GatewayEvent>,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
}

impl Job {
    fn abandoned(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }

    fn send(&self, event: GatewayEvent) -> bool {
        self.events.send(event).is_ok()
    }
}

/// Latency and speed of recent requests.
#[derive(Default)]
struct Samples {
    ttft_s: VecDeque<f64>,
    decode_tps: VecDeque<f64>,
    service_s: VecDeque<f64>,
}

fn push_sample(v: &mut VecDeque<f64>, x: f64) {
    if v.len() == SAMPLE_WINDOW {
        v.pop_front();
    }
    v.push_back(x);
}

/// The `q`-quantile (0..=1) of `v` by nearest rank; 0 when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// Counters shared between the worker and the HTTP layer.
#[derive(Default)]
struct Counters {
    queued: AtomicUsize,
    active: AtomicUsize,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    rejected: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    drafted_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    samples: Mutex<Samples>,
    prompt_cache: Mutex<PromptCacheStats>,
}

/// A snapshot for `/stats` and `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct GatewayStats {
    pub queue_depth: usize,
    pub max_queue: usize,
    pub active: usize,
    pub completed: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub rejected: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Speculative lane: tokens the draft model proposed and the target kept.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    pub prompt_cache: PromptCacheStats,
    pub ttft_p50_s: f64,
    pub ttft_p95_s: f64,
    pub decode_tps_p50: f64,
    pub decode_tps_p95: f64,
    pub samples: usize,
}

#[derive(Default)]
struct Readiness {
    state: Mutex<Option<Result<(), String>>>,
    changed: Condvar,
}

pub struct Gateway {
    queue: Mutex<Option<SyncSender<Job>>>,
    accepting: AtomicBool,
    abort: Arc<AtomicBool>,
    counters: Arc<Counters>,
    readiness: Arc<Readiness>,
    worker: Mutex<Option<JoinHandle<()>>>,
    has_draft: bool,
    max_queue: usize,
}

impl Gateway {
    /// Starts the worker thread, which loads the models with `load` (MLX
    /// streams belong to the thread that creates the arrays, so the worker
    /// must be the one to load them), then warms them up before taking
    /// requests. Returns once the models are loaded.
    pub fn start<F>(load: F, tokenizer: Arc<Tokenizer>, config: GatewayConfig) -> Result<Self>
    where
        F: FnOnce() -> Result<LoadedModels> + Send + 'static,
    {
        let max_queue = config.max_queue.max(1);
        let (tx, rx) = sync_channel::<Job>(max_queue);
        let counters = Arc::new(Counters::default());
        let readiness = Arc::new(Readiness::default());
        let abort = Arc::new(AtomicBool::new(false));
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel::<Result<bool, String>>();
        let worker_counters = counters.clone();
        let worker_abort = abort.clone();
        let ready = readiness.clone();
        let handle = std::thread::Builder::new()
            .name("mlx-bun-gateway".into())
            .spawn(move || {
                let models = match load() {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                let _ = loaded_tx.send(Ok(models.draft.is_some()));
                let worker = Worker {
                    model: models.model,
                    draft: models.draft,
                    tokenizer,
                    grammar: None,
                    prompt_cache: PromptCache::new(config.prompt_cache_bytes),
                    counters: worker_counters,
                    abort: worker_abort,
                    num_draft_tokens: config.num_draft_tokens,
                };
                *worker.counters.prompt_cache.lock().unwrap() = worker.prompt_cache.stats();
                worker.run(rx, &ready)
            })
            .context("starting the generation worker")?;
        let has_draft = match loaded_rx.recv() {
            Ok(Ok(has_draft)) => has_draft,
            Ok(Err(e)) => {
                let _ = handle.join();
                return Err(anyhow!(e));
            }
            Err(_) => {
                let _ = handle.join();
                return Err(anyhow!("the generation worker stopped while loading"));
            }
        };
        Ok(Self {
            queue: Mutex::new(Some(tx)),
            accepting: AtomicBool::new(true),
            abort,
            counters,
            readiness,
            worker: Mutex::new(Some(handle)),
            has_draft,
            max_queue,
        })
    }

    /// Blocks until the warm-up pass is done; its error if it failed.
    pub fn wait_ready(&self) -> Result<()> {
        let mut state = self.readiness.state.lock().unwrap();
        while state.is_none() {
            state = self.readiness.changed.wait(state).unwrap();
        }
        state.clone().unwrap().map_err(|e| anyhow!(e))
    }

    /// Warm and with a live worker.
    pub fn is_ready(&self) -> bool {
        let warm = matches!(*self.readiness.state.lock().unwrap(), Some(Ok(())));
        let alive = self
            .worker
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|h| !h.is_finished());
        warm && alive
    }

    pub fn shape_of(&self, request: &GatewayRequest) -> RequestShape {
        RequestShape {
            has_grammar: request.constraint.is_some(),
            has_draft: self.has_draft,
            wants_logprobs: request.options.logprobs.is_some(),
        }
    }

    /// Queues `request`; fails at once when the queue is full.
    pub fn submit(&self, request: GatewayRequest) -> Result<Ticket, SubmitError> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err(SubmitError::ShuttingDown);
        }
        let lane = route(self.shape_of(&request));
        let (events, rx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            request,
            lane,
            events,
            cancel: cancel.clone(),
            submitted: Instant::now(),
        };
        let queue = self.queue.lock().unwrap();
        let Some(tx) = queue.as_ref() else {
            return Err(SubmitError::ShuttingDown);
        };
        // Count before sending so the worker never sees a negative depth.
        self.counters.queued.fetch_add(1, Ordering::SeqCst);
        match tx.try_send(job) {
            Ok(()) => Ok(Ticket { events: rx, cancel }),
            Err(err) => {
                self.counters.queued.fetch_sub(1, Ordering::SeqCst);
                match err {
                    TrySendError::Full(_) => {
                        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                        Err(SubmitError::QueueFull {
                            retry_after_secs: self.retry_after_secs(),
                        })
                    }
                    TrySendError::Disconnected(_) => Err(SubmitError::ShuttingDown),
                }
            }
        }
    }

    /// A guess at when a queue slot frees up: the median service time.
    fn retry_after_secs(&self) -> u64 {
        let samples = self.counters.samples.lock().unwrap();
        let v: Vec<f64> = samples.service_s.iter().copied().collect();
        (quantile(&v, 0.5).ceil() as u64).clamp(1, 60)
    }

    pub fn stats(&self) -> GatewayStats {
        let c = &self.counters;
        let samples = c.samples.lock().unwrap();
        let ttft: Vec<f64> = samples.ttft_s.iter().copied().collect();
        let tps: Vec<f64> = samples.decode_tps.iter().copied().collect();
        GatewayStats {
            queue_depth: c.queued.load(Ordering::SeqCst),
            max_queue: self.max_queue,
            active: c.active.load(Ordering::SeqCst),
            completed: c.completed.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
            cached_tokens: c.cached_tokens.load(Ordering::Relaxed),
            completion_tokens: c.completion_tokens.load(Ordering::Relaxed),
            drafted_tokens: c.drafted_tokens.load(Ordering::Relaxed),
            accepted_tokens: c.accepted_tokens.load(Ordering::Relaxed),
            prompt_cache: *c.prompt_cache.lock().unwrap(),
            ttft_p50_s: quantile(&ttft, 0.5),
            ttft_p95_s: quantile(&ttft, 0.95),
            decode_tps_p50: quantile(&tps, 0.5),
            decode_tps_p95: quantile(&tps, 0.95),
            samples: ttft.len(),
        }
    }

    /// Refuses new requests; queued and running ones go on.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
    }

    /// Ends the running request and fails the queued ones with
    /// [`GatewayError::ShuttingDown`], then stops the worker.
    pub fn abort(&self) {
        self.stop_accepting();
        self.abort.store(true, Ordering::Relaxed);
        self.queue.lock().unwrap().take();
    }

    /// Whether the worker is idle with an empty queue.
    pub fn is_idle(&self) -> bool {
        self.counters.queued.load(Ordering::SeqCst) == 0
            && self.counters.active.load(Ordering::SeqCst) == 0
    }

    /// Lets the queue drain for up to `grace`, then aborts what is left and
    /// waits for the worker to exit.
    pub fn shutdown(&self, grace: Duration) {
        self.stop_accepting();
        let deadline = Instant::now() + grace;
        while !self.is_idle() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.abort();
        if let Some(handle) = self.worker.lock().unwrap().take() {
            let _ = handle.join();
        }
    }
}

struct Worker {
    model: Model,
    draft: Option<Model>,
    tokenizer: Arc<Tokenizer>,
    grammar: Option<GrammarEngine>,
    prompt_cache: PromptCache,
    counters: Arc<Counters>,
    abort: Arc<AtomicBool>,
    num_draft_tokens: usize,
}

/// One forward pass on a single token, so the first request does not pay for
/// first-use setup (and, on a GPU, kernel compilation).
fn warm_up(model: &Model) -> Result<()> {
    let mut caches = model.make_caches();
    let input = mlx_rs::Array::from_slice(&[0i32], &[1, 1]);
    let logits = model.forward_last(&input, &mut caches)?;
    mlx_rs::transforms::eval([&logits])?;
    Ok(())
}

impl Worker {
    fn run(mut self, rx: Receiver<Job>, readiness: &Readiness) {
        let warm = warm_up(&self.model).and_then(|()| match &self.draft {
            Some(d) => warm_up(d),
            None => Ok(()),
        });
        let failed = warm.is_err();
        *readiness.state.lock().unwrap() = Some(warm.map_err(|e| format!("{e:#}")));
        readiness.changed.notify_all();
        if failed {
            return;
        }
        while let Ok(job) = rx.recv() {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            if self.abort.load(Ordering::Relaxed) {
                job.send(GatewayEvent::Failed(GatewayError::ShuttingDown));
                continue;
            }
            if job.abandoned() {
                self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.counters.active.fetch_add(1, Ordering::SeqCst);
            let started = Instant::now();
            // A panic in one request must not take the server down with it.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_job(&job, job.lane)
            }));
            if let Err(panic) = outcome {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown panic");
                tracing::error!("generation panicked: {what}");
                self.fail(
                    &job,
                    GatewayError::Internal(format!("the engine panicked: {what}")),
                );
            }
            let service = started.elapsed().as_secs_f64();
            push_sample(
                &mut self.counters.samples.lock().unwrap().service_s,
                service,
            );
            self.counters.active.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn fail(&self, job: &Job, error: GatewayError) {
        // A request the engine refused as invalid is the client's failure.
        if !matches!(error, GatewayError::InvalidRequest(_)) {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        job.send(GatewayEvent::Failed(error));
    }

    fn constraint(
        &mut self,
        spec: &ConstraintSpec,
    ) -> Result<Box<dyn crate::constraint::TokenConstraint>, GatewayError> {
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

    /// Runs one request on `lane`: compile its constraint, reuse what the
    /// prompt cache holds, prefill the rest, decode, and keep the caches.
    fn run_job(&mut self, job: &Job, lane: Lane) {
        let request = &job.request;
        let mut constraint = match &request.constraint {
            Some(spec) => match self.constraint(spec) {
                Ok(c) => Some(c),
                Err(e) => return self.fail(job, e),
            },
            None => None,
        };
        let (mut caches, cached): (Vec<Box<dyn KvCache>>, usize) =
            match self.prompt_cache.lookup(&request.prompt) {
                Some(hit) => (hit.caches, hit.cached),
                None => (self.model.make_caches(), 0),
            };
        let sent = job.send(GatewayEvent::Started {
            prompt_tokens: request.prompt.len(),
            cached_tokens: cached,
        });
        if !sent {
            self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let prefill_start = Instant::now();
        let prefilled = match self.prefill_cancellable(job, &mut caches, cached) {
            Ok(Some(n)) => n,
            Ok(None) => return,
            Err(e) => return self.fail(job, GatewayError::Internal(format!("{e:#}"))),
        };
        let mut first_token: Option<Instant> = None;
        let abort = self.abort.clone();
        let result = {
            let mut on_token = |ev: &crate::generate::TokenEvent| {
                first_token.get_or_insert_with(Instant::now);
                if abort.load(Ordering::Relaxed) || job.cancel.load(Ordering::Relaxed) {
                    return false;
                }
                job.send(GatewayEvent::Token {
                    token: (ev.token != u32::MAX).then_some(ev.token),
                    text: ev.text.to_string(),
                    logprob: ev.logprob.cloned(),
                })
            };
            match (lane, &self.draft) {
                (Lane::Serial, _) => generate(
                    &self.model,
                    &self.tokenizer,
                    &mut caches,
                    &request.prompt,
                    prefilled,
                    &request.options,
                    constraint.as_deref_mut(),
                    &mut on_token,
                ),
                // ROUTING: the speculative lane. The target's caches come from
                // the prompt cache like the serial lane's; the draft model
                // prefills the prompt itself.
                (Lane::Speculative, Some(draft)) => {
                    ModelDrafter::new(draft, &request.options.sampling).and_then(|mut drafter| {
                        generate_speculative(
                            &self.model,
                            &self.tokenizer,
                            &mut caches,
                            &request.prompt,
                            prefilled,
                            &request.options,
                            &mut drafter,
                            self.num_draft_tokens,
                            constraint.as_deref_mut(),
                            &mut on_token,
                        )
                    })
                }
                (Lane::Speculative, None) => Err(anyhow!("no draft model is loaded")),
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
                self.prompt_cache.insert(cache_tokens, caches);
                *self.counters.prompt_cache.lock().unwrap() = self.prompt_cache.stats();
                self.finish(job, result, first_token);
            }
            Err(e) => self.fail(job, GatewayError::Internal(format!("{e:#}"))),
        }
    }

    fn should_stop(&self, job: &Job) -> bool {
        self.abort.load(Ordering::Relaxed) || job.abandoned()
    }

    /// Prefills all but the last prompt token in steps, checking between
    /// steps whether the request was cancelled, so a long prompt whose
    /// client went away does not hold the worker. Returns how many prompt
    /// tokens the caches hold, or `None` when the request was dropped.
    fn prefill_cancellable(
        &mut self,
        job: &Job,
        caches: &mut Vec<Box<dyn KvCache>>,
        cached: usize,
    ) -> Result<Option<usize>> {
        let prompt = &job.request.prompt;
        let target = prompt.len() - 1;
        let max_step = job.request.options.prefill_step.max(1);
        let mut step = PREFILL_FIRST_STEP.min(max_step);
        let mut done = cached;
        while done < target {
            if self.should_stop(job) {
                // What was prefilled is still a valid prefix for a retry.
                self.prompt_cache
                    .insert(prompt[..done].to_vec(), std::mem::take(caches));
                *self.counters.prompt_cache.lock().unwrap() = self.prompt_cache.stats();
                self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                if self.abort.load(Ordering::Relaxed) {
                    job.send(GatewayEvent::Failed(GatewayError::ShuttingDown));
                }
                return Ok(None);
            }
            let end = (done + step).min(target);
            let started = Instant::now();
            prefill(&self.model, caches, &prompt[done..end], step)?;
            let took = started.elapsed();
            if took < PREFILL_STEP_TARGET / 4 {
                step = (step * 2).min(max_step);
            } else if took > PREFILL_STEP_TARGET * 2 {
                step = (step / 2).max(PREFILL_MIN_STEP.min(max_step));
            }
            done = end;
        }
        Ok(Some(done))
    }

    fn finish(&self, job: &Job, result: GenerationResult, first_token: Option<Instant>) {
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
                push_sample(&mut samples.ttft_s, (t - job.submitted).as_secs_f64());
            }
            if result.generation_tokens > 1 && result.generation_tps > 0.0 {
                push_sample(&mut samples.decode_tps, result.generation_tps);
            }
        }
        if result.finish_reason == FinishReason::Cancelled {
            c.cancelled.fetch_add(1, Ordering::Relaxed);
            if self.abort.load(Ordering::Relaxed) {
                job.send(GatewayEvent::Failed(GatewayError::ShuttingDown));
            }
            return;
        }
        c.completed.fetch_add(1, Ordering::Relaxed);
        job.send(GatewayEvent::Done(Box::new(result)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_by_request_shape() {
        let shape = |has_draft, has_grammar, wants_logprobs| RequestShape {
            has_grammar,
            has_draft,
            wants_logprobs,
        };
        assert_eq!(route(shape(false, false, false)), Lane::Serial);
        assert_eq!(route(shape(false, true, true)), Lane::Serial);
        assert_eq!(route(shape(true, false, false)), Lane::Speculative);
        assert_eq!(route(shape(true, true, false)), Lane::Speculative);
        assert_eq!(route(shape(true, false, true)), Lane::Serial);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 10.0);
        assert_eq!(quantile(&v, 0.95), 19.0);
        assert_eq!(quantile(&[3.0], 0.95), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
