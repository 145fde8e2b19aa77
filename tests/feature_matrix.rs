//! `mlx-bun bench feature-matrix` end to end: a real `mlx-bun serve` per
//! cell over HTTP, results in a real eval database, a markdown report and a
//! PNG; and a cell whose server cannot start reported as failed with the
//! server's stderr.

mod common;

use std::path::Path;

use common::{bin, model_dir};
use mlx_bun::evaldb::EvalDb;

fn report(out: &Path) -> String {
    let md = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "md"))
        .expect("a markdown report");
    std::fs::read_to_string(md).unwrap()
}

#[test]
fn grammar_cell_runs_against_the_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("evals.db");
    let out = bin()
        .env("MLX_BUN_EVAL_DB", &db)
        .args([
            "bench",
            "feature-matrix",
            "--smoke",
            "--cells",
            "serial+grammar",
            "--json",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cell = &results[0];
    assert_eq!(cell["cell"], "serial+grammar");
    let phases = cell["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    for p in phases {
        assert!(p["aggregate_tok_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["ttft_p50_s"].as_f64().unwrap() > 0.0);
        assert!(p["peak_rss_bytes"].as_u64().unwrap() > 50 << 20);
        // The constrained extraction completed and matched the schema.
        assert_eq!(p["schema_valid"], 1, "{p}");
        assert_eq!(p["schema_invalid"], 0);
    }
    // The warm phase re-sends the same prompts: the prompt cache hits.
    assert!(phases[1]["cache_hit_rate"].as_f64().unwrap() > 0.5);

    // Rows in the eval database, tagged with host, commit and the model.
    let db = EvalDb::open(&db).unwrap();
    let runs = db.list(Some("bench"), 10).unwrap();
    assert_eq!(runs.len(), 2);
    let cold = runs
        .iter()
        .find(|r| r.label.as_deref() == Some("feature-matrix/serial+grammar/cold"));
    let cold = cold.expect("the cold run");
    assert_eq!(cold.status, "done");
    assert!(cold.host.is_some());
    assert_eq!(
        cold.model_fingerprint,
        Some(mlx_bun::evaldb::model_fingerprint(&model_dir()).unwrap())
    );
    assert_eq!(cold.flags["smoke"], true);
    let metrics = db.metrics(cold.id).unwrap();
    for name in [
        "aggregate_tok_s",
        "ttft_p50_s",
        "cache_hit_rate",
        "peak_rss_bytes",
    ] {
        assert!(metrics.iter().any(|m| m.name == name), "no {name}");
    }
    assert!(cold.finished_at.unwrap() > cold.started_at);

    // The report and a real PNG.
    let md = report(dir.path());
    assert!(md.contains("| serial+grammar | cold |"), "{md}");
    let png = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "png"))
        .expect("a plot");
    assert_eq!(&std::fs::read(png).unwrap()[1..4], b"PNG");
}

#[test]
fn a_server_that_cannot_start_is_a_failed_cell_with_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("evals.db");
    // A serve flag the server does not have makes it exit at once.
    let out = bin()
        .env("MLX_BUN_EVAL_DB", &db)
        .env("MLX_BUN_FEATURE_MATRIX_SERVE_ARGS", "--no-such-flag")
        .args([
            "bench",
            "feature-matrix",
            "--smoke",
            "--cells",
            "serial",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1 cell(s) failed: serial"), "{stderr}");
    let md = report(dir.path());
    assert!(md.contains("## Failed cells"), "{md}");
    assert!(md.contains("--no-such-flag"), "the server's stderr: {md}");
    let db = EvalDb::open(&db).unwrap();
    let runs = db.list(None, 10).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, "failed");
    assert!(runs[0].summary["error"]
        .as_str()
        .unwrap()
        .contains("did not start"));
}
