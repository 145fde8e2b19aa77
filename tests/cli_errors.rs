//! The binary on bad input: every mistake a user can make on the command line
//! or in a model folder ends with exit status 1 or 2 and one `error:` message
//! naming the flag, file, field or tensor, never a panic. A reader that
//! closes our stdout ends the command quietly with status 0.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use common::{bin, model_dir};
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("running mlx-bun")
}

/// Runs `args`, expects exit status `code` and returns stderr.
fn fails(args: &[&str], code: i32) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "mlx-bun {args:?}: {stderr}");
    assert!(
        !stderr.contains("panicked"),
        "mlx-bun {args:?} panicked: {stderr}"
    );
    stderr
}

fn assert_mentions(stderr: &str, parts: &[&str]) {
    for part in parts {
        assert!(stderr.contains(part), "expected {part:?} in: {stderr}");
    }
}

#[test]
fn negative_and_zero_numbers_get_a_clear_error() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["generate", "--temp", "-1"],
            &["--temp", "0 or more, got -1"],
        ),
        (
            &["generate", "--max-tokens", "0"],
            &["--max-tokens", "at least 1"],
        ),
        (
            &["generate", "-n", "-5"],
            &["--max-tokens", "at least 1, got -5"],
        ),
        (
            &["generate", "--top-p", "0"],
            &["--top-p", "greater than 0"],
        ),
        (&["generate", "--top-p", "1.5"], &["--top-p", "at most 1"]),
        (
            &["generate", "--min-p", "-0.1"],
            &["--min-p", "from 0 to 1"],
        ),
        (&["generate", "--top-k", "-1"], &["--top-k", "0 or more"]),
        (
            &["generate", "--repetition-penalty", "0"],
            &["--repetition-penalty", "greater than 0"],
        ),
        (
            &["generate", "--prefill-step-size", "0"],
            &["--prefill-step-size", "at least 1"],
        ),
        (
            &["generate", "--num-draft-tokens", "0"],
            &["--num-draft-tokens", "at least 1"],
        ),
        (&["generate", "--temp", "nan"], &["--temp", "finite"]),
        (
            &["bench", "forward", "--runs", "0"],
            &["--runs", "at least 1"],
        ),
        (
            &["bench", "forward", "--lengths", "1,0"],
            &["--lengths", "at least 1"],
        ),
        (
            &["bench", "forward", "--context", "-3"],
            &["--context", "0 or more"],
        ),
    ];
    for (args, parts) in cases {
        let stderr = fails(args, 2);
        assert_mentions(&stderr, parts);
    }
}

#[test]
fn checked_flags_of_serve_convert_and_train() {
    let stderr = fails(&["serve", "--max-queue", "0"], 1);
    assert_mentions(&stderr, &["--max-queue must be at least 1"]);
    let stderr = fails(&["serve", "--prompt-cache", "-1"], 1);
    assert_mentions(&stderr, &["--prompt-cache"]);
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("m");
    let stderr = fails(
        &[
            "convert",
            "--model",
            "/nonexistent",
            "-q",
            "--q-bits",
            "-4",
            "-o",
            target.to_str().unwrap(),
        ],
        1,
    );
    assert_mentions(&stderr, &["-4 quantization bits are not supported"]);
    let stderr = fails(
        &["train", "--learning-rate", "-1", "--data", "/nonexistent"],
        1,
    );
    assert_mentions(&stderr, &["learning_rate"]);
}

#[test]
fn a_closed_stdout_ends_quietly_with_status_zero() {
    // A pipe whose reader is gone before the first write: completions.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = bin()
        .args(["completions", "bash"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    // `generate | head -c 5`: the reader leaves in the middle of the stream.
    let dir = model_dir();
    let mut child = bin()
        .args([
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--max-tokens",
            "60",
        ])
        .args(["--prompt", "Count from one to fifty in words."])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 5];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
}

/// A copy of the default model folder: `config.json` and the tokenizer files
/// copied (to be edited), the weights linked.
fn model_copy() -> tempfile::TempDir {
    let src = model_dir();
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let dest = tmp.path().join(path.file_name().unwrap());
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::os::unix::fs::symlink(&path, &dest).unwrap();
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
    tmp
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn generate_in(dir: &Path) -> String {
    fails(
        &[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "Hi",
            "--max-tokens",
            "1",
        ],
        1,
    )
}

fn file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

#[test]
fn broken_configs_name_the_file_and_field() {
    let m = model_copy();
    let config = file(m.path(), "config.json");
    let config_s = config.display().to_string();

    edit_json(&config, |c| c["num_attention_heads"] = 0.into());
    let e = generate_in(m.path());
    assert_mentions(
        &e,
        &[&config_s, "num_attention_heads must be at least 1, got 0"],
    );

    edit_json(&config, |c| {
        c["num_attention_heads"] = 9.into();
        c["num_key_value_heads"] = 2.into();
    });
    let e = generate_in(m.path());
    assert_mentions(
        &e,
        &["num_attention_heads (9) must be a multiple of num_key_value_heads (2)"],
    );

    edit_json(&config, |c| c["hidden_size"] = "wide".into());
    let e = generate_in(m.path());
    assert_mentions(&e, &[&config_s, "hidden_size"]);

    std::fs::write(&config, "{ not json").unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &["parsing", &config_s]);

    std::fs::remove_file(&config).unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &[&config_s]);

    let e = fails(
        &[
            "generate",
            "--model",
            "/nonexistent/model",
            "--prompt",
            "Hi",
        ],
        1,
    );
    assert_mentions(&e, &["/nonexistent/model"]);

    let bias = r#"{"99999999": 5}"#;
    let e = fails(&["generate", "--prompt", "Hi", "--logit-bias", bias], 1);
    assert_mentions(&e, &["--logit-bias names token 99999999", "49152"]);
}

#[test]
fn weights_that_disagree_with_the_config_name_the_tensor() {
    let m = model_copy();
    let config = file(m.path(), "config.json");
    // 9 heads of 64: 9 KV heads would need k_proj rows of 576, the file has 192.
    edit_json(&config, |c| c["num_key_value_heads"] = 9.into());
    let e = generate_in(m.path());
    assert_mentions(
        &e,
        &[
            "model.layers.0.self_attn.k_proj.weight",
            "[576, 576]",
            "num_key_value_heads",
        ],
    );

    edit_json(&config, |c| {
        c["num_key_value_heads"] = 3.into();
        c["intermediate_size"] = 1000.into();
    });
    let e = generate_in(m.path());
    assert_mentions(
        &e,
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "[1000, 576]",
            "intermediate_size",
        ],
    );

    edit_json(&config, |c| {
        c["intermediate_size"] = 1536.into();
        c["num_hidden_layers"] = 31.into();
    });
    let e = generate_in(m.path());
    assert_mentions(&e, &["model.layers.30"]);
}

#[test]
fn corrupt_weights_and_tokenizers_name_the_file() {
    let m = model_copy();
    let weights = file(m.path(), "model.safetensors");
    let real = std::fs::read_link(&weights).unwrap();
    std::fs::remove_file(&weights).unwrap();

    // Truncated: the header promises more data than the file holds.
    let bytes = std::fs::read(&real).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let e = generate_in(m.path());
    assert_mentions(
        &e,
        &[
            "invalid safetensors file",
            &weights.display().to_string(),
            "outside",
        ],
    );

    // A header length beyond the file.
    let mut junk = (1u64 << 40).to_le_bytes().to_vec();
    junk.extend_from_slice(b"{}");
    std::fs::write(&weights, &junk).unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &["invalid safetensors file", "header claims"]);

    std::fs::write(&weights, b"short").unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &["too short to be safetensors"]);

    // No weights at all.
    std::fs::remove_file(&weights).unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &["no *.safetensors weights"]);
    std::os::unix::fs::symlink(&real, &weights).unwrap();

    let tokenizer = file(m.path(), "tokenizer.json");
    std::fs::write(&tokenizer, "{\"model\": 3}").unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &[&tokenizer.display().to_string()]);
    std::fs::remove_file(&tokenizer).unwrap();
    let e = generate_in(m.path());
    assert_mentions(&e, &[&tokenizer.display().to_string()]);
}

#[test]
fn a_corrupt_adapter_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        r#"{"num_layers": 4, "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0}}"#;
    std::fs::write(dir.path().join("adapter_config.json"), config).unwrap();
    let file = dir.path().join("adapters.safetensors");
    let mut bytes = 68u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(
        br#"{"a":{"dtype":"F32","shape":[1000000],"data_offsets":[0,4000000]}}  "#,
    );
    std::fs::write(&file, &bytes).unwrap();
    let e = fails(
        &[
            "generate",
            "--prompt",
            "Hi",
            "-n",
            "1",
            "--adapter-path",
            dir.path().to_str().unwrap(),
        ],
        1,
    );
    assert_mentions(
        &e,
        &[
            "invalid safetensors file",
            &file.display().to_string(),
            "outside",
        ],
    );
}

#[test]
fn a_broken_chat_template_names_its_file() {
    let m = model_copy();
    let tc = file(m.path(), "tokenizer_config.json");
    edit_json(&tc, |c| {
        c["chat_template"] = "{% for m in messages %}{{ m.content }".into()
    });
    let e = generate_in(m.path());
    assert_mentions(&e, &["invalid chat template", &tc.display().to_string()]);

    edit_json(&tc, |c| {
        c["chat_template"] = "{{ raise_exception('no system messages') }}".into()
    });
    let e = generate_in(m.path());
    assert_mentions(&e, &["chat template failed", "no system messages"]);
}

#[test]
fn a_truncated_gguf_is_an_error_naming_it() {
    let gguf = mlx_bun::default_model::ensure_gguf().unwrap();
    let bytes = std::fs::read(&gguf).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cut = tmp.path().join("cut.gguf");
    let out = tmp.path().join("out");
    let (cut_s, out_s) = (cut.to_str().unwrap(), out.to_str().unwrap());

    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let e = fails(&["convert", "--gguf", cut_s, "-o", out_s], 1);
    assert_mentions(&e, &[cut_s, "beyond the end of the file"]);
    assert!(!out.exists());

    std::fs::write(&cut, &bytes[..4096]).unwrap();
    let e = fails(&["convert", "--gguf", cut_s, "-o", out_s], 1);
    assert_mentions(&e, &[cut_s]);

    std::fs::write(&cut, b"GGUF\x03\0\0\0").unwrap();
    let e = fails(&["convert", "--gguf", cut_s, "-o", out_s], 1);
    assert_mentions(&e, &[cut_s, "ends early"]);
}
