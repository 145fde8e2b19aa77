//! The default model's conversion checked against readers that share none of
//! its code: `scripts/oracle/check_gguf.py` dequantizes every tensor of the
//! GGUF with llama.cpp's `gguf` package and compares it with the converted
//! directory as MLX loads it, and compares the converted tokenizer's ids with
//! llama.cpp's tokenizer and transformers' GGUF tokenizer (docs/parity.md).

mod common;

use std::process::Command;

use serde_json::Value;

use common::{oracle_python, repo_root};

/// Largest dequantization difference allowed, relative to the tensor's
/// largest magnitude: both sides compute `scale * q + bias` from the same
/// float16 block values with at most one float32 rounding (2^-23 relative).
const REL_TOL: f64 = 1e-6;

fn count(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected a count, got {v}"))
}

#[test]
fn conversion_matches_llama_cpp_reader_and_tokenizers() {
    let Some(python) = oracle_python() else {
        return;
    };
    let gguf = mlx_bun::default_model::ensure_gguf().expect("obtaining the default model's GGUF");
    let model = common::model_dir();
    let out = Command::new(python)
        .arg(repo_root().join("scripts/oracle/check_gguf.py"))
        .arg(&gguf)
        .arg(&model)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("running check_gguf.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Option<Value> = serde_json::from_str(&stdout).ok();
    assert!(
        out.status.success(),
        "check_gguf.py failed: {}\nfailures: {}",
        String::from_utf8_lossy(&out.stderr),
        report
            .as_ref()
            .map_or_else(|| stdout.to_string(), |r| r["failures"].to_string())
    );
    let report = report.expect("check_gguf.py printed no JSON");
    assert_eq!(report["ok"], true, "failures: {}", report["failures"]);

    // Tensors: every one, each within the tolerance.
    let tensors = &report["tensors"];
    let header = mlx_bun::convert::gguf::GgufHeader::read(&gguf).unwrap();
    assert_eq!(count(&tensors["count"]), header.tensors.len() as u64);
    let per_tensor = tensors["per_tensor"].as_object().unwrap();
    assert_eq!(per_tensor.len(), header.tensors.len());
    assert!(tensors["rel_tolerance"].as_f64().unwrap() <= REL_TOL);
    let mut worst = ("", 0.0f64);
    for (name, t) in per_tensor {
        let diff = t["max_abs_diff"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}: no difference measured: {t}"));
        let scale = t["max_abs_value"].as_f64().unwrap();
        assert!(
            diff <= REL_TOL * scale,
            "{name}: max abs diff {diff:e} over {REL_TOL:e} x {scale}"
        );
        if diff > worst.1 {
            worst = (name, diff);
        }
    }
    let overall = tensors["max_abs_diff"].as_f64().unwrap();
    assert_eq!(overall, worst.1);
    assert_eq!(tensors["tied_embeddings"], true);
    let largest = if overall > 0.0 {
        format!(
            "largest at {}; {} bit-identical",
            worst.0, tensors["bit_identical"]
        )
    } else {
        "every tensor bit-identical".to_string()
    };
    eprintln!(
        "GGUF tensors vs llama.cpp's gguf {}: {} tensors {}, max abs diff {overall:e} \
         ({largest}); tolerance {REL_TOL:e} x max |value| per tensor",
        report["gguf_package"],
        per_tensor.len(),
        tensors["types"],
    );

    // Tokenizer: our ids equal llama.cpp's on every sample, and transformers'
    // wherever its pre-tokenizer is llama.cpp's.
    let tok = &report["tokenizer"];
    let samples = count(&tok["samples"]);
    assert!(samples >= 13, "{samples} samples");
    assert_eq!(count(&tok["equal_llama_cpp"]), samples, "{tok}");
    assert_eq!(
        count(&tok["equal_transformers_llama_cpp_split"]),
        samples,
        "{tok}"
    );
    assert_eq!(tok["vocab_equal_gguf"], true);
    assert_eq!(tok["vocab_equal_transformers"], true);
    for case in tok["cases"].as_array().unwrap() {
        assert_eq!(case["roundtrip"], true, "{case}");
        if case["equal_transformers"] != true {
            assert_eq!(case["transformers_equal_llama_cpp"], false, "{case}");
        }
    }
    eprintln!(
        "tokenizer: {samples} samples; equal to llama.cpp's on {}, to transformers' GGUF \
         tokenizer on {} (differs on {}: {}), to transformers' with llama.cpp's split on {}",
        tok["equal_llama_cpp"],
        tok["equal_transformers"],
        tok["transformers_differs"],
        tok["transformers_note"].as_str().unwrap_or("-"),
        tok["equal_transformers_llama_cpp_split"],
    );
}
