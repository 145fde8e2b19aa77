//! ORPO on the default model: the step-0 quantities against the independent
//! reference (`scripts/oracle/orpo_reference.py`), and a short run that
//! moves the model towards the chosen responses.

mod common;

use std::path::Path;
use std::process::Command;

use common::{bin, model_dir, oracle_python, repo_root, run_ok};
use mlx_bun::autodiff::forward::TrainForward;
use mlx_bun::evaldb::EvalDb;
use mlx_bun::model::Model;
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::config::SftScope;
use mlx_bun::train::data::{load_file, Examples, RowKind};
use mlx_bun::train::orpo::orpo_loss;
use serde_json::Value;

fn json_lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn reference(data_file: &Path) -> Option<Value> {
    let py = oracle_python()?;
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/orpo_reference.py"))
        .arg("--model")
        .arg(model_dir())
        .arg("--data-file")
        .arg(data_file)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("running the ORPO reference");
    assert!(
        out.status.success(),
        "orpo_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(json_lines(&out.stdout).pop().expect("reference output"))
}

fn close(ours: f64, theirs: &Value, what: &str) {
    let theirs = theirs
        .as_f64()
        .unwrap_or_else(|| panic!("reference lacks {what}"));
    // Same MLX kernels in float32 on both sides; the paths differ (shared
    // prompt + chunked head here, two full forwards there).
    let tol = 2e-5 * theirs.abs().max(1.0);
    assert!(
        (ours - theirs).abs() <= tol,
        "{what}: ours {ours} vs reference {theirs}"
    );
}

#[test]
fn step_zero_matches_the_reference_in_both_scopes() {
    let data_dir = repo_root().join("tests/data/orpo-gate");
    let data_file = data_dir.join("train.jsonl");
    let Some(reference) = reference(&data_file) else {
        return;
    };
    let batch = &reference["batches"][0];

    // The trainer's first step (full scope, the default), as reported.
    let adapters = tempfile::tempdir().unwrap();
    let out = run_ok(&[
        "train",
        "--method",
        "orpo",
        "--data",
        data_dir.to_str().unwrap(),
        "--iters",
        "1",
        "--batch-size",
        "2",
        "--num-layers",
        "1",
        "--adapter-path",
        adapters.path().to_str().unwrap(),
        "--json",
        "--no-db",
    ]);
    let lines = json_lines(&out.stdout);
    let step = lines
        .iter()
        .find(|l| l["event"] == "step")
        .expect("a step line");
    for key in [
        "loss",
        "nll",
        "or",
        "log_odds",
        "chosen_logp",
        "rejected_logp",
    ] {
        close(step[key].as_f64().unwrap(), &batch["full"][key], key);
    }
    assert_eq!(step["lambda"].as_f64(), Some(0.1));
    assert!(step["tokens_per_sec"].as_f64().unwrap() > 0.0);
    assert!(step["peak_memory_bytes"].as_u64().unwrap() > 0);

    // The response scope through the library (same loss code, no update).
    let dir = model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let Examples::Preference(pairs) = load_file(&data_file, &tok, RowKind::Preference).unwrap()
    else {
        panic!("preference rows expected");
    };
    for (ours, theirs) in pairs.iter().zip(reference["pairs"].as_array().unwrap()) {
        assert_eq!(
            ours.prompt.len() as u64,
            theirs["prompt_tokens"].as_u64().unwrap()
        );
        assert_eq!(
            ours.chosen.len() as u64,
            theirs["chosen_tokens"].as_u64().unwrap()
        );
        assert_eq!(
            ours.rejected.len() as u64,
            theirs["rejected_tokens"].as_u64().unwrap()
        );
    }
    let refs: Vec<_> = pairs.iter().collect();
    let fwd = TrainForward {
        decoder: &model.decoder,
        checkpoint_from: None,
    };
    let (terms, _) = orpo_loss(&fwd, &refs, 0.1, SftScope::Response, 512, false).unwrap();
    let r = &batch["response"];
    close(
        terms.loss.item_cast::<f32>() as f64,
        &r["loss"],
        "response loss",
    );
    close(
        terms.nll.item_cast::<f32>() as f64,
        &r["nll"],
        "response nll",
    );
    close(terms.or.item_cast::<f32>() as f64, &r["or"], "response or");
}

#[test]
fn a_short_orpo_run_prefers_the_chosen_style_on_held_out_pairs() {
    let data = repo_root().join("tests/data/orpo");
    let work = tempfile::tempdir().unwrap();
    let adapters = work.path().join("adapters");
    let db = work.path().join("eval.db");
    // valid.jsonl holds held-out pairs: evaluated before the first update and
    // before the last one.
    let out = run_ok(&[
        "train",
        "--method",
        "orpo",
        "--data",
        data.to_str().unwrap(),
        "--iters",
        "4",
        "--batch-size",
        "1",
        "--num-layers",
        "4",
        "--learning-rate",
        "1e-3",
        "--steps-per-eval",
        "100",
        "--val-batches",
        "2",
        "--adapter-path",
        adapters.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
        "--json",
    ]);
    let lines = json_lines(&out.stdout);
    let evals: Vec<&Value> = lines.iter().filter(|l| l["event"] == "eval").collect();
    assert_eq!(evals.len(), 2, "{lines:?}");
    let margin =
        |e: &Value| e["chosen_logp"].as_f64().unwrap() - e["rejected_logp"].as_f64().unwrap();
    let (before, after) = (margin(evals[0]), margin(evals[1]));
    eprintln!("held-out chosen - rejected mean log-prob: {before:.3} -> {after:.3}");
    assert!(after > before + 1.0, "margin {before} -> {after}");
    assert!(
        evals[1]["log_odds"].as_f64().unwrap() > evals[0]["log_odds"].as_f64().unwrap(),
        "log-odds did not rise"
    );

    // The run is in the eval database, one row per step with the ORPO terms.
    let db = EvalDb::open(&db).unwrap();
    let run = db.last_run().unwrap().expect("a recorded run");
    let (kind, status, config) = db.run(run).unwrap().unwrap();
    assert_eq!((kind.as_str(), status.as_str()), ("orpo", "done"));
    assert_eq!(config["iters"], 4);
    let steps = db.steps(run).unwrap();
    assert_eq!(steps.len(), 4);
    assert!(steps
        .iter()
        .all(|s| s.metrics["or"].is_number() && s.tokens > 0));

    // And generation with the adapter shows the preferred style.
    let gen = |adapter: bool| -> String {
        let mut cmd = bin();
        cmd.args([
            "generate",
            "--system",
            "Be brief.",
            "-p",
            "What color is grass?",
            "-n",
            "4",
        ]);
        if adapter {
            cmd.arg("--adapter-path").arg(&adapters);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let tuned = gen(true);
    let base = gen(false);
    eprintln!("base: {base:?}\ntuned: {tuned:?}");
    assert!(
        tuned.trim_start().starts_with("Ahoy"),
        "tuned output {tuned:?}"
    );
    assert!(!base.contains("Ahoy"), "base output {base:?}");
}
