//! The eval database: a SQLite file recording every training run (its
//! options as JSON), each step's losses and timings, and validation results.
//! Default location `<cache>/eval.db`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
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
);
";

pub fn default_path() -> PathBuf {
    crate::hub::cache_dir().join("eval.db")
}

pub struct EvalDb {
    conn: Connection,
    path: PathBuf,
}

/// One step as stored.
#[derive(Clone, Debug)]
pub struct StepRow {
    pub iter: i64,
    pub loss: f64,
    pub tokens: i64,
    pub seconds: f64,
    pub tokens_per_sec: f64,
    pub learning_rate: f64,
    pub peak_memory_bytes: i64,
    /// Every reported field as JSON (method components included).
    pub metrics: serde_json::Value,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl EvalDb {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let conn = Connection::open(path)
            .with_context(|| format!("opening eval database {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.execute_batch(SCHEMA)
            .with_context(|| format!("preparing eval database {}", path.display()))?;
        Ok(Self {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records a new run; returns its id.
    pub fn start_run(&self, kind: &str, model: &str, config: &serde_json::Value) -> Result<i64> {
        self.conn
            .execute(
                "INSERT INTO runs (kind, model, config, started_at) VALUES (?1, ?2, ?3, ?4)",
                params![kind, model, config.to_string(), now()],
            )
            .context("recording the run")?;
        Ok(self.conn.last_insert_rowid())
    }

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

    pub fn record_eval(
        &self,
        run: i64,
        iter: i64,
        split: &str,
        loss: f64,
        seconds: f64,
        metrics: &serde_json::Value,
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
    pub fn finish_run(&self, run: i64, status: &str, summary: &serde_json::Value) -> Result<()> {
        self.conn
            .execute(
                "UPDATE runs SET finished_at = ?2, status = ?3, summary = ?4 WHERE id = ?1",
                params![run, now(), status, summary.to_string()],
            )
            .context("closing the run")?;
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
                metrics: serde_json::from_str(&metrics).unwrap_or(serde_json::Value::Null),
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// `(kind, status, config)` of `run`, if it exists.
    pub fn run(&self, run: i64) -> Result<Option<(String, String, serde_json::Value)>> {
        let row = self
            .conn
            .query_row(
                "SELECT kind, status, config FROM runs WHERE id = ?1",
                params![run],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                },
            )
            .optional()?;
        Ok(row.map(|(k, s, c)| (k, s, serde_json::from_str(&c).unwrap_or_default())))
    }

    /// The id of the most recent run.
    pub fn last_run(&self) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row("SELECT MAX(id) FROM runs", [], |r| r.get(0))
            .optional()?
            .flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_reads_back_a_run() {
        let dir = tempfile::tempdir().unwrap();
        let db = EvalDb::open(&dir.path().join("sub/eval.db")).unwrap();
        let run = db
            .start_run("orpo", "m", &serde_json::json!({"iters": 2}))
            .unwrap();
        for i in 1..=2 {
            db.record_step(
                run,
                &StepRow {
                    iter: i,
                    loss: 1.0 / i as f64,
                    tokens: 10,
                    seconds: 0.5,
                    tokens_per_sec: 20.0,
                    learning_rate: 1e-4,
                    peak_memory_bytes: 1 << 20,
                    metrics: serde_json::json!({"or": 0.7}),
                },
            )
            .unwrap();
        }
        db.record_eval(run, 0, "valid", 2.0, 0.1, &serde_json::json!({}))
            .unwrap();
        db.finish_run(run, "done", &serde_json::json!({"iters": 2}))
            .unwrap();
        let steps = db.steps(run).unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[1].loss, 0.5);
        assert_eq!(steps[0].metrics["or"], 0.7);
        let (kind, status, cfg) = db.run(run).unwrap().unwrap();
        assert_eq!((kind.as_str(), status.as_str()), ("orpo", "done"));
        assert_eq!(cfg["iters"], 2);
        assert_eq!(db.last_run().unwrap(), Some(run));
    }
}
