//! Prompt-cache files, KV quantization and bounded caches against the real
//! mlx-lm (the oracle venv; these tests fail when it is missing):
//! files move both ways between `mlx_lm.cache_prompt`/`mlx_lm.generate` and
//! `mlx-bun` with token-identical greedy continuations; `--kv-bits` and
//! `--max-kv-size` decode as mlx-lm's `QuantizedKVCache`/`RotatingKVCache`;
//! crafted bad files are refused with clear errors, never a panic.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{bin, model_dir, oracle_python, repo_root, run_ok};
use serde_json::Value;

const CACHED: &str = "You are a helpful assistant. Here is a note about cats: cats are small, \
                      furry animals that sleep most of the day.";
const FOLLOW: &str = " What do cats do most of the day?";
const STORY: &str = "Write a short story about a robot who learns to paint, in three sentences.";

fn oracle() -> PathBuf {
    oracle_python().expect(
        "the mlx-lm oracle is missing: run scripts/oracle/setup.sh (or set MLX_BUN_ORACLE_PYTHON)",
    )
}

fn oracle_cmd(args: &[&str]) -> Output {
    let hf = std::env::temp_dir().join("mlx-bun-oracle-hf");
    std::fs::create_dir_all(&hf).unwrap();
    let out = Command::new(oracle())
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", &hf)
        .output()
        .expect("running the oracle");
    assert!(
        out.status.success(),
        "oracle {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The text `mlx_lm.generate` prints between its `==========` rules.
fn oracle_generate(args: &[&str]) -> String {
    let mut all = vec!["-m", "mlx_lm", "generate"];
    all.extend_from_slice(args);
    let out = String::from_utf8(oracle_cmd(&all).stdout).unwrap();
    let body = out
        .split_once("==========\n")
        .and_then(|(_, rest)| rest.split_once("\n==========").map(|(t, _)| t))
        .unwrap_or_else(|| panic!("unexpected mlx_lm.generate output: {out}"));
    body.to_string()
}

fn ours_json(args: &[&str]) -> Value {
    let mut all = vec!["generate", "--json"];
    all.extend_from_slice(args);
    serde_json::from_slice(&run_ok(&all).stdout).expect("generate --json output")
}

fn ours_text(args: &[&str]) -> String {
    ours_json(args)["text"].as_str().unwrap().to_string()
}

fn fails(args: &[&str]) -> String {
    let out = bin().args(args).output().expect("running mlx-bun");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    err
}

#[test]
fn files_move_both_ways_between_mlx_lm_and_mlx_bun() {
    let model = model_dir();
    let m = model.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let theirs = tmp.path().join("theirs.safetensors");
    let ours = tmp.path().join("ours.safetensors");
    oracle_cmd(&[
        "-m",
        "mlx_lm",
        "cache_prompt",
        "--model",
        m,
        "--prompt",
        CACHED,
        "--prompt-cache-file",
        theirs.to_str().unwrap(),
    ]);
    run_ok(&[
        "cache-prompt",
        "--model",
        m,
        "--prompt",
        CACHED,
        "--prompt-cache-file",
        ours.to_str().unwrap(),
    ]);
    let before = std::fs::read(&ours).unwrap();
    let (ts, os) = (theirs.to_str().unwrap(), ours.to_str().unwrap());
    let ours_from_theirs = ours_json(&[
        "--model",
        m,
        "--prompt-cache-file",
        ts,
        "--prompt",
        FOLLOW,
        "-n",
        "10",
    ]);
    let ours_from_ours = ours_json(&[
        "--model",
        m,
        "--prompt-cache-file",
        os,
        "--prompt",
        FOLLOW,
        "-n",
        "10",
    ]);
    // Only the new turn is processed: the cached positions are not.
    assert!(ours_from_ours["prompt_tokens"].as_u64().unwrap() < 20);
    let theirs_from_ours = oracle_generate(&[
        "--model",
        m,
        "--prompt-cache-file",
        os,
        "--prompt",
        FOLLOW,
        "--max-tokens",
        "10",
    ]);
    let t1 = ours_from_theirs["text"].as_str().unwrap();
    let t2 = ours_from_ours["text"].as_str().unwrap();
    assert!(!t1.trim().is_empty());
    assert_eq!(
        t1, t2,
        "ours continuing mlx-lm's file vs ours continuing ours"
    );
    assert_eq!(t2, theirs_from_ours, "mlx-lm continuing our file");
    assert_eq!(
        ours_from_theirs["token_ids"], ours_from_ours["token_ids"],
        "token ids"
    );
    assert_eq!(
        before,
        std::fs::read(&ours).unwrap(),
        "the file was modified"
    );

    // Without --model, the file's model is used (as mlx-lm does).
    let t3 = ours_text(&[
        "--prompt-cache-file",
        ours.to_str().unwrap(),
        "--prompt",
        FOLLOW,
        "-n",
        "10",
    ]);
    assert_eq!(t3, t2);
}

#[test]
fn kv_bits_and_max_kv_size_decode_as_mlx_lm() {
    let model = model_dir();
    let m = model.to_str().unwrap();
    // Quantized attention from the first position on, 4 and 8 bits.
    for bits in ["4", "8"] {
        let ours = ours_text(&[
            "--model",
            m,
            "--prompt",
            STORY,
            "-n",
            "12",
            "--kv-bits",
            bits,
            "--quantized-kv-start",
            "0",
        ]);
        let theirs = oracle_generate(&[
            "--model",
            m,
            "--prompt",
            STORY,
            "--max-tokens",
            "12",
            "--kv-bits",
            bits,
            "--quantized-kv-start",
            "0",
        ]);
        assert!(!ours.trim().is_empty());
        assert_eq!(ours, theirs, "--kv-bits {bits}");
    }

    // A bounded cache shorter than the prompt: mlx-lm's RotatingKVCache
    // (built explicitly: mlx-lm 0.32.2 ignores --max-kv-size for LLaMA).
    let ours = ours_json(&[
        "--model",
        m,
        "--prompt",
        STORY,
        "-n",
        "16",
        "--max-kv-size",
        "24",
    ]);
    let script = repo_root().join("scripts/oracle/rotating_reference.py");
    let out = oracle_cmd(&[script.to_str().unwrap(), m, STORY, "24", "16"]);
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(theirs["prompt_tokens"].as_u64().unwrap() > 24);
    assert_eq!(ours["token_ids"], theirs["token_ids"], "--max-kv-size 24");

    let tmp = tempfile::tempdir().unwrap();
    // A bounded cache file (a RotatingKVCache that has wrapped) continues
    // the same in mlx-lm and in mlx-bun.
    let rot = tmp.path().join("rot.safetensors");
    let rs = rot.to_str().unwrap();
    run_ok(&[
        "cache-prompt",
        "--model",
        m,
        "--prompt",
        CACHED,
        "--prompt-cache-file",
        rs,
        "--max-kv-size",
        "24",
    ]);
    let ours = ours_text(&[
        "--model",
        m,
        "--prompt-cache-file",
        rs,
        "--prompt",
        FOLLOW,
        "-n",
        "10",
    ]);
    let theirs = oracle_generate(&[
        "--model",
        m,
        "--prompt-cache-file",
        rs,
        "--prompt",
        FOLLOW,
        "--max-tokens",
        "10",
    ]);
    assert_eq!(ours, theirs, "bounded cache file");

    // A quantized cache file written by us continues in mlx-lm.
    let q = tmp.path().join("q8.safetensors");
    let qs = q.to_str().unwrap();
    run_ok(&[
        "cache-prompt",
        "--model",
        m,
        "--prompt",
        CACHED,
        "--prompt-cache-file",
        qs,
        "--kv-bits",
        "8",
        "--quantized-kv-start",
        "0",
    ]);
    let ours = ours_text(&[
        "--model",
        m,
        "--prompt-cache-file",
        qs,
        "--prompt",
        FOLLOW,
        "-n",
        "10",
        "--kv-bits",
        "8",
    ]);
    let theirs = oracle_generate(&[
        "--model",
        m,
        "--prompt-cache-file",
        qs,
        "--prompt",
        FOLLOW,
        "--max-tokens",
        "10",
        "--kv-bits",
        "8",
    ]);
    assert_eq!(ours, theirs, "quantized cache file");
    let err = fails(&[
        "generate",
        "--model",
        m,
        "--prompt-cache-file",
        qs,
        "--prompt",
        FOLLOW,
        "--kv-bits",
        "4",
    ]);
    assert!(err.contains("--kv-bits 4 does not match"), "{err}");
}

/// Rewrites a safetensors file with `edit` applied to its tensors and metadata.
fn craft(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(
        &mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>,
        &mut HashMap<String, String>,
    ),
) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap_or_default();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    edit(&mut tensors, &mut meta);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &Some(meta), dst).unwrap();
}

#[test]
fn bad_files_are_refused_with_clear_errors() {
    let model = model_dir();
    let m = model.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.safetensors");
    let g = good.to_str().unwrap();
    run_ok(&[
        "cache-prompt",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--prompt-cache-file",
        g,
    ]);
    let try_file = |path: &Path| {
        fails(&[
            "generate",
            "--model",
            m,
            "--prompt-cache-file",
            path.to_str().unwrap(),
            "--prompt",
            "x",
            "-n",
            "1",
        ])
    };
    let bytes = std::fs::read(&good).unwrap();

    let cut = tmp.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert!(try_file(&cut).contains("truncated or corrupt"));

    let junk = tmp.path().join("junk.safetensors");
    std::fs::write(&junk, b"\xff\xff\xff\xff\x00\x00\x00\x00garbage").unwrap();
    assert!(try_file(&junk).contains("junk.safetensors"));
    std::fs::write(&junk, b"").unwrap();
    assert!(try_file(&junk).contains("truncated or corrupt"));
    assert!(try_file(&tmp.path().join("absent.safetensors")).contains("reading"));

    let weights = model.join("model.safetensors");
    assert!(try_file(&weights).contains("not a prompt-cache file"));

    let fewer = tmp.path().join("fewer.safetensors");
    craft(&good, &fewer, |t, meta| {
        t.retain(|(n, ..)| !n.starts_with("29."));
        meta.remove("1.29");
        meta.retain(|_, v| !v.starts_with("29."));
    });
    let err = try_file(&fewer);
    assert!(
        err.contains("holds 29 layers but the model has 30"),
        "{err}"
    );

    let narrow = tmp.path().join("narrow.safetensors");
    craft(&good, &narrow, |t, _| {
        for (n, _, shape, data) in t.iter_mut() {
            if n == "3.0" || n == "3.1" {
                shape[3] /= 2;
                data.truncate(data.len() / 2);
            }
        }
    });
    let err = try_file(&narrow);
    assert!(
        err.contains("layer 3 has head size 32, the model has 64"),
        "{err}"
    );

    let heads = tmp.path().join("heads.safetensors");
    craft(&good, &heads, |t, _| {
        for (n, _, shape, data) in t.iter_mut() {
            if n == "0.0" || n == "0.1" {
                shape[1] = 1;
                data.truncate(data.len() / 3);
            }
        }
    });
    let err = try_file(&heads);
    assert!(
        err.contains("layer 0 has 1 KV heads, the model has 3"),
        "{err}"
    );

    let other = tmp.path().join("other.safetensors");
    craft(&good, &other, |_, meta| {
        meta.insert(
            "0.mlx_bun_model_fingerprint".into(),
            "0123456789abcdef".into(),
        );
    });
    let err = try_file(&other);
    assert!(err.contains("other model weights"), "{err}");

    let offset = tmp.path().join("offset.safetensors");
    craft(&good, &offset, |t, _| {
        for (n, _, _, data) in t.iter_mut() {
            if n == "5.2" {
                data.copy_from_slice(&9999i32.to_le_bytes());
            }
        }
    });
    let err = try_file(&offset);
    assert!(
        err.contains("layer 5") && err.contains("offset 9999"),
        "{err}"
    );
    assert_eq!(
        bytes,
        std::fs::read(&good).unwrap(),
        "the file was modified"
    );

    // A ring whose write index falls inside the kept positions.
    let rot = tmp.path().join("rot.safetensors");
    let rs = rot.to_str().unwrap();
    run_ok(&[
        "cache-prompt",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--prompt-cache-file",
        rs,
        "--max-kv-size",
        "8",
    ]);
    let ring = tmp.path().join("ring.safetensors");
    craft(&rot, &ring, |t, _| {
        for (n, _, _, data) in t.iter_mut() {
            if n == "2.5" {
                data.copy_from_slice(&1i32.to_le_bytes());
            }
        }
    });
    let err = try_file(&ring);
    assert!(
        err.contains("layer 2") && err.contains("inconsistent ring"),
        "{err}"
    );
}
