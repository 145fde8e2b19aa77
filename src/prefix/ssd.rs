//! The SSD cold tier of the server's prompt cache (`serve --ssd-cache DIR`).
//!
//! Every KV cache the RAM prompt cache keeps (finished requests, and entries
//! it evicts that are not on disk yet) is copied to host memory on the
//! worker and handed to a write-behind thread, which writes it as one file.
//! After a restart, a prompt whose prefix is on disk is restored from its
//! file (memory-mapped, checked, trimmed to the shared prefix) and only the
//! rest is prefilled.
//!
//! The files are the database; there is no other index. Each is a
//! prompt-cache file in mlx-lm's layout ([`crate::prefix::file`]) whose metadata
//! also holds the format version, the model and tokenizer fingerprints, the
//! KV cache settings, the token ids and a CRC-32 of every tensor and of the
//! token list. Writes go to a temporary name, are fsynced and renamed (then
//! the folder is fsynced), so a file under its final name is complete; a
//! leftover temporary file is removed at start. A file that cannot be read,
//! fails a checksum or belongs to another model, tokenizer, format or KV
//! setting is moved to `DIR/quarantine/` and logged, never fatal. The byte
//! cap evicts the least recently used files (recency is the file's mtime,
//! touched on every hit). A write that fails (full or read-only disk) is
//! dropped, logged once, and the server keeps serving.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::{Array, Dtype};
use safetensors::SafeTensors;

use super::file;
use crate::cache::{trim_all, KvCache};
use crate::model::Model;

/// Bumped when the file layout or its metadata change meaning.
pub(crate) const FORMAT_VERSION: &str = "1";
const VERSION_KEY: &str = "mlx_bun_ssd_version";
const KV_CONFIG_KEY: &str = "mlx_bun_kv_config";
const CHECKSUMS_KEY: &str = "mlx_bun_checksums";
/// The checksum entry of the token list.
const TOKENS_SUM: &str = "__tokens__";
const QUARANTINE: &str = "quarantine";
const EXT: &str = "safetensors";
/// Snapshots waiting for the writer; more are dropped (the disk is behind).
const MAX_PENDING: usize = 2;
/// A header larger than this is not ours.
const MAX_HEADER: u64 = 64 << 20;

/// Where the tier lives and what its entries must match.
#[derive(Clone, Debug)]
pub struct SsdConfig {
    /// The folder holding the entries (`--ssd-cache`).
    pub dir: PathBuf,
    /// Byte cap of the folder's entries (the quarantine is not counted).
    pub max_bytes: u64,
    /// The weights (and adapter) an entry was made with.
    pub model_fingerprint: String,
    /// The tokenizer files an entry's token ids come from.
    pub tokenizer_fingerprint: String,
    /// The KV cache settings (quantization, bound) an entry was made with.
    pub kv_config: String,
    /// A pause between an entry's fsync and its rename (a test hook, so a
    /// test can kill the process mid-write); zero in use.
    pub write_delay: std::time::Duration,
}

impl SsdConfig {
    /// The tier in `dir` for the model in `model_dir` (with `adapter`
    /// applied) and caches built with `kv`.
    pub fn for_model(
        dir: PathBuf,
        max_bytes: u64,
        model_dir: &Path,
        adapter: Option<&Path>,
        kv: &crate::cache::KvSettings,
    ) -> Result<SsdConfig> {
        let mut model_fingerprint = file::model_fingerprint(model_dir)?;
        if let Some(adapter) = adapter {
            let mut files: Vec<PathBuf> = std::fs::read_dir(adapter)
                .with_context(|| format!("listing {}", adapter.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            let mut h = crc32fast::Hasher::new();
            for f in files {
                h.update(&std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?);
            }
            model_fingerprint = format!("{model_fingerprint}+adapter-{:08x}", h.finalize());
        }
        Ok(SsdConfig {
            dir,
            max_bytes,
            model_fingerprint,
            tokenizer_fingerprint: file::tokenizer_fingerprint(model_dir)?,
            kv_config: kv.describe(),
            write_delay: std::time::Duration::ZERO,
        })
    }
}

/// Counters for `/stats` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SsdStats {
    /// Lookups restored from disk.
    pub hits: u64,
    /// Lookups that found nothing in RAM or on disk.
    pub misses: u64,
    /// Entries on disk.
    pub entries: usize,
    /// Bytes of the entries on disk.
    pub bytes: u64,
    /// The byte cap (`--ssd-cache-max`).
    pub max_bytes: u64,
    /// Files written and committed.
    pub writes: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Snapshots dropped because the writer was behind.
    pub dropped_writes: u64,
    /// Files found unreadable or written for another setting, moved to `quarantine/`.
    pub quarantined: u64,
    /// Seconds spent restoring entries, in all.
    pub restore_seconds_total: f64,
    /// Seconds the last restore took.
    pub last_restore_s: f64,
}

struct DiskEntry {
    tokens: Vec<u32>,
    name: String,
    bytes: u64,
    last_used: SystemTime,
}

#[derive(Default)]
struct State {
    entries: Vec<DiskEntry>,
    stats: SsdStats,
    warned_write: bool,
}

impl State {
    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    fn refresh(&mut self) {
        self.stats.entries = self.entries.len();
        self.stats.bytes = self.bytes();
    }
}

/// A tensor copied to host memory, ready for the writer.
struct HostTensor {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &HostTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

struct Snapshot {
    tokens: Vec<u32>,
    tensors: Vec<(String, HostTensor)>,
    meta: BTreeMap<String, String>,
}

/// A live view of a tier's counters (the writer updates them).
#[derive(Clone)]
pub(crate) struct SsdStatsHandle(Arc<Mutex<State>>);

impl SsdStatsHandle {
    pub fn get(&self) -> SsdStats {
        self.0.lock().unwrap().stats
    }
}

pub(crate) struct SsdTier {
    cfg: Arc<SsdConfig>,
    state: Arc<Mutex<State>>,
    pending: Arc<AtomicUsize>,
    tx: Option<SyncSender<Snapshot>>,
    writer: Option<JoinHandle<()>>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn tokens_text(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The file name of an entry: a hash of its tokens and KV settings.
fn entry_name(tokens: &[u32], kv_config: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in kv_config.as_bytes().iter().chain(
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<_>>()
            .iter(),
    ) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}-{}.{EXT}", tokens.len())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The free metadata (`0.` keys) of a safetensors header.
fn free_metadata(meta: &HashMap<String, String>) -> BTreeMap<String, String> {
    meta.iter()
        .filter_map(|(k, v)| k.strip_prefix("0.").map(|k| (k.to_string(), v.clone())))
        .collect()
}

/// Checks an entry's header against this server; its tokens and checksums.
fn check_header(
    meta: &BTreeMap<String, String>,
    cfg: &SsdConfig,
) -> Result<(Vec<u32>, BTreeMap<String, u32>)> {
    let field = |k: &str| {
        meta.get(k)
            .ok_or_else(|| anyhow!("no {k} in the header: not an SSD cache entry"))
    };
    let version = field(VERSION_KEY)?;
    if version != FORMAT_VERSION {
        bail!("format version {version}, this server reads {FORMAT_VERSION}");
    }
    let pairs = [
        (
            file::MODEL_FINGERPRINT_KEY,
            &cfg.model_fingerprint,
            "model weights",
        ),
        (
            file::TOKENIZER_FINGERPRINT_KEY,
            &cfg.tokenizer_fingerprint,
            "tokenizer",
        ),
        (KV_CONFIG_KEY, &cfg.kv_config, "KV cache settings"),
    ];
    for (key, want, what) in pairs {
        let have = field(key)?;
        if have != want {
            bail!("made with other {what} ({have}, this server {want})");
        }
    }
    let sums: BTreeMap<String, u32> = serde_json::from_str(field(CHECKSUMS_KEY)?)
        .map_err(|e| anyhow!("bad checksum list: {e}"))?;
    let text = field(file::TOKENS_KEY)?;
    if sums.get(TOKENS_SUM) != Some(&crc32fast::hash(text.as_bytes())) {
        bail!("the token list fails its checksum");
    }
    let tokens: Vec<u32> = if text.is_empty() {
        Vec::new()
    } else {
        text.split(',')
            .map(|t| t.parse())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| anyhow!("bad token list"))?
    };
    if tokens.is_empty() {
        bail!("the entry holds no tokens");
    }
    Ok((tokens, sums))
}

/// Reads only the header of `path` (8-byte length, then JSON).
fn read_file_header(path: &Path) -> Result<BTreeMap<String, String>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).context("truncated")?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || n + 8 > len {
        bail!("truncated or not a safetensors file (header length {n}, file {len} bytes)");
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf).context("truncated header")?;
    let header: serde_json::Value =
        serde_json::from_slice(&buf).map_err(|e| anyhow!("bad header: {e}"))?;
    let meta: HashMap<String, String> = serde_json::from_value(
        header
            .get("__metadata__")
            .cloned()
            .ok_or_else(|| anyhow!("no metadata in the header"))?,
    )
    .map_err(|e| anyhow!("bad metadata: {e}"))?;
    Ok(free_metadata(&meta))
}

/// Verifies every checksum of a whole file; its tokens.
fn verify(bytes: &[u8], cfg: &SsdConfig) -> Result<Vec<u32>> {
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("bad header ({e:?})"))?;
    let meta = free_metadata(&header.metadata().clone().unwrap_or_default());
    let (tokens, sums) = check_header(&meta, cfg)?;
    let st =
        SafeTensors::deserialize(bytes).map_err(|e| anyhow!("truncated or corrupt ({e:?})"))?;
    if sums.len() != st.len() + 1 {
        bail!("{} tensors, {} checksums", st.len(), sums.len() - 1);
    }
    for (name, view) in st.tensors() {
        let want = sums
            .get(&name)
            .ok_or_else(|| anyhow!("tensor {name} has no checksum"))?;
        if crc32fast::hash(view.data()) != *want {
            bail!("tensor {name} fails its checksum");
        }
    }
    Ok(tokens)
}

fn host_bytes<T: mlx_rs::ArrayElement>(a: &Array) -> Result<Vec<u8>> {
    let s = a.try_as_slice::<T>().map_err(|e| anyhow!("{e:?}"))?;
    // SAFETY: every `ArrayElement` is a scalar without padding, so all
    // `size_of_val(s)` bytes are initialised; the view borrows `s` and is
    // copied out before `a` can change.
    let bytes =
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) };
    Ok(bytes.to_vec())
}

/// Copies the tensors of `caches` to host memory (on the worker: MLX arrays
/// stay on its thread).
#[allow(clippy::type_complexity)]
fn host_tensors(
    caches: &[Box<dyn KvCache>],
) -> Result<(Vec<(String, HostTensor)>, BTreeMap<String, String>)> {
    let (tensors, meta) = file::layout(caches, &BTreeMap::new(), false)?;
    let mut ready = Vec::with_capacity(tensors.len());
    for (name, a) in tensors {
        let a = match a.dtype() {
            Dtype::Float32 | Dtype::Uint32 | Dtype::Int32 => a,
            _ => a.as_dtype(Dtype::Float32)?,
        };
        ready.push((name, a.contiguous()?));
    }
    mlx_rs::transforms::eval(ready.iter().map(|(_, a)| a))?;
    let host = ready
        .into_iter()
        .map(|(name, a)| {
            let (dtype, data) = match a.dtype() {
                Dtype::Float32 => (safetensors::Dtype::F32, host_bytes::<f32>(&a)?),
                Dtype::Uint32 => (safetensors::Dtype::U32, host_bytes::<u32>(&a)?),
                _ => (safetensors::Dtype::I32, host_bytes::<i32>(&a)?),
            };
            let shape = a.shape().iter().map(|&d| d as usize).collect();
            Ok((name, HostTensor { dtype, shape, data }))
        })
        .collect::<Result<_>>()?;
    Ok((host, meta))
}

impl SsdTier {
    /// Opens (creating) the folder, removes leftover temporary files,
    /// quarantines what this server cannot use, and starts the writer.
    pub fn open(cfg: SsdConfig) -> Result<SsdTier> {
        std::fs::create_dir_all(&cfg.dir)
            .with_context(|| format!("creating the SSD cache folder {}", cfg.dir.display()))?;
        let cfg = Arc::new(cfg);
        let mut state = State::default();
        state.stats.max_bytes = cfg.max_bytes;
        let listing = std::fs::read_dir(&cfg.dir)
            .with_context(|| format!("listing {}", cfg.dir.display()))?;
        for item in listing.flatten() {
            let path = item.path();
            let name = item.file_name().to_string_lossy().into_owned();
            if !path.is_file() {
                continue;
            }
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A write that never committed (the process died mid-write).
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(EXT) {
                continue;
            }
            let entry = read_file_header(&path).and_then(|m| check_header(&m, &cfg));
            match entry {
                Ok((tokens, _)) => {
                    let meta = item.metadata()?;
                    state.entries.push(DiskEntry {
                        tokens,
                        name,
                        bytes: meta.len(),
                        last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
                Err(e) => quarantine(&cfg, &mut state, &name, &format!("{e:#}")),
            }
        }
        evict(&cfg, &mut state);
        state.refresh();
        tracing::info!(
            "SSD prompt cache {}: {} entries, {} MB",
            cfg.dir.display(),
            state.stats.entries,
            state.stats.bytes / 1_000_000
        );
        let state = Arc::new(Mutex::new(state));
        let pending = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = sync_channel::<Snapshot>(MAX_PENDING);
        let writer = {
            let (cfg, state, pending) = (cfg.clone(), state.clone(), pending.clone());
            std::thread::Builder::new()
                .name("mlx-bun-ssd-writer".into())
                .spawn(move || {
                    for snap in rx {
                        write_and_commit(&cfg, &state, snap);
                        pending.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .context("starting the SSD cache writer")?
        };
        Ok(SsdTier {
            cfg,
            state,
            pending,
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    pub(crate) fn stats_handle(&self) -> SsdStatsHandle {
        SsdStatsHandle(self.state.clone())
    }

    #[cfg(test)]
    fn stats(&self) -> SsdStats {
        self.state.lock().unwrap().stats
    }

    /// The on-disk entry sharing the longest prefix (more than `better_than`
    /// tokens) with `prompt`, leaving at least one token to process.
    /// The entry serving the longest prefix of `prompt` beyond
    /// `better_than` tokens: its name, the usable length and its length.
    /// With `whole_only` (caches that cannot drop positions) an entry serves
    /// only a prompt that extends all of it.
    fn best(
        &self,
        prompt: &[u32],
        better_than: usize,
        whole_only: bool,
    ) -> Option<(String, usize, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let state = self.state.lock().unwrap();
        state
            .entries
            .iter()
            .map(|e| {
                let n = common_prefix(&e.tokens, prompt).min(limit);
                (
                    e,
                    if whole_only && n < e.tokens.len() {
                        0
                    } else {
                        n
                    },
                )
            })
            .filter(|&(_, n)| n > better_than)
            .max_by_key(|&(e, n)| (n, e.last_used))
            .map(|(e, n)| (e.name.clone(), n, e.tokens.len()))
    }

    /// Caches holding a longer prefix of `prompt` than `ram_cached` tokens,
    /// restored from disk, and its length. A corrupt entry is quarantined
    /// and the next best one tried.
    pub fn restore(
        &self,
        model: &Model,
        prompt: &[u32],
        ram_cached: usize,
    ) -> Option<(Vec<Box<dyn KvCache>>, usize)> {
        let whole_only = !model.make_caches().iter().all(|c| c.is_trimmable());
        loop {
            let Some((name, usable, len)) = self.best(prompt, ram_cached, whole_only) else {
                if ram_cached == 0 {
                    self.state.lock().unwrap().stats.misses += 1;
                }
                return None;
            };
            let started = Instant::now();
            match self.load(model, &name, len, usable) {
                Ok(caches) => {
                    let took = started.elapsed().as_secs_f64();
                    let now = SystemTime::now();
                    if let Ok(f) = File::options().write(true).open(self.cfg.dir.join(&name)) {
                        let _ = f.set_modified(now);
                    }
                    let mut state = self.state.lock().unwrap();
                    if let Some(e) = state.entries.iter_mut().find(|e| e.name == name) {
                        e.last_used = now;
                    }
                    state.stats.hits += 1;
                    state.stats.restore_seconds_total += took;
                    state.stats.last_restore_s = took;
                    tracing::debug!("SSD prompt cache: restored {usable} tokens in {took:.3} s");
                    return Some((caches, usable));
                }
                Err(Restore::Gone) => self.forget(&name),
                Err(Restore::Unusable) => {
                    // A wrapped sliding window cannot be rewound to the prefix.
                    if ram_cached == 0 {
                        self.state.lock().unwrap().stats.misses += 1;
                    }
                    return None;
                }
                Err(Restore::Corrupt(e)) => {
                    let mut state = self.state.lock().unwrap();
                    quarantine(&self.cfg, &mut state, &name, &e);
                    state.refresh();
                }
            }
        }
    }

    fn forget(&self, name: &str) {
        let mut state = self.state.lock().unwrap();
        state.entries.retain(|e| e.name != name);
        state.refresh();
    }

    fn load(
        &self,
        model: &Model,
        name: &str,
        len: usize,
        usable: usize,
    ) -> std::result::Result<Vec<Box<dyn KvCache>>, Restore> {
        let path = self.cfg.dir.join(name);
        let file = File::open(&path).map_err(|_| Restore::Gone)?;
        // SAFETY: files are never modified in place (writes go to a new name
        // and are renamed); a file deleted meanwhile stays mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Restore::Corrupt(format!("cannot map: {e}")))?;
        let corrupt = |e: anyhow::Error| Restore::Corrupt(format!("{e:#}"));
        let tokens = verify(&map, &self.cfg).map_err(corrupt)?;
        if tokens.len() != len {
            return Err(Restore::Corrupt("the token list changed".into()));
        }
        let file = file::parse(&map, &path).map_err(corrupt)?;
        let mut caches = file.caches;
        if caches.len() != model.decoder.cache_count() || caches.iter().any(|c| c.offset() != len) {
            return Err(Restore::Corrupt(format!(
                "{} layers holding {} positions; expected {} layers holding {len}",
                caches.len(),
                caches.first().map_or(0, |c| c.offset()),
                model.decoder.cache_count()
            )));
        }
        file::cast_to(&mut caches, model.dtype).map_err(corrupt)?;
        if !trim_all(&mut caches, len - usable) {
            return Err(Restore::Unusable);
        }
        Ok(caches)
    }

    /// Hands a copy of `caches` (holding exactly `tokens`) to the writer,
    /// unless the entry is on disk already or the writer is behind.
    pub fn snapshot(&self, tokens: &[u32], caches: &[Box<dyn KvCache>]) {
        if tokens.is_empty() || caches.iter().any(|c| c.offset() != tokens.len()) {
            return;
        }
        let name = entry_name(tokens, &self.cfg.kv_config);
        {
            let mut state = self.state.lock().unwrap();
            if let Some(e) = state.entries.iter_mut().find(|e| e.name == name) {
                e.last_used = SystemTime::now();
                return;
            }
            if self.pending.load(Ordering::SeqCst) >= MAX_PENDING {
                state.stats.dropped_writes += 1;
                return;
            }
        }
        let (tensors, layout_meta) = match host_tensors(caches) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("SSD prompt cache: cannot copy a cache: {e:#}");
                return;
            }
        };
        let mut meta = layout_meta;
        let text = tokens_text(tokens);
        let mut sums: BTreeMap<String, u32> = tensors
            .iter()
            .map(|(n, t)| (n.clone(), crc32fast::hash(&t.data)))
            .collect();
        sums.insert(TOKENS_SUM.into(), crc32fast::hash(text.as_bytes()));
        let free = [
            (VERSION_KEY, FORMAT_VERSION.to_string()),
            (
                file::MODEL_FINGERPRINT_KEY,
                self.cfg.model_fingerprint.clone(),
            ),
            (
                file::TOKENIZER_FINGERPRINT_KEY,
                self.cfg.tokenizer_fingerprint.clone(),
            ),
            (KV_CONFIG_KEY, self.cfg.kv_config.clone()),
            (file::TOKENS_KEY, text),
            (CHECKSUMS_KEY, serde_json::to_string(&sums).unwrap()),
            ("model", self.cfg.model_fingerprint.clone()),
        ];
        for (k, v) in free {
            meta.insert(format!("0.{k}"), v);
        }
        let snap = Snapshot {
            tokens: tokens.to_vec(),
            tensors,
            meta,
        };
        self.pending.fetch_add(1, Ordering::SeqCst);
        if let Some(tx) = &self.tx {
            if tx.try_send(snap).is_err() {
                self.pending.fetch_sub(1, Ordering::SeqCst);
                self.state.lock().unwrap().stats.dropped_writes += 1;
            }
        }
    }

    /// Whether an entry with exactly `tokens` is on disk.
    pub fn contains(&self, tokens: &[u32]) -> bool {
        let name = entry_name(tokens, &self.cfg.kv_config);
        let state = self.state.lock().unwrap();
        state.entries.iter().any(|e| e.name == name)
    }
}

impl Drop for SsdTier {
    /// Lets the writer finish what it holds.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

enum Restore {
    /// The file was removed meanwhile.
    Gone,
    /// Valid, but cannot be trimmed back to the shared prefix.
    Unusable,
    Corrupt(String),
}

/// Moves `name` out of the way (or deletes it when it cannot be moved) and
/// forgets it.
fn quarantine(cfg: &SsdConfig, state: &mut State, name: &str, why: &str) {
    let from = cfg.dir.join(name);
    let to_dir = cfg.dir.join(QUARANTINE);
    let moved =
        std::fs::create_dir_all(&to_dir).and_then(|()| std::fs::rename(&from, to_dir.join(name)));
    match moved {
        Ok(()) => tracing::warn!(
            "SSD prompt cache: {} moved to {}/: {why}",
            from.display(),
            to_dir.display()
        ),
        Err(e) => tracing::warn!(
            "SSD prompt cache: {} is unusable ({why}) and could not be moved ({e}); ignored",
            from.display()
        ),
    }
    state.entries.retain(|e| e.name != name);
    state.stats.quarantined += 1;
}

/// Deletes the least recently used entries until the folder fits its cap.
fn evict(cfg: &SsdConfig, state: &mut State) {
    let mut bytes = state.bytes();
    while bytes > cfg.max_bytes && !state.entries.is_empty() {
        let (i, _) = state
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
            .unwrap();
        let e = state.entries.swap_remove(i);
        let _ = std::fs::remove_file(cfg.dir.join(&e.name));
        bytes -= e.bytes;
    }
}

/// Writes `snap` atomically; the path written and its size.
fn write_entry(cfg: &SsdConfig, snap: &Snapshot) -> Result<(String, u64)> {
    let name = entry_name(&snap.tokens, &cfg.kv_config);
    let target = cfg.dir.join(&name);
    let tmp = cfg.dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let meta: HashMap<String, String> = snap.meta.clone().into_iter().collect();
    let result = (|| -> Result<u64> {
        safetensors::serialize_to_file(
            snap.tensors.iter().map(|(n, t)| (n.as_str(), t)),
            &Some(meta),
            &tmp,
        )
        .map_err(|e| anyhow!("{e:?}"))?;
        let f = File::open(&tmp)?;
        f.sync_all()?;
        let len = f.metadata()?.len();
        if !cfg.write_delay.is_zero() {
            std::thread::sleep(cfg.write_delay);
        }
        std::fs::rename(&tmp, &target)?;
        sync_dir(&cfg.dir);
        Ok(len)
    })();
    match result {
        Ok(len) => Ok((name, len)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e).with_context(|| format!("writing {}", target.display()))
        }
    }
}

fn write_and_commit(cfg: &SsdConfig, state: &Mutex<State>, snap: Snapshot) {
    match write_entry(cfg, &snap) {
        Ok((name, bytes)) => {
            let mut state = state.lock().unwrap();
            // Entries that are a prefix of this one are served by it.
            let tokens = &snap.tokens;
            let mut dominated = Vec::new();
            state.entries.retain(|e| {
                let d = e.name != name && tokens.starts_with(&e.tokens);
                if d {
                    dominated.push(e.name.clone());
                }
                !d
            });
            for d in dominated {
                let _ = std::fs::remove_file(cfg.dir.join(d));
            }
            state.entries.retain(|e| e.name != name);
            state.entries.push(DiskEntry {
                tokens: snap.tokens,
                name,
                bytes,
                last_used: SystemTime::now(),
            });
            state.stats.writes += 1;
            evict(cfg, &mut state);
            state.refresh();
        }
        Err(e) => {
            let mut state = state.lock().unwrap();
            state.stats.write_errors += 1;
            if !state.warned_write {
                state.warned_write = true;
                tracing::warn!(
                    "SSD prompt cache: {e:#}; writes that fail are dropped (logged once), \
                     the server keeps serving"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::StandardCache;

    fn cfg(dir: &Path, max_bytes: u64) -> SsdConfig {
        SsdConfig {
            dir: dir.to_path_buf(),
            max_bytes,
            model_fingerprint: "m1".into(),
            tokenizer_fingerprint: "t1".into(),
            kv_config: "dense".into(),
            write_delay: std::time::Duration::ZERO,
        }
    }

    fn caches(layers: usize, n: usize, fill: f32) -> Vec<Box<dyn KvCache>> {
        (0..layers)
            .map(|_| {
                let mut c = StandardCache::new();
                let kv = Array::from_slice(&vec![fill; n * 4], &[1, 1, n as i32, 4]);
                c.update_and_fetch(&kv, &kv).unwrap();
                Box::new(c) as Box<dyn KvCache>
            })
            .collect()
    }

    /// Waits until the writer has committed `n` files.
    fn wait_writes(tier: &SsdTier, n: u64) {
        for _ in 0..500 {
            if tier.stats().writes >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the writer did not commit {n} files: {:?}", tier.stats());
    }

    fn entry_files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Loads an entry as a restore does, without a model.
    fn load_tokens(tier: &SsdTier, prompt: &[u32]) -> Option<(Vec<u32>, Vec<f32>)> {
        let (name, _, _) = tier.best(prompt, 0, false)?;
        let bytes = std::fs::read(tier.cfg.dir.join(&name)).unwrap();
        let tokens = verify(&bytes, &tier.cfg).ok()?;
        let file = file::parse(&bytes, Path::new(&name)).unwrap();
        let (k, _) = file.caches[0].state().unwrap();
        Some((tokens, k.as_slice::<f32>().to_vec()))
    }

    #[test]
    fn written_entries_survive_a_reopen_with_their_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        tier.snapshot(&[5, 6, 7], &caches(2, 3, 0.5));
        wait_writes(&tier, 1);
        drop(tier);
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        assert_eq!(tier.stats().entries, 1);
        assert!(tier.contains(&[5, 6, 7]));
        let (tokens, k) = load_tokens(&tier, &[5, 6, 7, 8]).unwrap();
        assert_eq!(tokens, vec![5, 6, 7]);
        assert_eq!(k, vec![0.5; 12]);
        assert!(tier.best(&[9, 9], 0, false).is_none());
    }

    #[test]
    fn corrupt_truncated_and_foreign_files_are_quarantined() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        tier.snapshot(&[1, 2, 3], &caches(1, 3, 1.0));
        wait_writes(&tier, 1);
        drop(tier);
        let good = entry_files(dir.path()).pop().unwrap();
        let bytes = std::fs::read(dir.path().join(&good)).unwrap();
        // A flipped byte in the tensor data: the header still parses.
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        std::fs::write(dir.path().join("flipped.safetensors"), &flipped).unwrap();
        std::fs::write(
            dir.path().join("short.safetensors"),
            &bytes[..bytes.len() - 8],
        )
        .unwrap();
        std::fs::write(dir.path().join("garbage.safetensors"), b"not a file").unwrap();
        std::fs::write(dir.path().join(".x.1.tmp"), b"half a write").unwrap();
        // The truncated file's header is intact: it is found on use, not at open.
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        assert!(!dir.path().join(".x.1.tmp").exists());
        assert_eq!(tier.stats().quarantined, 1, "garbage at open");
        // Every entry but the good one fails its checks on load.
        let names: Vec<String> = {
            let st = tier.state.lock().unwrap();
            st.entries.iter().map(|e| e.name.clone()).collect()
        };
        assert_eq!(names.len(), 3, "{names:?}");
        let usable: Vec<&String> = names
            .iter()
            .filter(|n| verify(&std::fs::read(dir.path().join(n)).unwrap(), &tier.cfg).is_ok())
            .collect();
        assert_eq!(usable, vec![&good]);
        let q = entry_files(&dir.path().join(QUARANTINE));
        assert!(q.contains(&"garbage.safetensors".to_string()), "{q:?}");
        drop(tier);
        // Another model's server quarantines the good file too.
        let mut other = cfg(dir.path(), 1 << 30);
        other.model_fingerprint = "m2".into();
        let tier = SsdTier::open(other).unwrap();
        assert_eq!(tier.stats().entries, 0);
        assert!(entry_files(&dir.path().join(QUARANTINE)).contains(&good));
    }

    #[test]
    fn a_failed_checksum_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        tier.snapshot(&[1, 2], &caches(1, 2, 2.0));
        wait_writes(&tier, 1);
        let name = entry_files(dir.path()).pop().unwrap();
        let mut bytes = std::fs::read(dir.path().join(&name)).unwrap();
        assert!(verify(&bytes, &tier.cfg).is_ok());
        let n = bytes.len();
        bytes[n - 5] ^= 1;
        let err = verify(&bytes, &tier.cfg).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn byte_cap_evicts_least_recently_used_and_extensions_replace_prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        tier.snapshot(&[1, 2], &caches(1, 2, 1.0));
        wait_writes(&tier, 1);
        tier.snapshot(&[1, 2, 3, 4], &caches(1, 4, 1.0));
        wait_writes(&tier, 2);
        assert_eq!(tier.stats().entries, 1, "the prefix entry is replaced");
        let one = tier.stats().bytes;
        drop(tier);
        // A cap of about two entries: the third write evicts the oldest.
        let tier = SsdTier::open(cfg(dir.path(), 2 * one + one / 2)).unwrap();
        tier.snapshot(&[7, 8, 9, 10], &caches(1, 4, 1.0));
        wait_writes(&tier, 1);
        {
            // [1,2,3,4] is used again: [7,8,9,10] is now the oldest.
            let mut st = tier.state.lock().unwrap();
            let e = st.entries.iter_mut().find(|e| e.tokens[0] == 1).unwrap();
            e.last_used = SystemTime::now() + std::time::Duration::from_secs(1);
        }
        tier.snapshot(&[5, 5, 5, 5], &caches(1, 4, 1.0));
        wait_writes(&tier, 2);
        let s = tier.stats();
        assert_eq!(s.entries, 2);
        assert!(s.bytes <= 2 * one + one / 2);
        assert!(tier.contains(&[1, 2, 3, 4]));
        assert!(!tier.contains(&[7, 8, 9, 10]));
        assert_eq!(entry_files(dir.path()).len(), 2);
    }

    #[test]
    fn an_unwritable_folder_drops_writes_and_keeps_going() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(cfg(dir.path(), 1 << 30)).unwrap();
        // The folder disappears under the server (as a disk going away).
        std::fs::remove_dir_all(dir.path()).unwrap();
        tier.snapshot(&[1, 2], &caches(1, 2, 1.0));
        tier.snapshot(&[3, 4], &caches(1, 2, 1.0));
        for _ in 0..500 {
            if tier.stats().write_errors + tier.stats().dropped_writes >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let s = tier.stats();
        assert_eq!(s.writes, 0);
        assert!(s.write_errors >= 1, "{s:?}");
        assert!(tier.best(&[1, 2, 3], 0, false).is_none());
    }
}
