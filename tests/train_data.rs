//! `mlx-bun train` input handling: data rows, config files and adapter
//! files that are wrong give a clear error (naming the file and line), and
//! options from a YAML file and flags end up in the written adapter.

mod common;

use std::path::Path;

use common::{bin, model_dir, repo_root, run_ok};
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::data::{load_file, Examples, RowKind};
use mlx_rs::Array;
use serde_json::Value;

/// Runs `mlx-bun train` expecting failure; returns stderr.
fn train_fails(args: &[&str]) -> String {
    let out = bin().arg("train").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "expected failure for {args:?}");
    assert!(
        stderr.lines().any(|l| l.starts_with("error: ")),
        "not a clean error: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    stderr
}

fn data_dir(train: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train.jsonl"), train).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn malformed_rows_name_the_file_and_line() {
    let model = model_dir();
    let cases = [
        (
            "{\"text\": \"ok\"}\n{\"text\": \"broken\"\n",
            "sft",
            "train.jsonl line 2: invalid JSON",
        ),
        (
            "{\"foo\": 1}\n",
            "sft",
            "train.jsonl line 1: unsupported row",
        ),
        ("[1, 2]\n", "sft", "line 1: each line must be a JSON object"),
        (
            "{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}\n",
            "sft",
            "line 1: \"messages\"",
        ),
        (
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n",
            "sft",
            "--method orpo",
        ),
        (
            "{\"prompt\": \"p\", \"chosen\": \"a\"}\n",
            "orpo",
            "line 1: missing \"rejected\"",
        ),
        (
            "{\"prompt\": \"p\", \"chosen\": 5, \"rejected\": \"b\"}\n",
            "orpo",
            "line 1: \"chosen\" must be a string or a list of messages",
        ),
        (
            "{\"text\": \"fine\"}\n",
            "sft",
            "at least batch_size=4 examples",
        ),
    ];
    for (rows, method, expect) in cases {
        let dir = data_dir(rows);
        let adapters = dir.path().join("out");
        let err = train_fails(&[
            "--model",
            s(&model),
            "--method",
            method,
            "--data",
            s(dir.path()),
            "--iters",
            "1",
            "--adapter-path",
            s(&adapters),
            "--no-db",
        ]);
        assert!(err.contains(expect), "expected {expect:?} in: {err}");
    }
    let err = train_fails(&["--data", "/nonexistent/data", "--no-db"]);
    assert!(err.contains("/nonexistent/data"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = train_fails(&["--data", s(empty.path()), "--no-db"]);
    assert!(err.contains("train.jsonl"), "{err}");
}

#[test]
fn bad_options_and_adapter_files_are_reported() {
    let data = repo_root().join("tests/data/sft-parity");
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("c.yaml");
    std::fs::write(&cfg, "iters: 1\nlearnig_rate: 0.1\n").unwrap();
    let err = train_fails(&["-c", s(&cfg), "--data", s(&data), "--no-db"]);
    assert!(err.contains("learnig_rate"), "{err}");

    let err = train_fails(&["--data", s(&data), "--num-layers", "99", "--no-db"]);
    assert!(err.contains("only has 30"), "{err}");
    let err = train_fails(&["--data", s(&data), "--lora-keys", "self_attn.qq", "--no-db"]);
    assert!(
        err.contains("unsupported LoRA key \"self_attn.qq\""),
        "{err}"
    );

    // A resume file whose shapes do not fit (rank 4 into a rank-8 layout).
    let small = work.path().join("small");
    run_ok(&[
        "train",
        "--data",
        s(&data),
        "--iters",
        "0",
        "--batch-size",
        "2",
        "--num-layers",
        "1",
        "--lora-rank",
        "4",
        "--adapter-path",
        s(&small),
        "--no-db",
    ]);
    let err = train_fails(&[
        "--data",
        s(&data),
        "--iters",
        "1",
        "--batch-size",
        "2",
        "--num-layers",
        "1",
        "--resume-adapter-file",
        s(&small.join("adapters.safetensors")),
        "--adapter-path",
        s(&work.path().join("x")),
        "--no-db",
    ]);
    assert!(
        err.contains("model.layers.29.self_attn.q_proj.lora_a: shape [576, 4]"),
        "{err}"
    );

    // generate with a missing or broken adapter directory.
    let out = bin()
        .args([
            "generate",
            "-p",
            "hi",
            "-n",
            "1",
            "--adapter-path",
            "/nonexistent/ad",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ad"));
    std::fs::write(small.join("adapter_config.json"), "{\"num_layers\": 1}").unwrap();
    let out = bin()
        .args([
            "generate",
            "-p",
            "hi",
            "-n",
            "1",
            "--adapter-path",
            s(&small),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("lora_parameters"),
        "{stderr}"
    );
}

#[test]
fn yaml_options_and_flags_reach_the_adapter() {
    let data = repo_root().join("tests/data/sft");
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("c.yaml");
    let adapters = work.path().join("adapters");
    std::fs::write(
        &cfg,
        format!(
            "data: {}\niters: 0\nbatch_size: 2\nnum_layers: 3\nlearning_rate: 1e-4\n\
             lora_parameters:\n  rank: 4\n  keys: [self_attn.q_proj, self_attn.v_proj]\n",
            data.display()
        ),
    )
    .unwrap();
    run_ok(&[
        "train",
        "-c",
        s(&cfg),
        "--num-layers",
        "2",
        "--lora-alpha",
        "16",
        "--adapter-path",
        s(&adapters),
        "--no-db",
    ]);
    let written: Value = serde_json::from_str(
        &std::fs::read_to_string(adapters.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(written["num_layers"], 2);
    assert_eq!(written["learning_rate"], 1e-4);
    assert_eq!(written["fine_tune_type"], "lora");
    assert_eq!(written["lora_parameters"]["rank"], 4);
    assert_eq!(written["lora_parameters"]["scale"], 4.0);
    assert_eq!(
        written["lora_parameters"]["keys"],
        serde_json::json!(["self_attn.q_proj", "self_attn.v_proj"])
    );
    let tensors = Array::load_safetensors(adapters.join("adapters.safetensors")).unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    assert_eq!(names.len(), 8, "{names:?}");
    assert_eq!(names[0], "model.layers.28.self_attn.q_proj.lora_a");
    assert_eq!(
        tensors["model.layers.29.self_attn.v_proj.lora_a"].shape(),
        &[576, 4]
    );
    assert_eq!(
        tensors["model.layers.29.self_attn.v_proj.lora_b"].shape(),
        &[4, 192]
    );
}

#[test]
fn mask_prompt_supervises_only_the_reply() {
    let tok = Tokenizer::load(&model_dir()).unwrap();
    let decode = |ids: &[u32]| tok.decode(ids).unwrap();
    for (file, reply) in [
        ("tests/data/sft-parity/train.jsonl", "Bees make honey."),
        ("tests/data/sft/valid.jsonl", "3+3 is 6."),
    ] {
        let path = repo_root().join(file);
        let Examples::Sft(masked) =
            load_file(&path, &tok, RowKind::Sft { mask_prompt: true }).unwrap()
        else {
            panic!("SFT rows expected");
        };
        let Examples::Sft(plain) =
            load_file(&path, &tok, RowKind::Sft { mask_prompt: false }).unwrap()
        else {
            panic!("SFT rows expected");
        };
        let (m, p) = (&masked[0], &plain[0]);
        assert_eq!(m.tokens, p.tokens);
        assert_eq!(p.offset, 0);
        let supervised = decode(&m.tokens[m.offset..]);
        assert!(
            supervised.starts_with(reply),
            "{file}: supervised part {supervised:?}"
        );
        assert!(decode(&m.tokens[..m.offset]).ends_with("assistant\n"));
    }
}
