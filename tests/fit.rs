//! `mlx-bun fit` against measured memory on the default model, and the
//! start-up refusal of `generate` and `serve` for a model that cannot fit.

mod common;

use std::path::Path;

use common::{bin, model_dir, run_ok};
use serde_json::Value;

fn fit_json(args: &[&str]) -> Value {
    let mut all = vec!["fit", "--json"];
    all.extend_from_slice(args);
    let out = run_ok(&all);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A prompt of about `n` tokens without the chat template.
fn long_prompt(n: usize) -> String {
    let words = [
        "river", "stone", "garden", "lamp", "window", "cloud", "bread", "music",
    ];
    (0..n)
        .map(|i| words[i % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn prediction_matches_measured_peak_memory() {
    let model = model_dir();
    let model = model.to_str().unwrap();
    for words in [40usize, 700] {
        let out = run_ok(&[
            "generate",
            "--model",
            model,
            "--ignore-chat-template",
            "--prompt",
            &long_prompt(words),
            "--max-tokens",
            "4",
            "--json",
        ]);
        let gen: Value = serde_json::from_slice(&out.stdout).unwrap();
        let measured = gen["peak_memory_bytes"].as_f64().unwrap();
        let context = gen["prompt_tokens"].as_u64().unwrap() + 4;
        let fit = fit_json(&[
            "--model",
            model,
            "--context",
            &context.to_string(),
            "--memory",
            "64",
        ]);
        let predicted = fit["total_bytes"].as_f64().unwrap();
        let err = (predicted - measured) / measured;
        eprintln!(
            "context {context}: predicted {:.1} MiB, measured {:.1} MiB ({:+.1}%)",
            predicted / 1048576.0,
            measured / 1048576.0,
            err * 100.0
        );
        assert!(err.abs() < 0.15, "prediction off by {:.1}%", err * 100.0);
        assert_eq!(fit["fits"], true);
    }
}

#[test]
fn reports_limits_and_refuses_with_numbers() {
    let f = fit_json(&["--context", "2048", "--batch", "2", "--memory", "4"]);
    let per_token = f["kv_bytes_per_token"].as_f64().unwrap();
    // SmolLM2-135M: 30 layers × 3 KV heads × 64 × 2 (K and V) × 4 bytes, × batch 2.
    assert_eq!(per_token, 46080.0 * 2.0);
    assert_eq!(f["kv_bytes"].as_u64().unwrap(), 46080 * 2048 * 2);
    assert!(f["max_batch"].as_u64().unwrap() >= 2);
    assert_eq!(
        f["max_context"].as_u64().unwrap(),
        8192,
        "capped by the model"
    );
    // 4-bit KV takes less than a fifth of the float32 cache.
    let q = fit_json(&["--context", "2048", "--kv-bits", "4", "--memory", "1"]);
    assert!(q["kv_bytes"].as_f64().unwrap() < 46080.0 * 2048.0 / 5.0);
    // A draft adds its weights.
    let d = fit_json(&[
        "--context",
        "2048",
        "--draft-model",
        model_dir().to_str().unwrap(),
    ]);
    assert!(d["draft_bytes"].as_u64().unwrap() > d["weight_bytes"].as_u64().unwrap());

    // Too little memory: exit 1 with the numbers.
    let out = bin()
        .args(["fit", "--context", "4096", "--memory", "0.05"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("weights") && stdout.contains("KV cache"),
        "{stdout}"
    );
    assert!(stderr.contains("does not fit"), "{stderr}");
    // Bad input gets a clear error.
    let out = bin().args(["fit", "--batch", "0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batch"));
    let out = bin()
        .args(["fit", "--model", "/nonexistent/model"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// The default model's tokenizer and config, with a weight file whose header
/// claims 16 TiB of float32 weights (the data itself is not there: `fit`
/// reads headers only, and the refusal must come before any loading).
fn huge_model(dir: &Path) {
    let src = model_dir();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".safetensors") {
            std::fs::copy(&f, dir.join(&name)).unwrap();
        }
    }
    let header = r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2097152,2097152],"data_offsets":[0,0]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

#[test]
fn generate_and_serve_refuse_a_model_that_cannot_fit() {
    let dir = tempfile::tempdir().unwrap();
    huge_model(dir.path());
    let m = dir.path().to_str().unwrap();
    let out = bin()
        .args([
            "generate",
            "--model",
            m,
            "--prompt",
            "Hi",
            "--max-tokens",
            "2",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("does not fit") && stderr.contains("weights"),
        "{stderr}"
    );
    let out = bin()
        .args(["serve", "--model", m, "--port", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("does not fit"), "{stderr}");
}
