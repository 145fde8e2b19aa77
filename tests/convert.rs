//! `mlx-bun convert` on the real SmolLM2 GGUF: the files it writes, the
//! tokenizer it rebuilds (against the oracle's tokenizers), generation on the
//! result (against mlx-lm), `-d`, `-q`, `--dtype`, and bad inputs.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bin, model_dir, oracle_python, repo_root, run_ok};
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::tokenizer::Tokenizer;
use mlx_rs::{Array, Dtype};
use serde_json::Value;

const QUESTION: &str = "What is the capital of France?";

/// Strings whose ids exercise the pre-tokenizer: digits, unicode, code,
/// whitespace runs and chat-template text with special tokens.
const SAMPLES: [&str; 6] = [
    "In 2024, 1234567 people paid $3.50 each.",
    "héllo wörld — naïve café, 日本語, Ελληνικά 😀👍",
    "fn main() {\n    let x: Vec<u8> = vec![0x1F; 3];\n    println!(\"{x:?}\");\n}\n",
    "  leading spaces,\ttabs\n\n\nand trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure it's 'quoted' and we'll see; you've done it.",
];

fn gguf() -> PathBuf {
    mlx_bun::default_model::ensure_gguf().expect("obtaining the default model's GGUF")
}

fn convert(args: &[&str]) -> std::process::Output {
    bin()
        .arg("convert")
        .args(args)
        .output()
        .expect("running mlx-bun")
}

/// Converts the real GGUF into `<tmp>/name` with extra flags.
fn convert_gguf(tmp: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = tmp.join(name);
    let gguf = gguf();
    let mut args = vec![
        "--gguf",
        gguf.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let result = convert(&args);
    assert!(
        result.status.success(),
        "convert {args:?} failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn tensors(dir: &Path) -> HashMap<String, Array> {
    Array::load_safetensors(dir.join("model.safetensors")).expect("loading model.safetensors")
}

fn generate_json(dir: &Path, max_tokens: usize) -> Value {
    let out = run_ok(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        QUESTION,
        "-n",
        &max_tokens.to_string(),
        "--json",
    ]);
    serde_json::from_slice(&out.stdout).expect("generate --json prints one JSON object")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn default_model_and_explicit_conversion_write_the_same_model() {
    let default = model_dir();
    let tmp = tempfile::tempdir().unwrap();
    let explicit = convert_gguf(tmp.path(), "q4", &[]);

    for file in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        assert_eq!(
            read_json(&default.join(file)),
            read_json(&explicit.join(file)),
            "{file} differs between ensure() and convert --gguf"
        );
    }

    let config = read_json(&explicit.join("config.json"));
    for (key, want) in [
        ("model_type", serde_json::json!("llama")),
        ("hidden_size", 576.into()),
        ("intermediate_size", 1536.into()),
        ("num_attention_heads", 9.into()),
        ("num_key_value_heads", 3.into()),
        ("num_hidden_layers", 30.into()),
        ("head_dim", 64.into()),
        ("vocab_size", 49152.into()),
        ("max_position_embeddings", 8192.into()),
        ("rope_theta", 100000.0.into()),
        ("rope_traditional", false.into()),
        ("tie_word_embeddings", true.into()),
        ("bos_token_id", 1.into()),
        ("eos_token_id", 2.into()),
        ("pad_token_id", 2.into()),
        ("torch_dtype", "float32".into()),
    ] {
        assert_eq!(config[key], want, "config.json {key}");
    }
    assert!((config["rms_norm_eps"].as_f64().unwrap() - 1e-5).abs() < 1e-9);
    let quant = serde_json::json!({
        "group_size": 32, "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8}
    });
    assert_eq!(config["quantization"], quant);
    assert_eq!(config["quantization_config"], quant);

    let tok_config = read_json(&explicit.join("tokenizer_config.json"));
    assert_eq!(tok_config["eos_token"], "<|im_end|>");
    assert_eq!(tok_config["bos_token"], "<|im_start|>");
    assert_eq!(tok_config["model_max_length"], 8192);
    assert!(tok_config["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>assistant"));
    let tok_json = read_json(&explicit.join("tokenizer.json"));
    let added = tok_json["added_tokens"].as_array().unwrap();
    assert_eq!(
        added.len(),
        17,
        "every CONTROL token is an added special token"
    );
    assert!(added
        .iter()
        .all(|t| t["special"] == true && t["normalized"] == false));
    assert_eq!(
        tok_json["pre_tokenizer"]["pretokenizers"][0]["type"],
        "Digits"
    );
    assert_eq!(tok_json["model"]["vocab"].as_object().unwrap().len(), 49152);
    assert_eq!(tok_json["model"]["merges"].as_array().unwrap().len(), 48900);

    let ours = tensors(&explicit);
    let theirs = tensors(&default);
    assert_eq!(ours.len(), 694);
    let mut names: Vec<_> = ours.keys().collect();
    names.sort();
    for name in names {
        let (a, b) = (&ours[name], &theirs[name]);
        assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
    }
    assert!(!ours.contains_key("lm_head.weight"));
    let expect = |name: &str, dtype: Dtype, shape: &[i32]| {
        let a = &ours[name];
        assert_eq!((a.dtype(), a.shape()), (dtype, shape), "{name}");
    };
    expect("model.embed_tokens.weight", Dtype::Uint32, &[49152, 144]);
    expect("model.embed_tokens.scales", Dtype::Float32, &[49152, 18]);
    expect(
        "model.layers.0.self_attn.q_proj.weight",
        Dtype::Uint32,
        &[576, 72],
    );
    expect(
        "model.layers.29.self_attn.k_proj.biases",
        Dtype::Float32,
        &[192, 18],
    );
    expect(
        "model.layers.7.mlp.down_proj.weight",
        Dtype::Uint32,
        &[576, 192],
    );
    expect(
        "model.layers.3.input_layernorm.weight",
        Dtype::Float32,
        &[576],
    );
    expect("model.norm.weight", Dtype::Float32, &[576]);
}

#[test]
fn generation_and_tokenizer_match_mlx_lm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = convert_gguf(tmp.path(), "q4", &[]);
    let ours = generate_json(&dir, 12);
    let text = ours["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "expected Paris in {text:?}");

    let tok = Tokenizer::load(&dir).unwrap();
    // Individual digits are the SmolLM pre-tokenizer's signature.
    assert_eq!(tok.encode("2024").unwrap().len(), 4);
    let ours_ids: Vec<Vec<u32>> = SAMPLES.iter().map(|s| tok.encode(s).unwrap()).collect();
    for (s, ids) in SAMPLES.iter().zip(&ours_ids) {
        assert_eq!(tok.decode(ids).unwrap(), *s, "decode(encode(x)) == x");
    }

    let Some(python) = oracle_python() else {
        return;
    };
    let mut cmd = Command::new(python);
    cmd.arg(repo_root().join("scripts/oracle/check_convert.py"))
        .arg(&dir)
        .args(["--prompt", QUESTION, "--max-tokens", "12"])
        .env("HF_HUB_OFFLINE", "1");
    for s in SAMPLES {
        cmd.args(["--encode", s]);
    }
    let out = cmd.output().expect("running the oracle");
    assert!(
        out.status.success(),
        "check_convert.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let oracle: Value = serde_json::from_slice(&out.stdout).unwrap();

    assert_eq!(
        ids(&ours["token_ids"]),
        ids(&oracle["token_ids"]),
        "greedy tokens differ from mlx-lm's (ours {text:?}, mlx-lm {})",
        oracle["text"]
    );
    let prompt = PromptInput::Text {
        text: QUESTION.into(),
        system: None,
        use_chat_template: true,
    };
    let (_, prompt_ids) = build_prompt(&tok, &prompt).unwrap();
    let prompt_ids: Vec<u64> = prompt_ids.iter().map(|&i| i as u64).collect();
    assert_eq!(prompt_ids, ids(&oracle["prompt_ids"]), "chat prompt ids");
    for (enc, ours) in oracle["encodings"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&ours_ids)
    {
        let ours: Vec<u64> = ours.iter().map(|&i| i as u64).collect();
        assert_eq!(
            ours,
            ids(&enc["tokenizers"]),
            "tokenizers ids of {}",
            enc["text"]
        );
        assert_eq!(
            ours,
            ids(&enc["transformers"]),
            "transformers ids of {}",
            enc["text"]
        );
    }
}

#[test]
fn dequantize_quantize_and_cast_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let q4 = convert_gguf(tmp.path(), "q4", &[]);
    let dense = convert_gguf(tmp.path(), "dense", &["-d"]);

    let config = read_json(&dense.join("config.json"));
    assert!(config.get("quantization").is_none());
    let weights = tensors(&dense);
    assert!(weights.keys().all(|k| !k.ends_with(".scales")));
    let q = &weights["model.layers.0.self_attn.q_proj.weight"];
    assert_eq!((q.dtype(), q.shape()), (Dtype::Float32, &[576, 576][..]));

    let quantized_ids = ids(&generate_json(&q4, 6)["token_ids"]);
    let dense_ids = ids(&generate_json(&dense, 6)["token_ids"]);
    assert_eq!(
        quantized_ids, dense_ids,
        "dequantizing must not change greedy tokens"
    );

    let requantized = tmp.path().join("requantized");
    run_ok(&[
        "convert",
        "--model",
        dense.to_str().unwrap(),
        "-o",
        requantized.to_str().unwrap(),
        "-q",
        "--q-group-size",
        "32",
    ]);
    let config = read_json(&requantized.join("config.json"));
    assert_eq!(
        config["quantization"],
        serde_json::json!({"group_size": 32, "bits": 4, "mode": "affine"})
    );
    let weights = tensors(&requantized);
    let q = &weights["model.layers.0.self_attn.q_proj.weight"];
    assert_eq!((q.dtype(), q.shape()), (Dtype::Uint32, &[576, 72][..]));
    assert!(requantized.join("tokenizer.json").is_file());
    let text = generate_json(&requantized, 6)["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.trim().is_empty());

    let bf16 = tmp.path().join("bf16");
    run_ok(&[
        "convert",
        "--model",
        q4.to_str().unwrap(),
        "-o",
        bf16.to_str().unwrap(),
        "--dtype",
        "bfloat16",
    ]);
    let weights = tensors(&bf16);
    assert_eq!(weights["model.norm.weight"].dtype(), Dtype::Bfloat16);
    assert_eq!(
        weights["model.embed_tokens.scales"].dtype(),
        Dtype::Bfloat16
    );
    assert_eq!(weights["model.embed_tokens.weight"].dtype(), Dtype::Uint32);
    assert_eq!(
        read_json(&bf16.join("config.json"))["torch_dtype"],
        "bfloat16"
    );
}

/// A GGUF header with the given string/u32 metadata and `(name, dims, type)` tensors.
fn gguf_bytes(
    strings: &[(&str, &str)],
    ints: &[(&str, u32)],
    tensors: &[(&str, &[u64], u32)],
) -> Vec<u8> {
    fn s(out: &mut Vec<u8>, text: &str) {
        out.extend((text.len() as u64).to_le_bytes());
        out.extend(text.as_bytes());
    }
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend(((strings.len() + ints.len()) as u64).to_le_bytes());
    for (k, v) in strings {
        s(&mut b, k);
        b.extend(8u32.to_le_bytes());
        s(&mut b, v);
    }
    for (k, v) in ints {
        s(&mut b, k);
        b.extend(4u32.to_le_bytes());
        b.extend(v.to_le_bytes());
    }
    for (name, dims, kind) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(kind.to_le_bytes());
        b.extend(0u64.to_le_bytes());
    }
    b
}

fn assert_clean_failure(args: &[&str], envs: &[(&str, &str)], expect: &str) {
    let out = bin()
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    let errors: Vec<_> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        errors.len(),
        1,
        "{args:?}: want one error line, got {stderr}"
    );
    assert!(
        errors[0].contains(expect),
        "{args:?}: {:?} lacks {expect:?}",
        errors[0]
    );
}

#[test]
fn bad_inputs_fail_with_one_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    std::fs::write(p("text.gguf"), "just some text\n").unwrap();
    std::fs::write(
        p("mamba.gguf"),
        gguf_bytes(&[("general.architecture", "mamba")], &[], &[]),
    )
    .unwrap();
    std::fs::write(
        p("q6k.gguf"),
        gguf_bytes(
            &[("general.architecture", "llama")],
            &[("llama.attention.head_count", 1)],
            &[("token_embd.weight", &[256, 4], 14)],
        ),
    )
    .unwrap();
    let real = std::fs::read(gguf()).unwrap();
    std::fs::write(p("truncated.gguf"), &real[..real.len() / 2]).unwrap();
    std::fs::create_dir(p("exists")).unwrap();
    let out = p("out");
    let (missing, text, mamba, q6k, truncated, exists) = (
        p("missing.gguf"),
        p("text.gguf"),
        p("mamba.gguf"),
        p("q6k.gguf"),
        p("truncated.gguf"),
        p("exists"),
    );
    let not_a_model = tmp.path().to_str().unwrap();

    let cases: [(&[&str], &str); 8] = [
        (&["--gguf", &missing], "does not exist"),
        (&["--gguf", &text], "not a GGUF file"),
        (
            &["--gguf", &mamba],
            "unsupported GGUF architecture \"mamba\"",
        ),
        (&["--gguf", &q6k], "has type Q6_K"),
        (&["--gguf", &truncated], "beyond the end of the file"),
        (&["--model", not_a_model], "mlx-lm model directory"),
        (&["--model", &exists, "--dtype", "int8"], "unknown --dtype"),
        (
            &["--model", &exists, "-q", "--q-bits", "7"],
            "bits are not supported",
        ),
    ];
    for (args, expect) in cases {
        let mut full = vec!["convert"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", &out]);
        assert_clean_failure(&full, &[], expect);
    }
    assert_clean_failure(
        &["convert", "--gguf", &text, "-o", &exists],
        &[],
        "already exists",
    );
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n == "out")
        .collect();
    assert!(
        leftovers.is_empty(),
        "failed conversions left {leftovers:?}"
    );

    assert_clean_failure(
        &["generate", "--prompt", "hi", "-n", "1"],
        &[
            ("MLX_BUN_CACHE", &p("empty-cache")),
            ("MLX_BUN_DEFAULT_GGUF", &missing),
        ],
        "MLX_BUN_DEFAULT_GGUF names",
    );
}

#[test]
fn default_model_is_prepared_from_a_local_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = gguf();
    let out = bin()
        .args(["generate", "--prompt", QUESTION, "-n", "8", "--json"])
        .env("MLX_BUN_CACHE", tmp.path())
        .env("MLX_BUN_DEFAULT_GGUF", &gguf)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("preparing the default model"), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["text"].as_str().unwrap().contains("Paris"));
    let models = tmp.path().join("models");
    let entries: Vec<_> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        entries,
        ["SmolLM2-135M-Instruct"],
        "no staging directories left"
    );
}
