//! The gateway: the one place that decides how each generation request runs.
//!
//! Requests enter a bounded queue; a dedicated worker thread owns the models
//! (MLX arrays may move between threads but must not be shared), admits each
//! request to the lane [`route`] picks, and streams events back over a
//! channel. Lanes: serial, speculative (with a draft model) and batch (rows
//! of the continuous batch, admitted under a KV-memory budget).
//!
//! - `route`: the routing rule (the only match on request shape)
//! - `worker`: the loop that admits and steps
//! - `serial`, `batch_lane`: the lanes
//! - `admission`: the KV budget
//! - `job`: a request's events and how its end is reported and counted
//! - `stats`: counters and the `/stats` snapshot
//! - `lockstep`: a model sharded across ranks (rank 0 leads, the others follow)

mod admission;
mod batch_lane;
mod job;
mod lockstep;
mod route;
mod serial;
mod stats;
mod worker;

pub use crate::prefix::{SsdConfig, SsdStats};
pub use lockstep::{Sharding, ShardingSlot};
pub use route::{route, Lane, RequestShape};
pub use stats::{quantile, GatewayStats};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::cache::KvSettings;
use crate::decode::BatchLimits;

/// A step of the batch spends about this long on prefill: decoding rows keep
/// streaming, and a prompt whose client left is dropped within about this.
const BATCH_PREFILL_TARGET: Duration = Duration::from_millis(500);
use crate::generate::{GenerateOptions, GenerationResult, TokenLogprob};
use crate::grammar::ConstraintSpec;
use crate::model::Model;
use crate::prefix::PrefixStore;
use crate::runtime::Runtime;
use admission::KvBudget;
use job::{Client, InFlight, Job, Reporter};
use stats::Counters;
use worker::{Shared, WorkerPlan};

/// How a gateway serves: queue size, prompt cache, drafting, batching, KV budget
/// and warm-up (the server's flags).
#[derive(Clone)]
pub struct GatewayConfig {
    /// Requests that may wait for the worker; more are refused.
    pub max_queue: usize,
    /// Byte cap of the RAM prompt cache; 0 disables it.
    pub prompt_cache_bytes: usize,
    /// Rows that decode together; 1 turns batching off.
    pub decode_concurrency: usize,
    /// Prompts that prefill at once in the batch lane.
    pub prompt_concurrency: usize,
    /// KV bytes admitted rows may reach; `None`: a share of free memory.
    pub kv_budget_bytes: Option<usize>,
    /// The prompt cache's tier on disk.
    pub ssd: Option<SsdConfig>,
    /// What runs before the gateway reports ready.
    pub warmup: Warmup,
    /// The ranks a sharded server (started by `launch`) splits its model across.
    pub sharding: ShardingSlot,
    /// `Some(n)`: prefill in chunks of exactly `n` tokens, as mlx-lm's server
    /// (`--prefill-step-size`); `None`: chunks sized to take about half a
    /// second, so running rows keep streaming while a long prompt comes in.
    pub fixed_prefill_step: Option<usize>,
}

/// The warm-up before a gateway reports ready (`--warmup`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Warmup {
    /// Full on a GPU (MLX compiles kernels on first use there), basic on the CPU.
    #[default]
    Auto,
    /// Nothing: the first requests pay for first-use setup.
    Off,
    /// One single-token forward pass of each model.
    Basic,
    /// Basic, then what requests will run: prefill chunks of every size
    /// class, decode steps at every batch size, every sampling path.
    Full,
}

impl Warmup {
    pub(crate) fn runs_basic(self) -> bool {
        self != Warmup::Off
    }

    pub(crate) fn runs_full(self) -> bool {
        match self {
            Warmup::Auto => crate::mlx_ext::on_gpu(),
            Warmup::Full => true,
            Warmup::Off | Warmup::Basic => false,
        }
    }
}

impl std::str::FromStr for Warmup {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            "basic" => Ok(Self::Basic),
            "full" => Ok(Self::Full),
            other => Err(format!(
                "unknown warm-up {other:?} (auto, off, basic or full)"
            )),
        }
    }
}

/// Where a gateway stands, as `/health` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Loading or warming up.
    Starting,
    /// Warmed up and serving.
    Ready,
    /// It cannot serve: the warm-up failed, or the worker stopped.
    Failed(String),
}

/// What the worker serves, taken from the runtime it loaded: the target,
/// the drafter (a draft model or prompt lookup), and the KV settings.
pub(crate) struct LoadedModels {
    pub model: Model,
    pub draft: Option<Model>,
    pub ngram_draft: bool,
    pub num_draft_tokens: usize,
    pub kv: KvSettings,
}

impl LoadedModels {
    fn drafts(&self) -> bool {
        self.draft.is_some() || self.ngram_draft
    }
}

impl From<crate::runtime::Runtime> for LoadedModels {
    fn from(runtime: crate::runtime::Runtime) -> Self {
        let (draft, ngram_draft) = match runtime.draft {
            Some(crate::runtime::Draft::Model { model, .. }) => (Some(*model), false),
            Some(crate::runtime::Draft::Ngram) => (None, true),
            None => (None, false),
        };
        Self {
            model: runtime.model,
            draft,
            ngram_draft,
            num_draft_tokens: runtime.num_draft_tokens,
            kv: runtime.kv,
        }
    }
}

/// One generation request, already tokenized and validated.
pub struct GatewayRequest {
    /// The prompt's token ids, chat template applied.
    pub prompt: Vec<u32>,
    /// Token limit, sampling, stop strings and log-probabilities.
    pub options: GenerateOptions,
    /// Structured-output constraint, compiled by the worker.
    pub constraint: Option<ConstraintSpec>,
}

/// Why an admitted request failed.
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
    /// The request was admitted and its prompt is about to run.
    Started {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Leading prompt tokens found in the prompt cache.
        cached_tokens: usize,
    },
    /// Newly final output text.
    Token {
        /// `None` for text released at the end that belongs to no new token.
        token: Option<u32>,
        /// The text this token made final (may be empty).
        text: String,
        /// The token's log-probability, when the request asked for them.
        logprob: Option<TokenLogprob>,
    },
    /// Generation ended; the full result.
    Done(Box<GenerationResult>),
    /// Generation failed or could not start.
    Failed(GatewayError),
}

/// Why [`Gateway::submit`] refused a request.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue holds `max_queue` requests already (HTTP 429).
    QueueFull {
        /// A guess, in seconds, at when a slot frees up: the median recent service
        /// time (`Retry-After`).
        retry_after_secs: u64,
    },
    /// The request alone needs more KV memory than the budget.
    TooLarge {
        /// Prompt tokens plus `max_tokens`.
        tokens: usize,
        /// KV bytes that many tokens take.
        needed_bytes: usize,
        /// The gateway's KV budget, in bytes.
        budget_bytes: usize,
    },
    /// The gateway no longer accepts requests.
    ShuttingDown,
}

/// A submitted request: its events, and cancellation when dropped.
pub struct Ticket {
    /// The request's events, in the order [`GatewayEvent`] describes.
    pub events: UnboundedReceiver<GatewayEvent>,
    cancel: Arc<AtomicBool>,
}

impl Ticket {
    /// Asks the worker to stop the request; it ends with `Cancelled`.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.cancel();
    }
}

#[derive(Default)]
pub(crate) struct Readiness {
    pub state: Mutex<Option<Result<(), String>>>,
    pub changed: Condvar,
}

/// The front of the generation worker: queues requests, reports health and stats,
/// and shuts the worker down.
pub struct Gateway {
    queue: Mutex<Option<SyncSender<Job>>>,
    accepting: AtomicBool,
    abort: Arc<AtomicBool>,
    counters: Arc<Counters>,
    readiness: Arc<Readiness>,
    worker: Mutex<Option<JoinHandle<()>>>,
    has_draft: bool,
    can_batch: bool,
    batch_speculates: bool,
    max_queue: usize,
    budget: KvBudget,
    decode_concurrency: usize,
    /// Requests submitted whose events are still being produced.
    in_flight: Arc<AtomicUsize>,
}

/// What the worker reports once the models are loaded.
struct Loaded {
    has_draft: bool,
    can_batch: bool,
    batch_speculates: bool,
    budget: KvBudget,
}

impl Gateway {
    /// Starts the worker thread, which assembles the runtime it serves with
    /// `load` (MLX streams belong to the thread that creates the arrays, so
    /// the worker must be the one to load them), then warms it up before
    /// taking requests. The runtime's drafter, draft length and KV settings
    /// are the server's. Returns once the models are loaded.
    pub fn start<F>(load: F, config: GatewayConfig) -> Result<Self>
    where
        F: FnOnce() -> Result<Runtime> + Send + 'static,
    {
        let max_queue = config.max_queue.max(1);
        let (tx, rx) = sync_channel::<Job>(max_queue);
        let counters = Arc::new(Counters::default());
        let readiness = Arc::new(Readiness::default());
        let abort = Arc::new(AtomicBool::new(false));
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel::<Result<Loaded, String>>();
        let reporter = Reporter {
            counters: counters.clone(),
            abort: abort.clone(),
        };
        let ready = readiness.clone();
        let decode_concurrency = config.decode_concurrency.max(1);
        let mut prefixes = PrefixStore::open(config.prompt_cache_bytes, config.ssd.as_ref())?;
        *counters.prefixes.lock().unwrap() = prefixes.stats_handle();
        let sharding = config.sharding.claim()?;
        if sharding.is_some() && prefixes.has_disk() {
            bail!("a sharded server runs with no --ssd-cache");
        }
        if sharding.is_some() {
            // Its hits would depend on each rank's memory.
            prefixes = prefixes.without_ram();
        }
        let handle = std::thread::Builder::new()
            .name("mlx-bun-gateway".into())
            .spawn(move || {
                let loaded = load().and_then(|runtime| {
                    let tokenizer = runtime.tokenizer.clone();
                    let mut m = LoadedModels::from(runtime);
                    if let Some(s) = &sharding {
                        if m.draft.is_some() {
                            bail!("a sharded server has no draft model");
                        }
                        if !m.kv.is_default() {
                            bail!("a sharded server runs with dense KV caches");
                        }
                        crate::distributed::shard_model(&mut m.model, &s.group, s.parallelism)?;
                    }
                    Ok((m, tokenizer))
                });
                let (models, tokenizer) = match loaded {
                    Ok(loaded) => loaded,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                let budget = KvBudget {
                    budget_bytes: config
                        .kv_budget_bytes
                        .unwrap_or_else(admission::default_kv_budget_bytes),
                    bytes_per_token: models.model.kv_bytes_per_token(),
                };
                let kv_caches = match models
                    .model
                    .decoder
                    .make_caches_with(models.kv.max_kv_size, models.kv.quantization)
                {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = loaded_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                if models.drafts() && !kv_caches.iter().all(|c| c.is_trimmable()) {
                    let why = "this model keeps a recurrent state that cannot drop drafted \
                               tokens, so it cannot decode speculatively; start the server \
                               without --draft-model";
                    let _ = loaded_tx.send(Err(why.into()));
                    return;
                }
                let (can_batch, batch_speculates) = if decode_concurrency > 1 {
                    (
                        crate::cache::can_batch(&kv_caches),
                        crate::cache::can_batch_speculate(&kv_caches),
                    )
                } else {
                    (false, false)
                };
                if sharding.is_some() && !can_batch {
                    let why = "a sharded server runs requests as rows of its batch: it needs \
                               --decode-concurrency 2 or more and a model whose caches batch \
                               (no sliding-window layers)";
                    let _ = loaded_tx.send(Err(why.into()));
                    return;
                }
                let _ = loaded_tx.send(Ok(Loaded {
                    has_draft: models.drafts(),
                    can_batch,
                    batch_speculates,
                    budget,
                }));
                let shared = Shared {
                    tokenizer,
                    grammar: None,
                    prefixes,
                    reporter,
                    num_draft_tokens: models.num_draft_tokens,
                    ngram_draft: models.ngram_draft,
                    kv: models.kv,
                    fixed_prefill_step: config.fixed_prefill_step,
                };
                let plan = WorkerPlan {
                    limits: BatchLimits {
                        decode_concurrency,
                        prompt_concurrency: config.prompt_concurrency.max(1),
                        prefill_step: config
                            .fixed_prefill_step
                            .unwrap_or(crate::generate::DEFAULT_PREFILL_STEP),
                        // Timed chunks would differ between ranks. A bounded
                        // cache keeps its first positions, so what later prompt
                        // tokens attend to depends on the chunks (as in mlx-lm):
                        // fixed chunks keep its answers equal to `generate`'s.
                        prefill_target: (sharding.is_none()
                            && config.fixed_prefill_step.is_none()
                            && models.kv.max_kv_size.is_none())
                        .then_some(BATCH_PREFILL_TARGET),
                        measured_draft_width: sharding.is_none(),
                    },
                    budget,
                    sharding,
                    warmup: config.warmup,
                };
                worker::run(models, shared, plan, rx, &ready);
                // Queued passes of rows that ended must finish before the
                // process may exit.
                if let Err(e) = crate::mlx_ext::synchronize() {
                    tracing::warn!("{e:#}");
                }
            })
            .context("starting the generation worker")?;
        let loaded = match loaded_rx.recv() {
            Ok(Ok(loaded)) => loaded,
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
            has_draft: loaded.has_draft,
            can_batch: loaded.can_batch,
            batch_speculates: loaded.batch_speculates,
            max_queue,
            budget: loaded.budget,
            decode_concurrency,
            in_flight: Arc::new(AtomicUsize::new(0)),
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
        self.health() == Health::Ready
    }

    /// Starting, ready, or failed with the reason.
    pub fn health(&self) -> Health {
        let state = self.readiness.state.lock().unwrap().clone();
        let alive = self
            .worker
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|h| !h.is_finished());
        match state {
            Some(Err(reason)) => Health::Failed(reason),
            None if alive => Health::Starting,
            Some(Ok(())) if alive => Health::Ready,
            _ => Health::Failed("the generation worker stopped".into()),
        }
    }

    fn shape_of(&self, request: &GatewayRequest) -> RequestShape {
        RequestShape {
            has_grammar: request.constraint.is_some(),
            has_draft: self.has_draft,
            wants_logprobs: request.options.logprobs.is_some(),
            can_batch: self.can_batch,
            batch_speculates: self.batch_speculates,
        }
    }

    /// Whether requests without a draft run as rows of the batch.
    pub fn batches(&self) -> bool {
        self.can_batch
    }

    /// Queues `request`; fails at once when the queue is full.
    pub fn submit(&self, request: GatewayRequest) -> Result<Ticket, SubmitError> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err(SubmitError::ShuttingDown);
        }
        let tokens = request.prompt.len() + request.options.max_tokens;
        if !self.budget.fits_alone(tokens) {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::TooLarge {
                tokens,
                needed_bytes: self.budget.bytes_for(tokens),
                budget_bytes: self.budget.budget_bytes,
            });
        }
        let shape = self.shape_of(&request);
        let lane = route(shape);
        if let Some(reason) = route::serial_reason(shape) {
            *self
                .counters
                .outside_batch
                .lock()
                .unwrap()
                .entry(reason)
                .or_default() += 1;
        }
        let (events, rx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            request,
            lane,
            client: Client {
                events,
                cancel: cancel.clone(),
                submitted: Instant::now(),
                _in_flight: InFlight::new(&self.in_flight),
            },
        };
        let queue = self.queue.lock().unwrap();
        let Some(tx) = queue.as_ref() else {
            return Err(SubmitError::ShuttingDown);
        };
        // Count before sending so the worker never sees a negative depth.
        let depth = self.counters.queued.fetch_add(1, Ordering::SeqCst);
        if depth >= self.max_queue {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::QueueFull {
                retry_after_secs: self.retry_after_secs(),
            });
        }
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

    /// A snapshot of the counters, the KV memory and the latency percentiles.
    pub fn stats(&self) -> GatewayStats {
        let c = &self.counters;
        let samples = c.samples.lock().unwrap();
        let ttft: Vec<f64> = samples.ttft_s.iter().copied().collect();
        let tps: Vec<f64> = samples.decode_tps.iter().copied().collect();
        let prefixes = c.prefixes.lock().unwrap().get();
        GatewayStats {
            queue_depth: c.queued.load(Ordering::SeqCst),
            max_queue: self.max_queue,
            active: c.active.load(Ordering::SeqCst),
            batch_rows: c.batch_rows.load(Ordering::Relaxed),
            prefilling_rows: c.prefilling_rows.load(Ordering::Relaxed),
            decode_concurrency: if self.batches() {
                self.decode_concurrency
            } else {
                1
            },
            kv_bytes: c.kv_bytes.load(Ordering::Relaxed),
            kv_projected_bytes: c.kv_projected.load(Ordering::Relaxed),
            kv_budget_bytes: self.budget.budget_bytes,
            completed: c.completed.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
            cached_tokens: c.cached_tokens.load(Ordering::Relaxed),
            completion_tokens: c.completion_tokens.load(Ordering::Relaxed),
            drafted_tokens: c.drafted_tokens.load(Ordering::Relaxed),
            accepted_tokens: c.accepted_tokens.load(Ordering::Relaxed),
            outside_batch: c.outside_batch.lock().unwrap().clone(),
            prompt_cache: prefixes.ram,
            ssd: prefixes.ssd,
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

    /// Requests submitted and not yet finished (queued, running, or being
    /// wound down after their client left).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Whether the worker is idle with an empty queue.
    pub fn is_idle(&self) -> bool {
        self.counters.queued.load(Ordering::SeqCst) == 0
            && self.counters.active.load(Ordering::SeqCst) == 0
    }

    /// Waits for the worker to end: a rank following rank 0 ends when rank 0
    /// broadcasts its shutdown.
    pub fn wait_stopped(&self) {
        if let Some(handle) = self.worker.lock().unwrap().take() {
            let _ = handle.join();
        }
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
