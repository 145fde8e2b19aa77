//! LoRA SFT against mlx-lm on the default model: the same initial adapter
//! gives the same per-step losses, each side loads the other's adapter, and
//! fusing an adapter into the weights keeps the model's outputs.

mod common;

use std::path::Path;
use std::process::Command;

use common::{model_dir, oracle_python, repo_root, run_ok};
use mlx_bun::adapters;
use mlx_bun::autodiff::forward::TrainForward;
use mlx_bun::lora::{AdapterLayout, LoraParameters};
use mlx_bun::model::Model;
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::batches::pad_sft;
use mlx_bun::train::data::{load_file, Examples, RowKind};
use mlx_bun::train::losses::sft_loss;
use mlx_rs::{random, Array};
use serde_json::Value;

const NUM_LAYERS: &str = "2";

fn json_lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A random adapter (both factors non-zero) for the last two blocks, every
/// linear layer, rank 8, written under mlx-lm's tensor names.
fn write_random_adapter(model: &Model, file: &Path) {
    let layout = AdapterLayout::new(model, 2, &LoraParameters::default()).unwrap();
    let mut key = random::key(11).unwrap();
    let params: Vec<Array> = layout
        .shapes(model)
        .iter()
        .map(|s| {
            let (next, sub) = random::split(&key, 2).unwrap();
            key = next;
            random::uniform::<_, f32>(-0.05f32, 0.05f32, &s[..], &sub).unwrap()
        })
        .collect();
    adapters::save_params(&layout, &params, file).unwrap();
}

/// Mean cross-entropy over the rows of `file` (one row per batch, mlx-lm's
/// mask), weighted by supervised tokens: what mlx-lm's evaluation computes.
fn mean_loss(model: &Model, tok: &Tokenizer, file: &Path) -> f64 {
    let Examples::Sft(rows) = load_file(file, tok, RowKind::Sft { mask_prompt: false }).unwrap()
    else {
        panic!("SFT rows expected");
    };
    let fwd = TrainForward {
        decoder: &model.decoder,
        checkpoint_from: None,
    };
    let (mut total, mut count) = (0.0f64, 0usize);
    for row in &rows {
        let batch = pad_sft(&[row], 2048);
        let (loss, n) = sft_loss(&fwd, &batch, 512, false).unwrap();
        total += loss.item_cast::<f32>() as f64 * n as f64;
        count += n;
    }
    total / count as f64
}

fn adapted(dir: &Path, adapter: &Path) -> Model {
    let mut m = Model::load(dir).unwrap();
    adapters::apply(&mut m, adapter).unwrap();
    m
}

#[test]
fn sft_losses_match_mlx_lm_and_adapters_load_both_ways() {
    let Some(py) = oracle_python() else {
        return;
    };
    let dir = model_dir();
    let data = repo_root().join("tests/data/sft-parity");
    let work = tempfile::tempdir().unwrap();
    let init = work.path().join("init.safetensors");
    let ours = work.path().join("ours");
    let theirs = work.path().join("theirs");
    let base = Model::load(&dir).unwrap();
    write_random_adapter(&base, &init);

    let out = run_ok(&[
        "train",
        "--data",
        data.to_str().unwrap(),
        "--iters",
        "2",
        "--batch-size",
        "2",
        "--num-layers",
        NUM_LAYERS,
        "--learning-rate",
        "1e-4",
        "--resume-adapter-file",
        init.to_str().unwrap(),
        "--adapter-path",
        ours.to_str().unwrap(),
        "--json",
        "--no-db",
    ]);
    let our_losses: Vec<f64> = json_lines(&out.stdout)
        .iter()
        .filter(|l| l["event"] == "step")
        .map(|l| l["loss"].as_f64().unwrap())
        .collect();

    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/lora_reference.py"))
        .args(["train", "--model"])
        .arg(&dir)
        .arg("--data")
        .arg(&data)
        .arg("--init")
        .arg(&init)
        .arg("--adapter-path")
        .arg(&theirs)
        .args([
            "--iters",
            "2",
            "--batch-size",
            "2",
            "--num-layers",
            NUM_LAYERS,
        ])
        .args(["--learning-rate", "1e-4", "--eval-adapters"])
        .arg(&ours)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "lora_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = json_lines(&out.stdout).pop().expect("reference output");
    let their_losses: Vec<f64> = reference["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    eprintln!("losses: ours {our_losses:?}, mlx-lm {their_losses:?}");
    assert_eq!(our_losses.len(), 2);
    assert_eq!(their_losses.len(), 2);
    // Step 1 is the same forward pass; step 2 adds one Adam update, whose
    // per-element step ~lr·sign(g) can amplify float reassociation noise.
    for (i, (a, b)) in our_losses.iter().zip(&their_losses).enumerate() {
        let tol = if i == 0 { 1e-5 } else { 1e-4 } * b.abs();
        assert!(
            (a - b).abs() <= tol,
            "step {}: ours {a} vs mlx-lm {b}",
            i + 1
        );
    }
    assert!(
        our_losses[1] < our_losses[0],
        "training did not lower the loss"
    );

    // mlx-lm loaded our adapter; we load mlx-lm's. Both evaluate the same.
    let tok = Tokenizer::load(&dir).unwrap();
    let rows = data.join("train.jsonl");
    let evals = &reference["eval"];
    let mlx_on_ours = evals[ours.to_str().unwrap()]
        .as_f64()
        .expect("mlx-lm eval of ours");
    let mlx_on_theirs = evals[theirs.to_str().unwrap()]
        .as_f64()
        .expect("mlx-lm eval of theirs");
    let ours_on_ours = mean_loss(&adapted(&dir, &ours), &tok, &rows);
    let ours_on_theirs = mean_loss(&adapted(&dir, &theirs), &tok, &rows);
    eprintln!(
        "eval of our adapter: mlx-lm {mlx_on_ours}, ours {ours_on_ours}; of mlx-lm's: mlx-lm {mlx_on_theirs}, ours {ours_on_theirs}"
    );
    assert!((mlx_on_ours - ours_on_ours).abs() < 1e-5 * mlx_on_ours);
    assert!((mlx_on_theirs - ours_on_theirs).abs() < 1e-5 * mlx_on_theirs);
    // The two trained adapters are the same up to float noise.
    assert!((ours_on_ours - ours_on_theirs).abs() < 1e-3 * ours_on_ours);
    let base_loss = mean_loss(&base, &tok, &rows);
    assert!(
        (base_loss - ours_on_ours).abs() > 1e-2,
        "the adapter does not change the model"
    );
}

#[test]
fn fused_weights_reproduce_the_adapted_model() {
    let dir = model_dir();
    let work = tempfile::tempdir().unwrap();
    let adapter = work.path().join("adapter");
    let base = Model::load(&dir).unwrap();
    // An adapter directory: random weights, config written by a zero-step run.
    run_ok(&[
        "train",
        "--data",
        repo_root().join("tests/data/sft-parity").to_str().unwrap(),
        "--iters",
        "0",
        "--num-layers",
        NUM_LAYERS,
        "--batch-size",
        "2",
        "--adapter-path",
        adapter.to_str().unwrap(),
        "--no-db",
    ]);
    write_random_adapter(&base, &adapter.join("adapters.safetensors"));
    let tok = Tokenizer::load(&dir).unwrap();
    let rows = repo_root().join("tests/data/sft-parity/train.jsonl");
    let with_adapter = mean_loss(&adapted(&dir, &adapter), &tok, &rows);
    let base_loss = mean_loss(&base, &tok, &rows);
    assert!(
        (with_adapter - base_loss).abs() > 1e-2,
        "the adapter must matter"
    );

    let dense = work.path().join("dense");
    let requant = work.path().join("requant");
    for (out, extra) in [(&dense, Some("--dequantize")), (&requant, None)] {
        let mut args = vec![
            "train",
            "fuse",
            "--model",
            dir.to_str().unwrap(),
            "--adapter-path",
            adapter.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        run_ok(&args);
        assert!(out.join("tokenizer.json").is_file());
    }
    let dense_cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dense.join("config.json")).unwrap()).unwrap();
    assert!(dense_cfg.get("quantization").is_none());
    let requant_cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(requant.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(requant_cfg["quantization"]["bits"], 4);

    let dense_loss = mean_loss(&Model::load(&dense).unwrap(), &tok, &rows);
    let requant_loss = mean_loss(&Model::load(&requant).unwrap(), &tok, &rows);
    eprintln!(
        "base {base_loss}, adapter {with_adapter}, fused dense {dense_loss}, fused 4-bit {requant_loss}"
    );
    // Dense: the same function up to float reassociation.
    assert!((dense_loss - with_adapter).abs() < 1e-4 * with_adapter);
    // Re-quantized: the fused weights go through 4-bit rounding again, which
    // costs part of the adapter's effect (as in mlx-lm).
    assert!((requant_loss - with_adapter).abs() < 0.3 * (with_adapter - base_loss).abs());

    // mlx-lm's fuse of the same adapter writes the same tensors.
    let Some(py) = oracle_python() else {
        return;
    };
    let theirs = work.path().join("theirs");
    let out = Command::new(py)
        .args(["-m", "mlx_lm", "fuse", "--model"])
        .arg(&dir)
        .arg("--adapter-path")
        .arg(&adapter)
        .arg("--save-path")
        .arg(&theirs)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours_t = Array::load_safetensors(requant.join("model.safetensors")).unwrap();
    let theirs_t = Array::load_safetensors(theirs.join("model.safetensors")).unwrap();
    assert_eq!(ours_t.len(), theirs_t.len());
    for (name, a) in &ours_t {
        let b = &theirs_t[name];
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.dtype(), b.dtype(), "{name}");
        let a32 = a.as_dtype(mlx_rs::Dtype::Float32).unwrap();
        let b32 = b.as_dtype(mlx_rs::Dtype::Float32).unwrap();
        let diff = (&a32 - &b32)
            .abs()
            .unwrap()
            .max(None)
            .unwrap()
            .item_cast::<f32>();
        let scale = b32.abs().unwrap().max(None).unwrap().item_cast::<f32>();
        // Packed weights are identical; scales and biases may differ by an ulp.
        let tol = if a.dtype() == mlx_rs::Dtype::Uint32 {
            0.0
        } else {
            1e-6 * scale.max(1.0)
        };
        assert!(diff <= tol, "{name}: differs by {diff}");
    }
}
