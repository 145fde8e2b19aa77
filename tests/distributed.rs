//! Two ranks over MLX's ring backend on loopback: the sharded model's greedy
//! tokens equal the single process's (tensor and pipeline parallel), each
//! rank holds only its share of the weights, and one failing rank stops the
//! others with its error.

mod common;

use std::time::{Duration, Instant};

use common::{bin, float32_model, model_dir};
use serde_json::Value;

const PROMPT: &str = "Write a haiku about the sea";

fn generate(model: &std::path::Path, launch: Option<&[&str]>, extra: &[&str]) -> Value {
    let mut cmd = bin();
    if let Some(extra) = launch {
        cmd.args(["launch", "-n", "2", "--backend", "ring", "--"]);
        cmd.arg("generate");
        cmd.args(extra);
    } else {
        cmd.arg("generate");
        cmd.args(extra);
    }
    cmd.args(["--model", model.to_str().unwrap(), "--prompt", PROMPT])
        .args(["--max-tokens", "8", "--temp", "0", "--json"]);
    let out = cmd.output().expect("running mlx-bun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    // Only rank 0 prints: exactly one JSON line.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "expected one JSON line, got {stdout:?}");
    serde_json::from_str(lines[0]).unwrap()
}

fn check_sharded(model: &std::path::Path, flags: &[&str]) {
    // Flags after --pipeline apply to the single process too.
    let shared: Vec<&str> = flags
        .iter()
        .copied()
        .filter(|f| *f != "--pipeline")
        .collect();
    let single = generate(model, None, &shared);
    let sharded = generate(model, Some(flags), &[]);
    assert_eq!(single["generation_tokens"], 8);
    assert_eq!(sharded["token_ids"], single["token_ids"], "{flags:?}");
    assert_eq!(sharded["text"], single["text"], "{flags:?}");
    // Rank 0 read only its share: its peak memory is well below the
    // single process's, which holds every weight.
    let peak = |v: &Value| v["peak_memory_bytes"].as_f64().unwrap();
    assert!(
        peak(&sharded) < 0.8 * peak(&single),
        "{flags:?}: rank 0 peak {} vs single {}",
        peak(&sharded),
        peak(&single)
    );
}

#[test]
fn tensor_parallel_float32_matches_single_process() {
    check_sharded(&float32_model(), &[]);
}

#[test]
fn pipeline_parallel_float32_matches_single_process() {
    check_sharded(&float32_model(), &["--pipeline"]);
}

#[test]
fn tensor_parallel_quantized_matches_single_process() {
    // 4-bit weights: packed columns, scales and biases split along groups.
    check_sharded(&model_dir(), &[]);
}

#[test]
fn speculative_with_a_sharded_target_matches_single_process() {
    // The draft (4-bit) runs whole on every rank; the float32 target is sharded.
    let draft = model_dir();
    let draft = draft.to_str().unwrap();
    check_sharded(
        &float32_model(),
        &["--draft-model", draft, "--num-draft-tokens", "3"],
    );
}

#[test]
fn a_failing_rank_stops_the_others_with_its_error() {
    let start = Instant::now();
    let out = bin()
        .args(["launch", "-n", "2", "--", "/bin/sh", "-c"])
        .arg(r#"if [ "$MLX_RANK" = 1 ]; then echo "error: boom on rank one" >&2; exit 3; fi; sleep 60"#)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: rank 1 failed (exit status: 3): boom on rank one"),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "rank 0 was not stopped"
    );
}

#[test]
fn sharded_refusals_name_the_flag() {
    let out = bin()
        .args(["launch", "-n", "2", "--", "generate", "--prompt", "hi"])
        .args(["--adapter-path", "adapters", "--max-tokens", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--adapter-path is not supported when the model is sharded"),
        "{stderr}"
    );
    let out = bin()
        .args(["launch", "-n", "2", "--", "serve"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("serve does not run sharded"));
}
