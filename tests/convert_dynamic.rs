//! `mlx-bun convert --target-bpw` against mlx-lm's dynamic quantization
//! (`mlx_lm.quant.dynamic_quant`'s own functions, run by
//! scripts/oracle/dynamic_quant_reference.py) on a tiny random llama and the
//! same local calibration text: the same per-layer sensitivities, the same
//! bits per layer, the same perplexities; a folder mlx-lm and `generate`
//! load; the target met; bad targets refused.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{bin, model_dir, oracle_python, repo_root};
use serde_json::Value;

const ROWS: &str = "5";
const LENGTH: &str = "32";
/// Between the bits per weight of 4 and of 6 high layers of the tiny model
/// on this text, where mlx-lm's bisection stays within the target.
const TARGET: f64 = 5.01;

fn calibration() -> PathBuf {
    repo_root().join("tests/data/calibration/apache-2.0.txt")
}

fn oracle(args: &[&str]) -> Output {
    let py = oracle_python().expect("the oracle (mlx-lm) is required");
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/dynamic_quant_reference.py"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dynamic_quant_reference.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn last_json_line(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

fn convert(args: &[&str]) -> Output {
    bin().arg("convert").args(args).output().unwrap()
}

fn sensitivities(path: &Path) -> BTreeMap<String, f64> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap()))
        .collect()
}

fn quantization(dir: &Path) -> Value {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(v["quantization"], v["quantization_config"]);
    v["quantization"].clone()
}

/// The number after `label` in the CLI's report.
fn reported(stderr: &str, label: &str) -> f64 {
    let rest = &stderr[stderr
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {stderr}"))
        + label.len()..];
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().unwrap()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-9
}

#[test]
fn sensitivities_and_bits_match_mlx_lm_dynamic_quant() {
    let work = tempfile::tempdir().unwrap();
    let w = |name: &str| work.path().join(name).to_string_lossy().into_owned();
    let tiny = w("tiny");
    oracle(&["make", &tiny, model_dir().to_str().unwrap()]);
    let text = calibration().to_string_lossy().into_owned();
    let target = TARGET.to_string();
    let theirs = last_json_line(&oracle(&[
        "run",
        &tiny,
        &text,
        &w("theirs"),
        &w("theirs.json"),
        "--target-bpw",
        &target,
        "--num-samples",
        ROWS,
        "--sequence-length",
        LENGTH,
    ]));
    assert!(theirs["bits_per_weight"].as_f64().unwrap() <= TARGET);

    let out = convert(&[
        "--hf-path",
        &tiny,
        "-o",
        &w("ours"),
        "--target-bpw",
        &target,
        "--data",
        &text,
        "--num-samples",
        ROWS,
        "--sequence-length",
        LENGTH,
        "--save-sensitivities",
        &w("ours.json"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");

    // Sensitivities: the same layers, the same values to float32 rounding.
    let ours_s = sensitivities(&work.path().join("ours.json"));
    let theirs_s = sensitivities(&work.path().join("theirs.json"));
    assert_eq!(
        ours_s.keys().collect::<Vec<_>>(),
        theirs_s.keys().collect::<Vec<_>>()
    );
    assert_eq!(ours_s.len(), 1 + 2 * 7);
    for (k, a) in &ours_s {
        assert!(
            close(*a, theirs_s[k], 1e-4),
            "{k}: ours {a}, mlx-lm {}",
            theirs_s[k]
        );
    }

    // The same bits per layer, in the same config form, and some of each.
    let q = quantization(&work.path().join("ours"));
    assert_eq!(q, quantization(&work.path().join("theirs")));
    let high = q.as_object().unwrap().len() - 3;
    assert!(high > 0 && high < 15, "{q}");

    // Bits per weight reported, within the target, equal to mlx-lm's.
    let bpw = reported(&stderr, "bits per weight:");
    assert!(bpw <= TARGET, "{stderr}");
    assert!(close(
        bpw,
        theirs["bits_per_weight"].as_f64().unwrap(),
        1e-4
    ));
    // Perplexities: the original and the measured quantized one as mlx-lm's
    // eval_ppl on the same rows; a prediction is printed.
    let original = reported(&stderr, "original");
    let quantized = reported(&stderr, "quantized");
    assert!(close(
        original,
        theirs["original_ppl"].as_f64().unwrap(),
        1e-3
    ));
    assert!(close(
        quantized,
        theirs["quantized_ppl"].as_f64().unwrap(),
        1e-3
    ));
    assert!(reported(&stderr, "predicted") > 0.0, "{stderr}");

    // mlx-lm loads the folder with those bits; our generate runs it.
    let loaded = last_json_line(&oracle(&["load", &w("ours")]));
    for (layer, bits) in loaded["bits"].as_object().unwrap() {
        let expect = q.get(layer).map_or(4, |e| e["bits"].as_i64().unwrap());
        assert_eq!(bits.as_i64(), Some(expect), "{layer}");
    }
    assert_eq!(loaded["bits"].as_object().unwrap().len(), 15);
    let gen = common::run_ok(&[
        "generate",
        "--model",
        &w("ours"),
        "--prompt",
        "hi",
        "-n",
        "3",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&gen.stdout).unwrap();
    assert_eq!(v["token_ids"].as_array().map(Vec::len), Some(3), "{v}");

    // Sensitivities from mlx-lm's file; a target where mlx-lm's bisection
    // would land over it is met by moving the threshold up.
    let out = convert(&[
        "--hf-path",
        &tiny,
        "-o",
        &w("from-file"),
        "--target-bpw",
        "5.02",
        "--data",
        &text,
        "--num-samples",
        ROWS,
        "--sequence-length",
        LENGTH,
        "--sensitivities",
        &w("theirs.json"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(reported(&stderr, "bits per weight:") <= 5.02, "{stderr}");
    assert!(stderr.contains("predicted n/a"), "{stderr}");

    // A target below every layer at the low bits is refused before any work.
    let out = convert(&[
        "--hf-path",
        &tiny,
        "-o",
        &w("too-low"),
        "--target-bpw",
        "4.5",
        "--data",
        &text,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--target-bpw 4.5 is below"), "{stderr}");
    assert!(!work.path().join("too-low").exists());
}

#[test]
fn bad_calibration_input_is_named() {
    let work = tempfile::tempdir().unwrap();
    let out = convert(&[
        "--hf-path",
        common::float32_model().to_str().unwrap(),
        "-o",
        work.path().join("o").to_str().unwrap(),
        "--target-bpw",
        "9",
        "--data",
        work.path().join("missing.txt").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("missing.txt"), "{stderr}");
    let out = convert(&[
        "--hf-path",
        model_dir().to_str().unwrap(),
        "-o",
        work.path().join("o").to_str().unwrap(),
        "--target-bpw",
        "5",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already quantized"), "{stderr}");
    let out = convert(&["--hf-path", "x", "--target-bpw", "5", "-q"]);
    assert!(!out.status.success());
}
