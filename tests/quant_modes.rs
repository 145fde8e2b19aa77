//! Models quantized in MLX's float modes (mxfp4, nvfp4, mxfp8) load and
//! generate mlx-lm's greedy tokens. Two models per mode, converted by
//! mlx-bun (whose folders equal `mlx_lm.convert`'s tensor for tensor, see
//! `tests/convert_hf.rs`): a tiny random llama made by
//! `scripts/oracle/make_tiny_hf.py`, and the default model's float32
//! weights. mlx-lm generates from the same folders
//! (`scripts/oracle/greedy_tokens.py`) after mlx-bun has.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{oracle_python, repo_root};
use serde_json::{json, Value};

const MODES: [&str; 3] = ["mxfp4", "nvfp4", "mxfp8"];
/// Token ids below the tiny model's vocabulary of 256.
const TINY_PROMPT: &str = "q;z#$%";
const SMOL_PROMPT: &str = "Paris";

fn convert(from: &Path, to: &Path, mode: &str, extra: &[&str]) {
    let mut args = vec![
        "convert",
        "--hf-path",
        from.to_str().unwrap(),
        "--mlx-path",
        to.to_str().unwrap(),
        "-q",
        "--q-mode",
        mode,
    ];
    args.extend_from_slice(extra);
    common::run_ok(&args);
}

/// mlx-bun's greedy tokens and prompt length, `--ignore-chat-template`.
fn generate(model: &Path, prompt: &str, max_tokens: usize) -> (Vec<u64>, u64) {
    let n = max_tokens.to_string();
    let out = common::run_ok(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        prompt,
        "--ignore-chat-template",
        "-n",
        &n,
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = v["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    (tokens, v["prompt_tokens"].as_u64().unwrap())
}

#[test]
fn float_quantization_modes_generate_mlx_lm_tokens() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let hf = w.join("hf");
    let made = Command::new(oracle_python().expect("the oracle is required"))
        .arg(repo_root().join("scripts/oracle/make_tiny_hf.py"))
        .arg(&hf)
        .arg(common::model_dir())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "make_tiny_hf.py: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let tiny = hf.join("llama");
    let smol = common::float32_model();

    let long_prompt = TINY_PROMPT.repeat(12);
    // (folder, prompt, tokens)
    let mut cases: Vec<(PathBuf, &str, usize)> = Vec::new();
    for mode in MODES {
        let tiny_q = w.join(format!("tiny-{mode}"));
        convert(&tiny, &tiny_q, mode, &["--dtype", "float32"]);
        cases.push((tiny_q.clone(), TINY_PROMPT, 4));
        // Past 64 rows `Linear` dequantizes and runs a dense matmul.
        cases.push((tiny_q, &long_prompt, 3));
        let smol_q = w.join(format!("smol-{mode}"));
        convert(&smol, &smol_q, mode, &[]);
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(smol_q.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["quantization"]["mode"], mode);
        cases.push((smol_q, SMOL_PROMPT, 2));
    }

    let list: Vec<Value> = cases
        .iter()
        .map(|(dir, prompt, n)| json!({"model": dir, "prompt": prompt, "max_tokens": n}))
        .collect();
    let file = w.join("greedy.json");
    std::fs::write(&file, Value::Array(list).to_string()).unwrap();
    let ours: Vec<(Vec<u64>, u64)> = cases
        .iter()
        .map(|(dir, prompt, n)| generate(dir, prompt, *n))
        .collect();
    let out = common::oracle_output(
        Command::new(oracle_python().expect("the oracle is required"))
            .arg(repo_root().join("scripts/oracle/greedy_tokens.py"))
            .arg(&file)
            .env("HF_HUB_OFFLINE", "1"),
    );
    let expected: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(expected.len(), cases.len());

    for (((ours, _, _), want), (tokens, prompt_len)) in cases.iter().zip(&expected).zip(ours) {
        let want_tokens: Vec<u64> = want["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(
            prompt_len,
            want["prompt_ids"].as_array().unwrap().len() as u64,
            "{}: prompt length",
            ours.display()
        );
        assert!(!tokens.is_empty(), "{}: no tokens", ours.display());
        assert_eq!(tokens, want_tokens, "{}: greedy tokens", ours.display());
    }
}
