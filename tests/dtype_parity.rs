//! bf16 and f16 models computed as mlx-lm computes them
//! (`--compute-dtype model`): greedy tokens from `generate` and from `serve`
//! (warmed up in full) equal mlx-lm's, and the log-probabilities `serve`
//! reports are within 1e-3 of mlx-lm's, on variants of the default model
//! that `mlx_lm.convert` makes as mlx-community publishes them. Goldens:
//! `scripts/oracle/make_dtype_goldens.py`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use common::server::Server;

/// bf16 log-probabilities are resolved to ~1e-2 near -2; both sides compute
/// them with the same ops, so the difference is far below that.
const LOGPROB_TOL: f32 = 1e-3;

#[derive(Deserialize)]
struct Goldens {
    variants: BTreeMap<String, Variant>,
}

#[derive(Deserialize)]
struct Variant {
    max_tokens: usize,
    model: Fingerprint,
    runs: Vec<Run>,
}

#[derive(Deserialize)]
struct Fingerprint {
    config_sha256: String,
    weights_sha256: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Run {
    prompt: String,
    tokens: Vec<u32>,
    top_logprobs: Vec<Vec<(u32, f32)>>,
}

fn goldens() -> Goldens {
    let text = std::fs::read_to_string(common::repo_root().join("goldens/dtypes.json"))
        .expect("reading goldens/dtypes.json");
    serde_json::from_str(&text).expect("parsing goldens/dtypes.json")
}

/// The first index where `ours` leaves `want`, if any.
fn divergence(ours: &[u32], want: &[u32]) -> Option<usize> {
    let same = ours.iter().zip(want).take_while(|(a, b)| a == b).count();
    (ours.len() != want.len() || same < want.len()).then_some(same)
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// The variant folders, made once by mlx-lm's own converter from the
/// float32 default model, each checked against the goldens' fingerprint.
fn variants(g: &Goldens) -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| make_variants(g)).clone()
}

fn make_variants(g: &Goldens) -> PathBuf {
    let models = mlx_bun::hub::cache_dir().join("test-models/dtypes");
    let out = Command::new(common::oracle_python().expect("the oracle is required"))
        .arg(common::repo_root().join("scripts/oracle/make_dtype_goldens.py"))
        .arg("--src")
        .arg(common::float32_model())
        .arg("--models")
        .arg(&models)
        .args(["--out", "/dev/null", "--only"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make_dtype_goldens.py --only: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, v) in &g.variants {
        let dir = models.join(name);
        let regenerate = format!(
            "the goldens were made from another {name} conversion than {}; regenerate them \
             with scripts/oracle/make_dtype_goldens.py",
            dir.display()
        );
        assert_eq!(
            sha256(&dir.join("config.json")),
            v.model.config_sha256,
            "{regenerate}"
        );
        for (file, want) in &v.model.weights_sha256 {
            assert_eq!(&sha256(&dir.join(file)), want, "{regenerate}");
        }
    }
    models
}

#[test]
fn generate_in_the_model_dtype_gives_mlx_lm_tokens() {
    let g = goldens();
    let models = variants(&g);
    let mut failures = Vec::new();
    let mut total = 0;
    for (name, v) in &g.variants {
        let dir = models.join(name);
        for run in &v.runs {
            total += 1;
            let out = common::run_ok(&[
                "generate",
                "-m",
                dir.to_str().unwrap(),
                "--compute-dtype",
                "model",
                "--prompt",
                &run.prompt,
                "-n",
                &v.max_tokens.to_string(),
                "--json",
            ]);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            let ids: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap();
            if let Some(at) = divergence(&ids, &run.tokens) {
                failures.push(format!("{name} {:?}: diverges at token {at}", run.prompt));
            }
        }
    }
    eprintln!(
        "{} of {total} greedy runs token-identical",
        total - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn serve_in_bf16_warms_up_and_reports_mlx_lm_log_probabilities() {
    let g = goldens();
    let models = variants(&g);
    let v = &g.variants["bf16"];
    let run = &v.runs[0];
    let server = Server::start(
        &models.join("bf16"),
        &["--compute-dtype", "model", "--warmup", "full"],
    );
    let steps = run.top_logprobs.len();
    let body = json!({
        "messages": [{"role": "user", "content": run.prompt}],
        "max_tokens": steps,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 5,
        "return_token_ids": true,
    });
    let r = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let answer: Value = r.json().unwrap();
    let choice = &answer["choices"][0];
    let ids: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
    assert_eq!(ids, run.tokens[..steps], "greedy tokens from serve");
    let mut worst = 0f32;
    for (entry, theirs) in choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&run.top_logprobs)
    {
        let ours: Vec<f32> = entry["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap() as f32)
            .collect();
        for (o, &(_, t)) in ours.iter().zip(theirs) {
            worst = worst.max((o - t).abs());
        }
        let chosen = entry["logprob"].as_f64().unwrap() as f32;
        worst = worst.max((chosen - theirs[0].1).abs());
    }
    eprintln!("bf16 serve: largest log-probability difference from mlx-lm {worst:.2e}");
    assert!(
        worst <= LOGPROB_TOL,
        "log-probabilities {worst:.2e} from mlx-lm's"
    );
}

/// A batch file's rows, decoded together in the model's dtype, give the
/// tokens mlx-lm gives each prompt alone.
#[test]
fn batch_file_in_the_model_dtype_gives_mlx_lm_tokens() {
    let g = goldens();
    let models = variants(&g);
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut total = 0;
    for (name, v) in g.variants.iter().filter(|(_, v)| v.runs.len() > 1) {
        let file = tmp.path().join(format!("{name}.jsonl"));
        let lines: Vec<String> = v.runs.iter().map(|r| json!(r.prompt).to_string()).collect();
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        let out = common::run_ok(&[
            "generate",
            "-m",
            models.join(name).to_str().unwrap(),
            "--compute-dtype",
            "model",
            "--batch-file",
            file.to_str().unwrap(),
            "-n",
            &v.max_tokens.to_string(),
            "--json",
        ]);
        let rows: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), v.runs.len(), "one result per line");
        for (row, run) in rows.iter().zip(&v.runs) {
            total += 1;
            let ids: Vec<u32> = serde_json::from_value(row["token_ids"].clone()).unwrap();
            if let Some(at) = divergence(&ids, &run.tokens) {
                failures.push(format!(
                    "{name} {:?} in a batch: diverges at token {at}",
                    run.prompt
                ));
            }
        }
    }
    eprintln!(
        "{} of {total} batched rows token-identical",
        total - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
