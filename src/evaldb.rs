//! The eval database: one SQLite file recording every measured run — bench,
//! train, perplexity, evaluate — with where it ran (host, git commit, a
//! fingerprint of the model's files), its flags as JSON and its metrics, so
//! that runs can be listed and compared later.
//!
//! Location: `$MLX_BUN_EVAL_DB` if set, else `$XDG_DATA_HOME/mlx-bun/evals.db`
//! (`~/.local/share/mlx-bun/evals.db`). The schema is versioned with SQLite's
//! `user_version`; [`MIGRATIONS`] upgrades older files in place, keeping their
//! rows. The file is opened in WAL mode with a busy timeout so that several
//! processes can write at once.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;
use serde_json::Value;

/// Ordered schema steps; entry `i` takes a file from version `i` to `i + 1`.
/// Never edit a released step: append a new one.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: training runs, their steps and validation results.
    "CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        model TEXT NOT NULL,
        config TEXT NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        status TEXT NOT NULL DEFAULT 'running',
        summary TEXT
    );
    CREATE TABLE IF NOT EXISTS steps (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        iter INTEGER NOT NULL,
        loss REAL NOT NULL,
        tokens INTEGER NOT NULL,
        seconds REAL NOT NULL,
        tokens_per_sec REAL NOT NULL,
        learning_rate REAL NOT NULL,
        peak_memory_bytes INTEGER NOT NULL,
        metrics TEXT NOT NULL,
        PRIMARY KEY (run_id, iter)
    );
    CREATE TABLE IF NOT EXISTS evals (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        iter INTEGER NOT NULL,
        split TEXT NOT NULL,
        loss REAL NOT NULL,
        seconds REAL NOT NULL,
        metrics TEXT NOT NULL
    );",
    // 2: provenance of every run, and named metrics with repeated samples.
    "ALTER TABLE runs ADD COLUMN label TEXT;
    ALTER TABLE runs ADD COLUMN host TEXT;
    ALTER TABLE runs ADD COLUMN git_commit TEXT;
    ALTER TABLE runs ADD COLUMN model_fingerprint TEXT;
    CREATE TABLE metrics (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        name TEXT NOT NULL,
        sample INTEGER NOT NULL,
        value REAL NOT NULL,
        unit TEXT NOT NULL DEFAULT '',
        higher_is_better INTEGER,
        PRIMARY KEY (run_id, name, sample)
    );
    CREATE INDEX runs_kind ON runs(kind, started_at);",
];

/// The schema version this build writes.
pub fn schema_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// The settings' eval database (`MLX_BUN_EVAL_DB`, else `evals.db` in the
/// XDG data folder).
pub fn default_path() -> PathBuf {
    crate::settings::get().eval_db.clone()
}

/// An open eval database.
pub struct EvalDb {
    conn: Connection,
    path: PathBuf,
}

/// One training step as stored.
#[derive(Clone, Debug)]
pub struct StepRow {
    /// The training iteration (1-based).
    pub iter: i64,
    /// The training loss of the step.
    pub loss: f64,
    /// Tokens in the step's batch.
    pub tokens: i64,
    /// Seconds the step took (0 where not measured).
    pub seconds: f64,
    /// Tokens per second over the step.
    pub tokens_per_sec: f64,
    /// The learning rate the step used.
    pub learning_rate: f64,
    /// Peak memory in bytes so far in the run.
    pub peak_memory_bytes: i64,
    /// Every reported field as JSON (method components included).
    pub metrics: Value,
}

/// Where a run happened: filled by [`RunMeta::detect`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunMeta {
    /// The machine's host name.
    pub host: Option<String>,
    /// The git commit the binary was built from, if built in a checkout.
    pub git_commit: Option<String>,
    /// The fingerprint of the model's files ([`model_fingerprint`]).
    pub model_fingerprint: Option<String>,
}

impl RunMeta {
    /// This machine's host name, the git commit of the checkout the binary
    /// was built in (if it was), and the fingerprint of `model_dir`.
    pub fn detect(model_dir: Option<&Path>) -> Self {
        Self {
            host: host_name(),
            git_commit: git_commit(),
            model_fingerprint: model_dir.and_then(|d| model_fingerprint(d).ok()),
        }
    }
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// `git rev-parse HEAD` in the folder of the running executable (a build
/// inside a checkout), else in the current folder.
fn git_commit() -> Option<String> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    let dirs = exe_dir.into_iter().chain(std::env::current_dir().ok());
    for dir in dirs {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(["rev-parse", "HEAD"])
            .stderr(std::process::Stdio::null())
            .output();
        if let Ok(out) = out {
            let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && s.len() == 40 {
                return Some(s);
            }
        }
    }
    None
}

/// FNV-1a 64: stable, dependency-free; identifies files, not a security hash.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= *b as u64;
        *hash = hash.wrapping_mul(0x100000001b3);
    }
}

/// A fingerprint of a model directory without reading its weights: the bytes
/// of `config.json` plus the name and size of every `*.safetensors` file.
/// Two directories with the same config and weight files get the same value.
pub fn model_fingerprint(dir: &Path) -> Result<String> {
    let config = dir.join("config.json");
    let text = std::fs::read(&config).with_context(|| format!("reading {}", config.display()))?;
    let mut hash = 0xcbf29ce484222325u64;
    fnv1a(&mut hash, &text);
    let mut weights = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            weights.push((name, entry.metadata()?.len()));
        }
    }
    weights.sort();
    for (name, size) in &weights {
        fnv1a(&mut hash, name.as_bytes());
        fnv1a(&mut hash, &size.to_le_bytes());
    }
    Ok(format!("{hash:016x}"))
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A run as listed.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    /// The run's id.
    pub id: i64,
    /// What was run: `bench`, `train`, `perplexity`, `evaluate`, ...
    pub kind: String,
    /// A label telling runs of one kind apart (a bench cell, a dataset).
    pub label: Option<String>,
    /// The model, as given.
    pub model: String,
    /// `running`, `done` or `failed`.
    pub status: String,
    /// Start time in seconds since the Unix epoch.
    pub started_at: f64,
    /// End time in seconds since the Unix epoch, once finished.
    pub finished_at: Option<f64>,
    /// The machine's host name.
    pub host: Option<String>,
    /// The git commit the binary was built from.
    pub git_commit: Option<String>,
    /// The fingerprint of the model's files.
    pub model_fingerprint: Option<String>,
    /// The run's flags, as JSON.
    pub flags: Value,
    /// The run's summary, as JSON (null until finished).
    pub summary: Value,
}

/// All samples of one named metric of a run.
#[derive(Clone, Debug, Serialize)]
pub struct MetricSeries {
    /// The metric's name.
    pub name: String,
    /// Its unit (such as `tok/s` or `bytes`).
    pub unit: String,
    /// `Some(true)` for speeds, `Some(false)` for latencies and losses,
    /// `None` when neither direction is a regression (counts, sizes).
    pub higher_is_better: Option<bool>,
    /// The recorded values, in order.
    pub samples: Vec<f64>,
}

impl MetricSeries {
    /// The mean of the samples (0 when there are none).
    pub fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }

    /// Sample standard deviation; 0 with fewer than two samples.
    pub fn std_dev(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.samples.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

/// One metric to record.
#[derive(Clone, Debug)]
pub struct Metric<'a> {
    /// The metric's name.
    pub name: &'a str,
    /// The measured value.
    pub value: f64,
    /// Its unit.
    pub unit: &'a str,
    /// `Some(true)` if higher is better, `Some(false)` if lower is, `None` if neither.
    pub higher_is_better: Option<bool>,
}

fn json_or_null(s: Option<String>) -> Value {
    s.and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

const RUN_COLUMNS: &str = "id, kind, label, model, status, started_at, finished_at, host,
    git_commit, model_fingerprint, config, summary";

fn run_row(r: &rusqlite::Row) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        id: r.get(0)?,
        kind: r.get(1)?,
        label: r.get(2)?,
        model: r.get(3)?,
        status: r.get(4)?,
        started_at: r.get(5)?,
        finished_at: r.get(6)?,
        host: r.get(7)?,
        git_commit: r.get(8)?,
        model_fingerprint: r.get(9)?,
        flags: json_or_null(r.get(10)?),
        summary: json_or_null(r.get(11)?),
    })
}

/// Brings `conn` to the newest schema, one step per transaction. `BEGIN
/// IMMEDIATE` takes the write lock before the version is read, so two
/// processes opening an old file at once migrate it once.
fn migrate(conn: &mut Connection, path: &Path) -> Result<()> {
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > schema_version() {
            bail!(
                "{} has schema version {version}, newer than this mlx-bun understands ({}): \
                 upgrade mlx-bun or point MLX_BUN_EVAL_DB elsewhere",
                path.display(),
                schema_version()
            );
        }
        if version == schema_version() {
            return Ok(());
        }
        tx.execute_batch(MIGRATIONS[version as usize])
            .with_context(|| {
                format!(
                    "upgrading {} from schema {version} to {}",
                    path.display(),
                    version + 1
                )
            })?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
}

impl EvalDb {
    /// Opens (creating if needed) the database at `path`, upgrading its schema.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut conn = Connection::open(path)
            .with_context(|| format!("opening eval database {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        // WAL lets readers run beside a writer and writers queue on the lock.
        // Switching to it needs the lock, and SQLite answers "busy" at once
        // (without the busy handler) while another connection switches.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mode: String = loop {
            match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)) {
                Ok(mode) => break mode,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if matches!(
                        e.code,
                        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                    ) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("{} is not an SQLite database", path.display()))
                }
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!("{}: journal mode {mode}, not WAL", path.display());
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        migrate(&mut conn, path).with_context(|| format!("eval database {}", path.display()))?;
        Ok(Self {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records a new run of `kind` with its flags, detecting host, git
    /// commit and (when `model` is a directory) the model fingerprint.
    pub fn start_run(&self, kind: &str, model: &str, config: &Value) -> Result<i64> {
        let dir = Path::new(model);
        let meta = RunMeta::detect(dir.is_dir().then_some(dir));
        self.start_run_with(kind, None, model, config, &meta)
    }

    /// Records a new run with an explicit label (a bench cell, a dataset) and provenance.
    pub fn start_run_with(
        &self,
        kind: &str,
        label: Option<&str>,
        model: &str,
        flags: &Value,
        meta: &RunMeta,
    ) -> Result<i64> {
        self.conn
            .execute(
                "INSERT INTO runs (kind, label, model, config, started_at, host, git_commit,
                 model_fingerprint) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    kind,
                    label,
                    model,
                    flags.to_string(),
                    now(),
                    meta.host,
                    meta.git_commit,
                    meta.model_fingerprint
                ],
            )
            .context("recording the run")?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Appends samples to named metrics of `run` (each call adds one sample per metric).
    pub fn record_metrics(&self, run: i64, metrics: &[Metric]) -> Result<()> {
        for m in metrics {
            if !m.value.is_finite() {
                continue;
            }
            self.conn
                .execute(
                    "INSERT INTO metrics (run_id, name, sample, value, unit, higher_is_better)
                     VALUES (?1, ?2,
                        (SELECT COUNT(*) FROM metrics WHERE run_id = ?1 AND name = ?2),
                        ?3, ?4, ?5)",
                    params![run, m.name, m.value, m.unit, m.higher_is_better],
                )
                .with_context(|| format!("recording metric {}", m.name))?;
        }
        Ok(())
    }

    /// Records one training step of `run` (replacing an earlier row for the same iteration).
    pub fn record_step(&self, run: i64, step: &StepRow) -> Result<()> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO steps (run_id, iter, loss, tokens, seconds, tokens_per_sec,
                 learning_rate, peak_memory_bytes, metrics)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    run,
                    step.iter,
                    step.loss,
                    step.tokens,
                    step.seconds,
                    step.tokens_per_sec,
                    step.learning_rate,
                    step.peak_memory_bytes,
                    step.metrics.to_string()
                ],
            )
            .context("recording a step")?;
        Ok(())
    }

    /// Records a validation or test loss of `run` at `iter` on `split`, with its extra metrics.
    pub fn record_eval(
        &self,
        run: i64,
        iter: i64,
        split: &str,
        loss: f64,
        seconds: f64,
        metrics: &Value,
    ) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO evals (run_id, iter, split, loss, seconds, metrics)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![run, iter, split, loss, seconds, metrics.to_string()],
            )
            .context("recording an evaluation")?;
        Ok(())
    }

    /// Marks the run finished (`status` "done" or "failed") with a summary.
    pub fn finish_run(&self, run: i64, status: &str, summary: &Value) -> Result<()> {
        self.conn
            .execute(
                "UPDATE runs SET finished_at = ?2, status = ?3, summary = ?4 WHERE id = ?1",
                params![run, now(), status, summary.to_string()],
            )
            .context("closing the run")?;
        Ok(())
    }

    /// Sets the start and finish times of `run` (Unix seconds), for runs
    /// recorded after they happened.
    pub fn set_times(&self, run: i64, started_at: f64, finished_at: f64) -> Result<()> {
        self.conn
            .execute(
                "UPDATE runs SET started_at = ?2, finished_at = ?3 WHERE id = ?1",
                params![run, started_at, finished_at],
            )
            .context("setting the run's times")?;
        Ok(())
    }

    /// The steps of `run`, in order.
    pub fn steps(&self, run: i64) -> Result<Vec<StepRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT iter, loss, tokens, seconds, tokens_per_sec, learning_rate, peak_memory_bytes, metrics
             FROM steps WHERE run_id = ?1 ORDER BY iter",
        )?;
        let rows = stmt.query_map(params![run], |r| {
            let metrics: String = r.get(7)?;
            Ok(StepRow {
                iter: r.get(0)?,
                loss: r.get(1)?,
                tokens: r.get(2)?,
                seconds: r.get(3)?,
                tokens_per_sec: r.get(4)?,
                learning_rate: r.get(5)?,
                peak_memory_bytes: r.get(6)?,
                metrics: serde_json::from_str(&metrics).unwrap_or(Value::Null),
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// `(kind, status, config)` of `run`, if it exists.
    pub fn run(&self, run: i64) -> Result<Option<(String, String, Value)>> {
        Ok(self.get(run)?.map(|r| (r.kind, r.status, r.flags)))
    }

    /// The full row of `run`, if it exists.
    pub fn get(&self, run: i64) -> Result<Option<RunRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                params![run],
                run_row,
            )
            .optional()?)
    }

    /// The newest runs first, optionally of one kind.
    pub fn list(&self, kind: Option<&str>, limit: usize) -> Result<Vec<RunRow>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE ?1 IS NULL OR kind = ?1
             ORDER BY id DESC LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![kind, limit as i64], run_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The id of the most recent run.
    pub fn last_run(&self) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row("SELECT MAX(id) FROM runs", [], |r| r.get(0))
            .optional()?
            .flatten())
    }

    /// Every metric of `run` with its samples: the recorded metrics, plus for
    /// training runs the per-step speed, loss and memory and the last
    /// validation loss, so training runs compare like any other.
    pub fn metrics(&self, run: i64) -> Result<Vec<MetricSeries>> {
        let mut stmt = self.conn.prepare(
            "SELECT name, unit, higher_is_better, value FROM metrics
             WHERE run_id = ?1 ORDER BY name, sample",
        )?;
        let mut out: Vec<MetricSeries> = Vec::new();
        let rows = stmt.query_map(params![run], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<bool>>(2)?,
                r.get::<_, f64>(3)?,
            ))
        })?;
        for row in rows {
            let (name, unit, hib, value) = row?;
            match out.last_mut() {
                Some(last) if last.name == name => last.samples.push(value),
                _ => out.push(MetricSeries {
                    name,
                    unit,
                    higher_is_better: hib,
                    samples: vec![value],
                }),
            }
        }
        let steps = self.steps(run)?;
        if !steps.is_empty() {
            // The first step pays for compilation and warm-up: keep it out of speed.
            let warm = if steps.len() > 1 {
                &steps[1..]
            } else {
                &steps[..]
            };
            let series = |name: &str, unit: &str, hib, samples: Vec<f64>| MetricSeries {
                name: name.into(),
                unit: unit.into(),
                higher_is_better: hib,
                samples,
            };
            out.push(series(
                "train.tokens_per_sec",
                "tok/s",
                Some(true),
                warm.iter().map(|s| s.tokens_per_sec).collect(),
            ));
            out.push(series(
                "train.final_loss",
                "",
                Some(false),
                vec![steps.last().map(|s| s.loss).unwrap_or(f64::NAN)],
            ));
            out.push(series(
                "train.peak_memory_bytes",
                "bytes",
                Some(false),
                vec![steps.iter().map(|s| s.peak_memory_bytes).max().unwrap_or(0) as f64],
            ));
        }
        let last_valid: Option<f64> = self
            .conn
            .query_row(
                "SELECT loss FROM evals WHERE run_id = ?1 AND split = 'valid'
                 ORDER BY iter DESC LIMIT 1",
                params![run],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(loss) = last_valid {
            out.push(MetricSeries {
                name: "train.valid_loss".into(),
                unit: String::new(),
                higher_is_better: Some(false),
                samples: vec![loss],
            });
        }
        Ok(out)
    }
}

/// How [`compare`] judges a change.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CompareRule {
    /// With repeated samples on both sides: flag a change larger than `k`
    /// pooled standard deviations ...
    pub k: f64,
    /// ... and larger than this relative change (so zero-noise metrics
    /// don't flag rounding). Without repeated samples this alone decides.
    pub threshold: f64,
}

impl Default for CompareRule {
    fn default() -> Self {
        Self {
            k: 3.0,
            threshold: 0.05,
        }
    }
}

/// How a metric changed from the baseline run to the other.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within noise or threshold.
    Same,
    /// Improved beyond noise and threshold.
    Better,
    /// Got worse beyond noise and threshold.
    Regression,
    /// Changed beyond the rule, but the metric has no better direction.
    Changed,
    /// Present in one run only.
    Missing,
}

/// One metric of two runs side by side.
#[derive(Clone, Debug, Serialize)]
pub struct MetricComparison {
    /// The metric's name.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Mean in the baseline run `a`, if it has the metric.
    pub a_mean: Option<f64>,
    /// Mean in run `b`, if it has the metric.
    pub b_mean: Option<f64>,
    /// Sample standard deviation in `a`.
    pub a_std: f64,
    /// Sample standard deviation in `b`.
    pub b_std: f64,
    /// Samples in `a`.
    pub a_n: usize,
    /// Samples in `b`.
    pub b_n: usize,
    /// (b - a) / |a|.
    pub relative_change: Option<f64>,
    /// |b - a| in pooled standard deviations, when both sides have ≥ 2 samples.
    pub sigmas: Option<f64>,
    /// The verdict under the comparison rule.
    pub verdict: Verdict,
}

/// Compares every metric of run `a` (the baseline) with run `b`; see
/// [`CompareRule`] for when a change counts.
pub fn compare(a: &[MetricSeries], b: &[MetricSeries], rule: CompareRule) -> Vec<MetricComparison> {
    let mut names: Vec<&str> = a.iter().chain(b).map(|m| m.name.as_str()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let ma = a.iter().find(|m| m.name == name);
            let mb = b.iter().find(|m| m.name == name);
            let base = ma.or(mb).expect("name from one side");
            let mut cmp = MetricComparison {
                name: name.to_string(),
                unit: base.unit.clone(),
                a_mean: ma.map(MetricSeries::mean),
                b_mean: mb.map(MetricSeries::mean),
                a_std: ma.map(MetricSeries::std_dev).unwrap_or(0.0),
                b_std: mb.map(MetricSeries::std_dev).unwrap_or(0.0),
                a_n: ma.map(|m| m.samples.len()).unwrap_or(0),
                b_n: mb.map(|m| m.samples.len()).unwrap_or(0),
                relative_change: None,
                sigmas: None,
                verdict: Verdict::Missing,
            };
            let (Some(xa), Some(xb)) = (cmp.a_mean, cmp.b_mean) else {
                return cmp;
            };
            let delta = xb - xa;
            let rel = if xa != 0.0 {
                delta / xa.abs()
            } else if delta == 0.0 {
                0.0
            } else {
                f64::INFINITY.copysign(delta)
            };
            cmp.relative_change = Some(rel);
            let mut significant = rel.abs() > rule.threshold;
            if cmp.a_n >= 2 && cmp.b_n >= 2 {
                let pooled = ((cmp.a_std.powi(2) + cmp.b_std.powi(2)) / 2.0).sqrt();
                let sigmas = if pooled > 0.0 {
                    delta.abs() / pooled
                } else if delta == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                };
                cmp.sigmas = Some(sigmas);
                significant &= sigmas > rule.k;
            }
            cmp.verdict = match (significant, base.higher_is_better) {
                (false, _) => Verdict::Same,
                (true, None) => Verdict::Changed,
                (true, Some(hib)) if (delta > 0.0) == hib => Verdict::Better,
                (true, Some(_)) => Verdict::Regression,
            };
            cmp
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, hib: Option<bool>, samples: &[f64]) -> MetricSeries {
        MetricSeries {
            name: name.into(),
            unit: String::new(),
            higher_is_better: hib,
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn compare_uses_noise_when_samples_repeat() {
        let rule = CompareRule::default();
        // 10% slower, but the runs swing by ±10%: noise, not a regression.
        let a = [series("tps", Some(true), &[100.0, 90.0, 110.0])];
        let b = [series("tps", Some(true), &[90.0, 80.0, 100.0])];
        assert_eq!(compare(&a, &b, rule)[0].verdict, Verdict::Same);
        // 10% slower with ±1% noise: a regression.
        let a = [series("tps", Some(true), &[100.0, 99.0, 101.0])];
        let b = [series("tps", Some(true), &[90.0, 89.0, 91.0])];
        let c = &compare(&a, &b, rule)[0];
        assert_eq!(c.verdict, Verdict::Regression);
        assert!(c.sigmas.unwrap() > 3.0);
        // Latency going down is better.
        let a = [series("ttft", Some(false), &[1.0])];
        let b = [series("ttft", Some(false), &[0.5])];
        assert_eq!(compare(&a, &b, rule)[0].verdict, Verdict::Better);
        // Single samples: the relative threshold decides.
        let b = [series("ttft", Some(false), &[1.04])];
        assert_eq!(compare(&a, &b, rule)[0].verdict, Verdict::Same);
        let b = [series("ttft", Some(false), &[1.2])];
        assert_eq!(compare(&a, &b, rule)[0].verdict, Verdict::Regression);
        // No direction: changed; one side only: missing.
        let a = [series("bytes", None, &[1.0]), series("x", None, &[1.0])];
        let b = [series("bytes", None, &[2.0])];
        let cs = compare(&a, &b, rule);
        assert_eq!(cs[0].verdict, Verdict::Changed);
        assert_eq!(cs[1].verdict, Verdict::Missing);
    }
}
