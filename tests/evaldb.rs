//! The eval database on real SQLite files: upgrading files written by the
//! first schema, concurrent writers in separate processes, and the
//! `mlx-bun evals` commands over a database the test fills.

mod common;

use std::path::Path;
use std::process::Command;

use common::bin;
use mlx_bun::evaldb::{schema_version, EvalDb, Metric, RunMeta, StepRow};
use rusqlite::Connection;
use serde_json::{json, Value};

/// The schema the first released version created (user_version never set).
const V1_SCHEMA: &str = "
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
    model TEXT NOT NULL, config TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL,
    status TEXT NOT NULL DEFAULT 'running', summary TEXT);
CREATE TABLE steps (run_id INTEGER NOT NULL REFERENCES runs(id), iter INTEGER NOT NULL,
    loss REAL NOT NULL, tokens INTEGER NOT NULL, seconds REAL NOT NULL,
    tokens_per_sec REAL NOT NULL, learning_rate REAL NOT NULL,
    peak_memory_bytes INTEGER NOT NULL, metrics TEXT NOT NULL, PRIMARY KEY (run_id, iter));
CREATE TABLE evals (run_id INTEGER NOT NULL REFERENCES runs(id), iter INTEGER NOT NULL,
    split TEXT NOT NULL, loss REAL NOT NULL, seconds REAL NOT NULL, metrics TEXT NOT NULL);
INSERT INTO runs (kind, model, config, started_at, finished_at, status, summary)
    VALUES ('sft', '/models/m', '{\"iters\": 3}', 1700000000.0, 1700000060.0, 'done', '{}');
INSERT INTO steps VALUES (1, 1, 2.5, 100, 1.0, 100.0, 0.0001, 1000, '{\"x\": 1}');
INSERT INTO steps VALUES (1, 2, 2.0, 100, 1.0, 110.0, 0.0001, 1200, '{}');
INSERT INTO steps VALUES (1, 3, 1.5, 100, 1.0, 105.0, 0.0001, 1100, '{}');
INSERT INTO evals VALUES (1, 3, 'valid', 1.75, 0.5, '{}');
";

fn user_version(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn upgrades_a_first_schema_file_keeping_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch(V1_SCHEMA)
        .unwrap();
    assert_eq!(user_version(&path), 0);

    let db = EvalDb::open(&path).unwrap();
    assert_eq!(user_version(&path), schema_version());
    assert!(schema_version() >= 2);
    let run = db.get(1).unwrap().expect("the old run survives");
    assert_eq!((run.kind.as_str(), run.status.as_str()), ("sft", "done"));
    assert_eq!(run.flags["iters"], 3);
    assert_eq!(run.host, None);
    let steps = db.steps(1).unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[0].metrics["x"], 1);
    // Old training rows feed the comparable metrics.
    let metrics = db.metrics(1).unwrap();
    let tps = metrics
        .iter()
        .find(|m| m.name == "train.tokens_per_sec")
        .unwrap();
    assert_eq!(tps.samples, vec![110.0, 105.0], "warm-up step left out");
    let valid = metrics
        .iter()
        .find(|m| m.name == "train.valid_loss")
        .unwrap();
    assert_eq!(valid.samples, vec![1.75]);

    // New rows go in beside the old ones, with the new columns.
    let meta = RunMeta {
        host: Some("h".into()),
        git_commit: Some("c".into()),
        model_fingerprint: Some("f".into()),
    };
    let id = db
        .start_run_with("bench", Some("cell"), "m", &json!({"a": 1}), &meta)
        .unwrap();
    assert_eq!(id, 2);
    drop(db);
    // Reopening an up-to-date file changes nothing.
    let db = EvalDb::open(&path).unwrap();
    assert_eq!(db.list(None, 10).unwrap().len(), 2);
    assert_eq!(
        db.get(2).unwrap().unwrap().model_fingerprint.as_deref(),
        Some("f")
    );
}

#[test]
fn refuses_newer_schemas_and_non_databases() {
    let dir = tempfile::tempdir().unwrap();
    let newer = dir.path().join("newer.db");
    Connection::open(&newer)
        .unwrap()
        .execute_batch("PRAGMA user_version = 999;")
        .unwrap();
    let err = format!("{:#}", EvalDb::open(&newer).err().unwrap());
    assert!(err.contains("schema version 999"), "{err}");
    assert!(err.contains("newer.db"), "{err}");

    let text = dir.path().join("notes.db");
    std::fs::write(
        &text,
        "this is not sqlite, just a long enough text file ......",
    )
    .unwrap();
    let err = format!("{:#}", EvalDb::open(&text).err().unwrap());
    assert!(err.contains("notes.db"), "{err}");
}

const WRITERS: usize = 4;
const RUNS_PER_WRITER: usize = 25;

/// Run as a child process by `concurrent_processes_never_corrupt` (does
/// nothing in a normal test run): writes runs with metrics and steps.
#[test]
fn writer_child() {
    let Some(path) = std::env::var_os("EVALDB_TEST_WRITER_DB") else {
        return;
    };
    let who: usize = std::env::var("EVALDB_TEST_WRITER_ID")
        .unwrap()
        .parse()
        .unwrap();
    write_runs(Path::new(&path), who);
}

fn write_runs(path: &Path, who: usize) {
    let db = EvalDb::open(path).unwrap();
    for i in 0..RUNS_PER_WRITER {
        let run = db
            .start_run_with(
                "bench",
                Some(&format!("writer{who}")),
                "m",
                &json!({"i": i}),
                &RunMeta::default(),
            )
            .unwrap();
        for s in 0..3 {
            db.record_metrics(
                run,
                &[Metric {
                    name: "tok_s",
                    value: (who * 1000 + i * 10 + s) as f64,
                    unit: "tok/s",
                    higher_is_better: Some(true),
                }],
            )
            .unwrap();
        }
        db.record_step(
            run,
            &StepRow {
                iter: 1,
                loss: 1.0,
                tokens: 1,
                seconds: 0.1,
                tokens_per_sec: 10.0,
                learning_rate: 0.1,
                peak_memory_bytes: 1,
                metrics: json!({}),
            },
        )
        .unwrap();
        db.finish_run(run, "done", &json!({})).unwrap();
    }
}

fn check_all_written(path: &Path, writers: usize) {
    let db = EvalDb::open(path).unwrap();
    let runs = db.list(None, 10_000).unwrap();
    assert_eq!(runs.len(), writers * RUNS_PER_WRITER);
    assert!(runs.iter().all(|r| r.status == "done"));
    for r in &runs {
        let m = db.metrics(r.id).unwrap();
        let tok = m.iter().find(|m| m.name == "tok_s").unwrap();
        assert_eq!(tok.samples.len(), 3, "run {}", r.id);
    }
    let ok: String = Connection::open(path)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

#[test]
fn concurrent_processes_never_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    // A file of the first schema: the children race to migrate it too.
    let path = dir.path().join("shared.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch(V1_SCHEMA)
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut running = Vec::new();
    for who in 0..WRITERS {
        running.push(
            Command::new(&exe)
                .args(["--exact", "writer_child", "--test-threads", "1"])
                .env("EVALDB_TEST_WRITER_DB", &path)
                .env("EVALDB_TEST_WRITER_ID", who.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    for child in running {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "writer failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The old run plus every writer's runs, each complete.
    let db = EvalDb::open(&path).unwrap();
    let runs = db.list(Some("bench"), 10_000).unwrap();
    assert_eq!(runs.len(), WRITERS * RUNS_PER_WRITER);
    assert!(db.get(1).unwrap().is_some());
    assert_eq!(user_version(&path), schema_version());
    for r in &runs {
        assert_eq!(r.status, "done");
        let m = db.metrics(r.id).unwrap();
        assert_eq!(
            m.iter().find(|m| m.name == "tok_s").unwrap().samples.len(),
            3
        );
    }
    let ok: String = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

#[test]
fn concurrent_threads_never_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("threads.db");
    std::thread::scope(|s| {
        for who in 0..WRITERS {
            let path = &path;
            s.spawn(move || write_runs(path, who));
        }
    });
    check_all_written(&path, WRITERS);
}

fn evals(db: &Path, args: &[&str]) -> std::process::Output {
    bin()
        .env("MLX_BUN_EVAL_DB", db)
        .arg("evals")
        .args(args)
        .output()
        .unwrap()
}

fn evals_json(db: &Path, args: &[&str]) -> Value {
    let out = evals(db, args);
    assert!(
        out.status.success(),
        "evals {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn evals_commands_list_show_and_flag_regressions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cli.db");
    let db = EvalDb::open(&path).unwrap();
    let meta = RunMeta::detect(None);
    let record = |label: &str, tps: &[f64], ttft: f64| {
        let id = db
            .start_run_with("bench", Some(label), "m", &json!({"cell": label}), &meta)
            .unwrap();
        for &t in tps {
            db.record_metrics(
                id,
                &[Metric {
                    name: "decode_tok_s",
                    value: t,
                    unit: "tok/s",
                    higher_is_better: Some(true),
                }],
            )
            .unwrap();
        }
        db.record_metrics(
            id,
            &[Metric {
                name: "ttft_p50_s",
                value: ttft,
                unit: "s",
                higher_is_better: Some(false),
            }],
        )
        .unwrap();
        db.finish_run(id, "done", &json!({})).unwrap();
        id
    };
    let base = record("serial", &[10.0, 10.1, 9.9], 0.50);
    let noisy = record("serial", &[9.0, 11.5, 8.0], 0.51);
    let slow = record("serial", &[8.0, 8.1, 7.9], 0.40);
    drop(db);

    let listed = evals_json(&path, &["list", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 3);
    assert_eq!(listed[0]["id"], slow);
    let table = evals(&path, &["list"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("serial"));

    let shown = evals_json(&path, &["show", &base.to_string(), "--json"]);
    assert_eq!(shown["run"]["label"], "serial");
    assert_eq!(shown["metrics"][0]["samples"].as_array().unwrap().len(), 3);

    // Within the noise of repeated samples: no regression.
    let c = evals_json(
        &path,
        &["compare", &base.to_string(), &noisy.to_string(), "--json"],
    );
    assert_eq!(c["regressions"], 0, "{c:#}");
    // 20% slower decode at low noise: a regression; the faster TTFT is better.
    let c = evals_json(
        &path,
        &["compare", &base.to_string(), &slow.to_string(), "--json"],
    );
    assert_eq!(c["regressions"], 1, "{c:#}");
    let verdict = |name: &str| {
        c["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap()["verdict"]
            .clone()
    };
    assert_eq!(verdict("decode_tok_s"), "regression");
    assert_eq!(verdict("ttft_p50_s"), "better");
    // --check turns a regression into exit status 1 with a message.
    let out = evals(
        &path,
        &["compare", &base.to_string(), &slow.to_string(), "--check"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("REGRESSION"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("regressed"));
    // A missing run is a clear error.
    let out = evals(&path, &["show", "999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run 999"));
}

#[test]
fn runs_record_their_provenance() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    std::fs::write(model.join("model.safetensors"), vec![0u8; 100]).unwrap();
    let db = EvalDb::open(&dir.path().join("p.db")).unwrap();
    // `start_run` (what `train` calls) detects host and fingerprint itself.
    let id = db
        .start_run("sft", model.to_str().unwrap(), &json!({}))
        .unwrap();
    let run = db.get(id).unwrap().unwrap();
    assert!(run.host.as_deref().is_some_and(|h| !h.is_empty()));
    let fp = mlx_bun::evaldb::model_fingerprint(&model).unwrap();
    assert_eq!(run.model_fingerprint.as_deref(), Some(fp.as_str()));
    // The fingerprint follows the weight files and the config, not the folder.
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model.join(f), copy.join(f)).unwrap();
    }
    assert_eq!(mlx_bun::evaldb::model_fingerprint(&copy).unwrap(), fp);
    std::fs::write(copy.join("model.safetensors"), vec![0u8; 101]).unwrap();
    assert_ne!(mlx_bun::evaldb::model_fingerprint(&copy).unwrap(), fp);
    std::fs::write(copy.join("model.safetensors"), vec![0u8; 100]).unwrap();
    std::fs::write(copy.join("config.json"), r#"{"model_type": "qwen2"}"#).unwrap();
    assert_ne!(mlx_bun::evaldb::model_fingerprint(&copy).unwrap(), fp);
    // A missing config is a clear error.
    let err = mlx_bun::evaldb::model_fingerprint(dir.path()).unwrap_err();
    assert!(format!("{err:#}").contains("config.json"));
}

/// `evals import` keeps every sample and the logs; `evals report` renders
/// one table per scenario with medians, spread and mlx-bun's ratio to each
/// peer, from the database alone.
#[test]
fn imported_peer_samples_report_medians_spread_and_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("peers.db");
    let rows = dir.path().join("metrics.jsonl");
    let mut text = String::new();
    for (program, speeds, ttfts) in [
        ("mlx-bun", [60.0, 70.0, 65.0], [0.10, 0.12, 0.11]),
        ("llama.cpp", [130.0, 140.0, 120.0], [0.05, 0.06, 0.07]),
    ] {
        for (speed, ttft) in speeds.iter().zip(ttfts) {
            text += &format!(
                "{{\"name\":\"generate/generation_tps/{program}\",\"value\":{speed},\"unit\":\"tok/s\",\"higher_is_better\":true}}\n"
            );
            text += &format!(
                "{{\"name\":\"serve-c1/ttft_p50/{program}\",\"value\":{ttft},\"unit\":\"s\",\"higher_is_better\":false}}\n"
            );
        }
    }
    std::fs::write(&rows, text).unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(logs.join("generate-llama.cpp-r0.log"), "pp128 | tg128\n").unwrap();
    let note = dir.path().join("provenance.txt");
    std::fs::write(&note, "command: scripts/bench-peers.sh --threads 2\n").unwrap();
    let out = evals(
        &db,
        &[
            "import",
            rows.to_str().unwrap(),
            "--kind",
            "peers",
            "--label",
            "cpu",
            "--model",
            "smol",
            "--flags",
            "{\"threads\":2}",
            "--logs",
            logs.to_str().unwrap(),
            "--note",
            note.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let shown = evals_json(&db, &["show", &id, "--json"]);
    assert_eq!(shown["run"]["kind"], "peers");
    assert_eq!(shown["run"]["flags"]["threads"], 2);
    assert_eq!(
        shown["run"]["summary"]["logs"]["generate-llama.cpp-r0.log"],
        "pp128 | tg128\n"
    );
    let generation = shown["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "generate/generation_tps/llama.cpp")
        .unwrap();
    assert_eq!(generation["samples"].as_array().unwrap().len(), 3);

    let out = evals(&db, &["report", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("command: scripts/bench-peers.sh --threads 2"),
        "{report}"
    );
    // Medians 65 and 130: ours at 0.50x; TTFT medians 0.11 and 0.06: 0.55x.
    assert!(
        report.contains("| mlx-bun | 65.00 (60.00–70.00) |"),
        "{report}"
    );
    assert!(
        report.contains("| llama.cpp | 130.0 (120.0–140.0) · **0.50x** |"),
        "{report}"
    );
    assert!(
        report.contains("0.060 (0.050–0.070) · **0.55x**"),
        "{report}"
    );
    assert!(
        report.find("**generate**").unwrap() < report.find("**serve-c1**").unwrap(),
        "{report}"
    );

    std::fs::write(&rows, "{\"name\":\"x\",\"value\":\"fast\"}\n").unwrap();
    let out = evals(
        &db,
        &[
            "import",
            rows.to_str().unwrap(),
            "--kind",
            "peers",
            "--model",
            "m",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("metrics.jsonl:1"), "{err}");
}
