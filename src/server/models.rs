//! Models per request: which models a server may serve, and the pool that
//! loads them on demand.
//!
//! A request's `model` (with `adapters` and `draft_model`, as in mlx-lm)
//! names a pool entry. Each entry owns one [`Gateway`] (its own worker thread
//! and models). Requests for the same unloaded entry share one load; a load
//! runs on a blocking thread, so other models keep serving meanwhile. Loaded
//! entries are kept in an LRU under a memory budget counted in weight bytes;
//! an entry with a request in flight (or still loading) is never evicted, and
//! neither is the one used last, so a single model larger than the budget
//! still serves.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use super::error::ApiError;
use super::fields::Fields;
use crate::cache::KvSettings;
use crate::gateway::{Gateway, GatewayConfig, GatewayStats, Health};
use crate::model::ComputeDtype;
use crate::runtime::{DraftSpec, FitCheck, Refusal, Runtime, RuntimeSpec};
use crate::tokenizer::Tokenizer;

/// Where models other than the default may come from (`--allowed-models`).
#[derive(Clone, Debug)]
pub enum Allowed {
    /// Every subfolder with a `config.json`; its id is the folder name.
    Dir(PathBuf),
    /// Every folder the pattern matches; its id is the matched path.
    Glob(glob::Pattern),
}

impl Allowed {
    /// A folder when `spec` names one, else a glob pattern.
    pub fn parse(spec: &str) -> Result<Self> {
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(Allowed::Dir(path.to_path_buf()));
        }
        if !spec.contains(['*', '?', '[']) {
            anyhow::bail!("--allowed-models {spec:?} is neither a folder nor a glob pattern");
        }
        let pattern = glob::Pattern::new(spec)
            .with_context(|| format!("--allowed-models {spec:?} is not a valid glob pattern"))?;
        Ok(Allowed::Glob(pattern))
    }
}

/// What the model pool may serve and how: the default model, the allowed others,
/// the memory budget and each gateway's settings.
pub struct PoolConfig {
    /// The id of `--model`, served when a request names no model.
    pub default_id: String,
    /// The default model's folder.
    pub default_dir: PathBuf,
    /// `--adapter-path`, for requests that give no `adapters`.
    pub default_adapter: Option<PathBuf>,
    /// `--draft-model` (a draft model or prompt lookup), for requests that
    /// give no `draft_model`.
    pub default_draft: Option<DraftSpec>,
    /// `--num-draft-tokens`, for every drafting model.
    pub num_draft_tokens: usize,
    /// `--max-kv-size`, `--kv-bits`, …: the default model's KV settings.
    pub default_kv: KvSettings,
    /// Where other models may come from (`--allowed-models`).
    pub allowed: Vec<Allowed>,
    /// Any local model folder or cached Hub id may be served.
    pub allow_any: bool,
    /// Weight bytes the loaded models may hold together.
    pub memory_budget_bytes: u64,
    /// Context each model must hold in the available memory to be loaded.
    pub min_context: usize,
    /// `--chat-template`: a template source for the default model.
    pub chat_template: Option<String>,
    /// `--compute-dtype`, for every model the pool loads.
    pub compute: ComputeDtype,
    /// Whether a model must fit in the available memory to be loaded
    /// (`MLX_BUN_SKIP_FIT_CHECK=1` turns the check off).
    pub fit_check: bool,
    /// Gateway settings of the default model; other models get the same
    /// without its SSD tier, which is fingerprinted by the default model
    /// (nor do they get its KV settings, sized for it).
    pub gateway: GatewayConfig,
}

/// What a pool entry is: the model folder, adapter and draft it loads.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    dir: PathBuf,
    adapter: Option<PathBuf>,
    draft: Option<DraftSpec>,
}

/// A loaded model, ready for requests.
pub struct Served {
    /// The id responses carry.
    pub id: String,
    /// The model's gateway: its queue and worker.
    pub gateway: Arc<Gateway>,
    /// The model's tokenizer and chat template.
    pub tokenizer: Arc<Tokenizer>,
    /// Token ids below this are valid in prompts and `logit_bias` (the tokenizer's
    /// vocabulary, added tokens included).
    pub vocab_size: usize,
    /// The model's `max_position_embeddings`, when known.
    pub context_length: Option<usize>,
}

struct Slot {
    key: Key,
    id: String,
    weight_bytes: u64,
    loaded: tokio::sync::OnceCell<Result<Arc<Served>, ApiError>>,
    leases: AtomicUsize,
    last_used: Mutex<Instant>,
}

impl Slot {
    fn served(&self) -> Option<&Arc<Served>> {
        self.loaded.get().and_then(|r| r.as_ref().ok())
    }

    /// Loading, leased, or with requests in its gateway.
    fn busy(&self) -> bool {
        self.leases.load(Ordering::SeqCst) > 0
            || match self.loaded.get() {
                None => true,
                Some(Ok(served)) => served.gateway.in_flight() > 0,
                Some(Err(_)) => false,
            }
    }

    fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap()
    }
}

/// A model held for one request: the pool does not evict it while a lease
/// lives (after submission, the gateway's in-flight count holds it).
pub struct Lease {
    slot: Arc<Slot>,
    served: Option<Arc<Served>>,
}

impl std::ops::Deref for Lease {
    type Target = Served;
    fn deref(&self) -> &Served {
        self.served.as_ref().expect("a lease is handed out loaded")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *self.slot.last_used.lock().unwrap() = Instant::now();
        self.slot.leases.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One entry of `/v1/models`.
pub struct Listed {
    /// The model id.
    pub id: String,
    /// Whether the model is loaded now.
    pub loaded: bool,
}

/// The models a server may serve, loaded on demand and evicted least-recently-used
/// under a weight-memory budget.
pub struct ModelPool {
    config: PoolConfig,
    slots: Mutex<Vec<Arc<Slot>>>,
    accepting: AtomicBool,
    created: u64,
    /// Why the default model cannot serve, once its start-up failed.
    failure: Mutex<Option<String>>,
}

/// The name mlx-lm's server gives the model it started with.
pub(crate) const DEFAULT_ALIAS: &str = "default_model";

fn is_model_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file()
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Weight bytes of a model (and its draft) once loaded on this device.
fn weight_bytes(key: &Key, compute: ComputeDtype) -> Result<u64> {
    let mut total = 0;
    let draft = match &key.draft {
        Some(DraftSpec::Model(dir)) => Some(dir),
        Some(DraftSpec::Ngram) | None => None,
    };
    for dir in std::iter::once(&key.dir).chain(draft) {
        let dtype = crate::fit::compute_dtype_bytes(dir, compute)?;
        total += crate::fit::Footprint::read(dir, dtype)?.weight_bytes;
    }
    Ok(total)
}

impl ModelPool {
    /// An empty pool; nothing loads until a request (or
    /// [`ModelPool::start_default`]) asks.
    pub fn new(config: PoolConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            slots: Mutex::new(Vec::new()),
            accepting: AtomicBool::new(true),
            created: super::response::unix_now(),
            failure: Mutex::new(None),
        })
    }

    /// The default model's start-up: loads and warms it, or records why it
    /// cannot serve (what `/health` then reports).
    pub async fn start_default(self: &Arc<Self>) -> Result<(), ApiError> {
        match self.acquire_default().await {
            Ok(lease) => {
                drop(lease);
                Ok(())
            }
            Err(e) => {
                *self.failure.lock().unwrap() = Some(e.message.clone());
                Err(e)
            }
        }
    }

    /// The id of the default model (`--model`).
    pub fn default_id(&self) -> &str {
        &self.config.default_id
    }

    /// Unix time the server started, for `/v1/models`.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// The folder a model id names, if this server may serve it.
    fn resolve(&self, id: &str) -> Option<PathBuf> {
        let c = &self.config;
        // `default_model` is mlx-lm's name for the model the server started with.
        if id == c.default_id || id == DEFAULT_ALIAS || Path::new(id) == c.default_dir {
            return Some(c.default_dir.clone());
        }
        for allowed in &c.allowed {
            match allowed {
                Allowed::Dir(root) => {
                    // A folder name of the root (no `..` or `/` out of it), or
                    // the path of such a folder.
                    let path = Path::new(id);
                    let mut parts = path.components();
                    let candidate = match (parts.next(), parts.next()) {
                        (Some(Component::Normal(name)), None) => root.join(name),
                        _ if path.parent() == Some(root.as_path()) => path.to_path_buf(),
                        _ => continue,
                    };
                    if is_model_dir(&candidate) {
                        return Some(candidate);
                    }
                }
                Allowed::Glob(pattern) => {
                    if pattern.matches(id) && !id.contains("..") && is_model_dir(Path::new(id)) {
                        return Some(PathBuf::from(id));
                    }
                }
            }
        }
        if c.allow_any {
            if is_model_dir(Path::new(id)) {
                return Some(PathBuf::from(id));
            }
            return crate::hub::cached_repo(id);
        }
        None
    }

    /// The 404 for a model this server does not serve.
    fn unknown(&self, field: &str, id: &str) -> ApiError {
        let ids: Vec<String> = self.list().into_iter().map(|m| m.id).collect();
        ApiError::not_found(format!(
            "model {id:?} is not served here; GET /v1/models lists the models this server may \
             serve ({})",
            ids.join(", ")
        ))
        .with_param(field)
        .with_code("model_not_found")
    }

    fn adapter_allowed(&self, dir: &Path) -> bool {
        let c = &self.config;
        if c.allow_any || c.default_adapter.as_deref() == Some(dir) {
            return true;
        }
        let Ok(dir) = dir.canonicalize() else {
            return false;
        };
        c.allowed.iter().any(|a| match a {
            Allowed::Dir(root) => root.canonicalize().is_ok_and(|r| dir.starts_with(r)),
            Allowed::Glob(p) => dir.ancestors().any(|d| p.matches_path(d)),
        })
    }

    /// The entry a request's `model`, `adapters` and `draft_model` name.
    fn key_of(&self, body: &Value) -> Result<(String, Key), ApiError> {
        let f = Fields::of(body)?;
        let c = &self.config;
        let asked = f
            .string("model")?
            .filter(|s| !s.is_empty())
            .unwrap_or(&c.default_id);
        // A server of one model answers whatever name a client sends (agent
        // clients send their own model names), as llama.cpp's does; with
        // other models allowed, a name it cannot serve is a 404.
        let single = c.allowed.is_empty() && !c.allow_any;
        let (id, dir) = match self.resolve(asked) {
            Some(dir) => (asked, dir),
            None if single => (c.default_id.as_str(), c.default_dir.clone()),
            None => return Err(self.unknown("model", asked)),
        };
        let is_default = dir == c.default_dir;
        let adapter = match f.string("adapters")? {
            Some(a) => {
                let a = PathBuf::from(a);
                if !a.join(crate::adapters::CONFIG_FILE).is_file() {
                    return Err(ApiError::invalid(
                        "adapters",
                        format!(
                            "adapters {:?} is not an adapter folder (no {})",
                            a.display(),
                            crate::adapters::CONFIG_FILE
                        ),
                    ));
                }
                if !self.adapter_allowed(&a) {
                    return Err(ApiError::invalid(
                        "adapters",
                        format!(
                            "adapters {:?} is outside the folders this server may load \
                             (--allowed-models, --allow-any-model)",
                            a.display()
                        ),
                    ));
                }
                Some(a)
            }
            None if is_default => c.default_adapter.clone(),
            None => None,
        };
        let draft = match f.string("draft_model")? {
            Some("ngram") => Some(DraftSpec::Ngram),
            Some(d) => Some(DraftSpec::Model(
                self.resolve(d)
                    .ok_or_else(|| self.unknown("draft_model", d))?,
            )),
            None if is_default => c.default_draft.clone(),
            None => None,
        };
        let key = Key {
            dir,
            adapter,
            draft,
        };
        Ok((id.trim_end_matches('/').to_string(), key))
    }

    /// The model a request asks for, loaded and held for it.
    pub(crate) async fn acquire(self: &Arc<Self>, body: &Value) -> Result<Lease, ApiError> {
        let (id, key) = self.key_of(body)?;
        self.acquire_key(id, key).await
    }

    /// The default model, loaded (the server's start-up).
    async fn acquire_default(self: &Arc<Self>) -> Result<Lease, ApiError> {
        let key = Key {
            dir: self.config.default_dir.clone(),
            adapter: self.config.default_adapter.clone(),
            draft: self.config.default_draft.clone(),
        };
        self.acquire_key(self.config.default_id.clone(), key).await
    }

    fn find(&self, key: &Key) -> Option<Arc<Slot>> {
        let slots = self.slots.lock().unwrap();
        slots.iter().find(|s| s.key == *key).cloned()
    }

    async fn acquire_key(self: &Arc<Self>, id: String, key: Key) -> Result<Lease, ApiError> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable(
                "the server is shutting down",
                "shutting_down",
            ));
        }
        // Reading the weight headers touches the disk: only for new entries.
        let estimate = match self.find(&key) {
            Some(_) => 0,
            None => {
                let k = key.clone();
                let compute = self.config.compute;
                tokio::task::spawn_blocking(move || weight_bytes(&k, compute))
                    .await
                    .map_err(|e| ApiError::internal(format!("sizing the model failed: {e}")))?
                    .map_err(|e| {
                        ApiError::internal(format!("model {id:?} cannot be read: {e:#}"))
                    })?
            }
        };
        let (slot, fresh) = {
            let mut slots = self.slots.lock().unwrap();
            let found = slots.iter().find(|s| s.key == key).cloned();
            let fresh = found.is_none();
            let slot = found.unwrap_or_else(|| {
                let slot = Arc::new(Slot {
                    key: key.clone(),
                    id: id.clone(),
                    weight_bytes: estimate,
                    loaded: tokio::sync::OnceCell::new(),
                    leases: AtomicUsize::new(0),
                    last_used: Mutex::new(Instant::now()),
                });
                slots.push(slot.clone());
                slot
            });
            slot.leases.fetch_add(1, Ordering::SeqCst);
            *slot.last_used.lock().unwrap() = Instant::now();
            (slot, fresh)
        };
        let mut lease = Lease {
            slot: slot.clone(),
            served: None,
        };
        if fresh {
            self.evict_over_budget();
        }
        let pool = self.clone();
        let result = slot
            .loaded
            .get_or_init(|| async move {
                let (id, key) = (id.clone(), key.clone());
                tokio::task::spawn_blocking(move || pool.load(&id, &key))
                    .await
                    .unwrap_or_else(|e| Err(ApiError::internal(format!("loading failed: {e}"))))
                    .map(Arc::new)
            })
            .await;
        match result {
            Ok(served) => {
                lease.served = Some(served.clone());
                Ok(lease)
            }
            Err(e) => {
                // A later request tries again.
                self.slots
                    .lock()
                    .unwrap()
                    .retain(|s| !Arc::ptr_eq(s, &slot));
                Err(e.clone())
            }
        }
    }

    /// Loads one entry on the calling (blocking) thread.
    fn load(&self, id: &str, key: &Key) -> Result<Served, ApiError> {
        let failed = |e: anyhow::Error| {
            ApiError::internal(format!("loading model {id:?} failed: {e:#}"))
                .with_code("model_load_failed")
        };
        tracing::info!("loading model {id} from {}", key.dir.display());
        let start = Instant::now();
        let (args, _) = crate::model::read_config(&key.dir).map_err(failed)?;
        let is_default =
            key.dir == self.config.default_dir && key.adapter == self.config.default_adapter;
        let mut tokenizer = Tokenizer::load(&key.dir).map_err(failed)?;
        if let (true, Some(source)) = (is_default, &self.config.chat_template) {
            tokenizer.chat_template = Some(
                crate::chat_template::ChatTemplate::new(
                    source.clone(),
                    tokenizer.bos_token.clone(),
                    tokenizer.eos_token.clone(),
                )
                .map_err(failed)?,
            );
        }
        let min_context = self
            .config
            .min_context
            .min(args.max_position_embeddings.unwrap_or(usize::MAX));
        let (c, kv) = if is_default {
            (self.config.gateway.clone(), self.config.default_kv)
        } else {
            let c = GatewayConfig {
                ssd: None,
                ..self.config.gateway.clone()
            };
            (c, KvSettings::default())
        };
        let spec = RuntimeSpec {
            model_dir: key.dir.clone(),
            compute: self.config.compute,
            adapter: key.adapter.clone(),
            draft: key.draft.clone(),
            num_draft_tokens: self.config.num_draft_tokens,
            kv,
            fit: self.config.fit_check.then_some(FitCheck {
                context: min_context,
                reserved_bytes: c.prompt_cache_bytes as u64,
            }),
            // The gateway's warm-up reads the weights (after splitting the
            // model across ranks, when sharded).
            materialize: false,
        };
        let prepared = Runtime::prepare(&spec, tokenizer).map_err(|e| match e {
            Refusal::Draft(e) => ApiError::invalid("draft_model", format!("{e:#}")),
            Refusal::Fit(e) => ApiError::unavailable(
                format!("model {id:?} does not fit in memory now: {e:#}"),
                "insufficient_memory",
            ),
            Refusal::Other(e) => failed(e),
        })?;
        if let Some(warning) = &prepared.draft_warning {
            tracing::warn!("{warning}");
        }
        let tokenizer = prepared.tokenizer.clone();
        let load = move || prepared.load();
        let gateway = Gateway::start(load, c).map_err(failed)?;
        gateway.wait_ready().map_err(failed)?;
        tracing::info!("model {id} ready in {:.1} s", start.elapsed().as_secs_f64());
        Ok(Served {
            id: id.to_string(),
            gateway: Arc::new(gateway),
            tokenizer,
            vocab_size: args.vocab_size.max(0) as usize,
            context_length: args.max_position_embeddings,
        })
    }

    /// Evicts idle entries, least recently used first, while the entries
    /// hold more than the budget. The entry used last always stays.
    pub fn evict_over_budget(&self) {
        let budget = self.config.memory_budget_bytes;
        let mut evicted = Vec::new();
        {
            let mut slots = self.slots.lock().unwrap();
            loop {
                let total: u64 = slots.iter().map(|s| s.weight_bytes).sum();
                if total <= budget {
                    break;
                }
                let newest = slots.iter().map(|s| s.last_used()).max();
                let victim = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.busy() && Some(s.last_used()) != newest)
                    .min_by_key(|(_, s)| s.last_used())
                    .map(|(i, _)| i);
                match victim {
                    Some(i) => evicted.push(slots.remove(i)),
                    None => {
                        tracing::debug!(
                            "models hold {:.2} GiB over the {:.2} GiB budget; the others are busy",
                            gib(total),
                            gib(budget)
                        );
                        break;
                    }
                }
            }
        }
        for slot in evicted {
            tracing::info!(
                "unloading model {} ({:.2} GiB) to stay within --model-memory",
                slot.id,
                gib(slot.weight_bytes)
            );
            if let Some(served) = slot.served() {
                let gateway = served.gateway.clone();
                // Joining the worker frees its models; not on an async thread.
                std::thread::spawn(move || gateway.shutdown(Duration::ZERO));
            }
        }
    }

    fn loaded(&self) -> Vec<Arc<Served>> {
        let slots = self.slots.lock().unwrap();
        let mut slots: Vec<_> = slots.iter().cloned().collect();
        slots.sort_by_key(|s| std::cmp::Reverse(s.last_used()));
        slots.iter().filter_map(|s| s.served().cloned()).collect()
    }

    /// Ids of the loaded models, most recently used first.
    pub(crate) fn loaded_ids(&self) -> Vec<String> {
        self.loaded().iter().map(|s| s.id.clone()).collect()
    }

    /// The models this server may serve: the default, every model of the
    /// `--allowed-models` folders and globs, and (with `--allow-any-model`)
    /// the Hub repos in the cache and whatever else is loaded.
    pub fn list(&self) -> Vec<Listed> {
        let c = &self.config;
        let loaded = self.loaded_ids();
        let mut ids = vec![c.default_id.clone()];
        for allowed in &c.allowed {
            let mut found: Vec<String> = match allowed {
                Allowed::Dir(root) => std::fs::read_dir(root)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| is_model_dir(&e.path()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect(),
                Allowed::Glob(pattern) => glob::glob(pattern.as_str())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|p| is_model_dir(p))
                    .map(|p| p.display().to_string())
                    .collect(),
            };
            found.sort();
            ids.extend(found);
        }
        if c.allow_any {
            ids.extend(crate::hub::cached_repos());
        }
        ids.extend(loaded.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| seen.insert(id.clone()));
        ids.into_iter()
            .map(|id| Listed {
                loaded: loaded.contains(&id),
                id,
            })
            .collect()
    }

    /// Whether `id` is a model this server may serve.
    pub(crate) fn serves(&self, id: &str) -> bool {
        self.resolve(id).is_some()
    }

    /// At least one model is loaded and every loaded one is ready.
    pub fn is_ready(&self) -> bool {
        self.health() == Health::Ready
    }

    /// Ready when every loaded model is; failed, with its reason, when one
    /// cannot serve; starting otherwise.
    pub fn health(&self) -> Health {
        if let Some(reason) = self.failure.lock().unwrap().clone() {
            return Health::Failed(reason);
        }
        let loaded = self.loaded();
        let states: Vec<Health> = loaded.iter().map(|s| s.gateway.health()).collect();
        if let Some(failed) = states.iter().find(|h| matches!(h, Health::Failed(_))) {
            return failed.clone();
        }
        if !states.is_empty() && states.iter().all(|h| *h == Health::Ready) {
            Health::Ready
        } else {
            Health::Starting
        }
    }

    /// Counters of the model used last (the gateway's view of `/stats`).
    pub fn stats(&self) -> GatewayStats {
        self.loaded()
            .first()
            .map(|s| s.gateway.stats())
            .unwrap_or_default()
    }

    /// Refuses new requests; running ones go on.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
        for served in self.loaded() {
            served.gateway.stop_accepting();
        }
    }

    /// Ends what still runs with a clean error.
    pub fn abort(&self) {
        self.stop_accepting();
        for served in self.loaded() {
            served.gateway.abort();
        }
    }

    /// Stops every gateway, letting requests finish for up to `grace`.
    pub fn shutdown(&self, grace: Duration) {
        self.stop_accepting();
        for served in self.loaded() {
            served.gateway.shutdown(grace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_folder(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
    }

    fn pool(allowed: Vec<Allowed>, allow_any: bool) -> Arc<ModelPool> {
        ModelPool::new(PoolConfig {
            default_id: "main".into(),
            default_dir: PathBuf::from("/nonexistent/main"),
            default_adapter: None,
            default_draft: None,
            num_draft_tokens: 1,
            default_kv: Default::default(),
            allowed,
            allow_any,
            memory_budget_bytes: 0,
            min_context: 1,
            chat_template: None,
            compute: ComputeDtype::Auto,
            fit_check: true,
            gateway: GatewayConfig {
                max_queue: 1,
                prompt_cache_bytes: 0,
                decode_concurrency: 1,
                prompt_concurrency: 1,
                kv_budget_bytes: None,
                ssd: None,
                warmup: Default::default(),
                sharding: Default::default(),
                fixed_prefill_step: None,
            },
        })
    }

    #[test]
    fn folders_and_globs_list_and_resolve_their_models() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("models");
        model_folder(&root.join("a"));
        model_folder(&root.join("b"));
        std::fs::create_dir_all(root.join("not-a-model")).unwrap();
        model_folder(&tmp.path().join("other/x-4bit"));
        model_folder(&tmp.path().join("other/y-8bit"));
        let glob = format!("{}/other/*-4bit", tmp.path().display());
        let p = pool(
            vec![
                Allowed::parse(root.to_str().unwrap()).unwrap(),
                Allowed::parse(&glob).unwrap(),
            ],
            false,
        );
        let x = format!("{}/other/x-4bit", tmp.path().display());
        let ids: Vec<String> = p.list().into_iter().map(|m| m.id).collect();
        assert_eq!(ids, vec!["main", "a", "b", x.as_str()]);
        assert_eq!(p.resolve("a"), Some(root.join("a")));
        assert_eq!(
            p.resolve(root.join("b").to_str().unwrap()),
            Some(root.join("b"))
        );
        assert_eq!(p.resolve(&x), Some(PathBuf::from(&x)));
        assert_eq!(
            p.resolve("default_model"),
            Some(PathBuf::from("/nonexistent/main"))
        );
        for refused in ["not-a-model", "../models/a", "a/../b", "c", "y-8bit"] {
            assert_eq!(p.resolve(refused), None, "{refused}");
        }
        let y = format!("{}/other/y-8bit", tmp.path().display());
        assert_eq!(p.resolve(&y), None);
        // Any local model folder, with --allow-any-model.
        assert_eq!(pool(vec![], true).resolve(&y), Some(PathBuf::from(&y)));
    }

    #[test]
    fn an_unknown_model_is_a_404_naming_it() {
        // A server of one model serves it under any name.
        let (id, key) = pool(vec![], false)
            .key_of(&serde_json::json!({"model": "gpt-9"}))
            .unwrap();
        assert_eq!(
            (id.as_str(), key.dir),
            ("main", PathBuf::from("/nonexistent/main"))
        );
        // With other models allowed, a name it cannot serve is a 404.
        let tmp = tempfile::tempdir().unwrap();
        let p = pool(vec![Allowed::Dir(tmp.path().to_path_buf())], false);
        let e = p
            .key_of(&serde_json::json!({"model": "gpt-9"}))
            .unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
        assert_eq!(e.param.as_deref(), Some("model"));
        assert!(e.message.contains("\"gpt-9\""), "{}", e.message);
        assert!(Allowed::parse("/no/such/folder").is_err());
        assert!(Allowed::parse("/no/such/[folder").is_err());
    }
}
