//! DWQ (`train --method dwq`): the first steps equal mlx-lm's `dwq_quantize`
//! on the same teacher targets, and the two-phase command writes a
//! quantized model folder that mlx-lm loads.

mod common;

use std::process::Command;

use common::{float32_model, oracle_python, repo_root, run_ok};
use mlx_bun::eval::perplexity::{encode_document, eos_id};
use mlx_bun::model::Model;
use mlx_bun::quant::QuantSpec;
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::config::{OptimizerKind, OptimizerSettings};
use mlx_bun::train::dwq::{
    dwq_loss, epoch_batches, loss_and_grads, quantize_folder, read_params, read_targets,
    trainable_tensors, write_targets,
};
use mlx_bun::train::optimizer::{Optimizer, Schedule};
use mlx_rs::transforms::eval;

const TOP_K: usize = 64;
const LR: f64 = 1e-4;

fn rows(tok: &Tokenizer) -> Vec<Vec<i32>> {
    let eos = eos_id(tok).unwrap();
    let text = std::fs::read_to_string(repo_root().join("tests/data/eval/dwq.jsonl")).unwrap();
    text.lines()
        .take(4)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let mut ids = encode_document(tok, eos, v["text"].as_str().unwrap()).unwrap();
            ids.truncate(20);
            ids
        })
        .collect()
}

#[test]
fn first_steps_match_mlx_lm_dwq() {
    let Some(py) = oracle_python() else {
        return;
    };
    let teacher_dir = float32_model();
    let work = tempfile::tempdir().unwrap();
    let targets = work.path().join("targets");
    let tok = Tokenizer::load(&teacher_dir).unwrap();
    let rows = rows(&tok);
    let batches = epoch_batches(&rows, rows.len(), 123).unwrap();
    assert_eq!(batches.len(), 1);
    {
        let teacher = Model::load(&teacher_dir).unwrap();
        for split in ["valid", "train"] {
            write_targets(&teacher, &batches, &targets, split, TOP_K, &mut |_| Ok(())).unwrap();
        }
    }
    let student_dir = work.path().join("student");
    quantize_folder(&teacher_dir, &student_dir, QuantSpec::affine(64, 4)).unwrap();
    let student = Model::load(&student_dir).unwrap();
    let sites = trainable_tensors(&student);
    // Scales and biases of every linear layer and the (tied) embedding, all
    // 4-bit, and the 61 norm weights: the 483 arrays mlx-lm trains.
    assert_eq!(sites.len(), 2 * (30 * 7 + 1) + 61);
    let params = read_params(&student, &sites).unwrap();
    let batch = &batches[0];
    let valid = read_targets(&targets, "valid", 0, batch).unwrap();
    let train = read_targets(&targets, "train", 0, batch).unwrap();

    let (initial, _) = dwq_loss(&student, &sites, &params, batch, &valid, 2.0).unwrap();
    let (step, _, grads) = loss_and_grads(&student, &sites, &params, batch, &train, 2.0).unwrap();
    let mut opt = Optimizer::new(
        OptimizerKind::Adam,
        &OptimizerSettings {
            bias_correction: Some(true),
            ..Default::default()
        },
        Schedule::Constant(LR),
    );
    let params = opt.update(&params, &grads).unwrap();
    let (last, _) = dwq_loss(&student, &sites, &params, batch, &valid, 2.0).unwrap();
    eval([&initial, &step, &last]).unwrap();
    let ours = [
        initial.item_cast::<f32>() as f64,
        step.item_cast::<f32>() as f64,
        last.item_cast::<f32>() as f64,
    ];

    let rows_file = work.path().join("rows.json");
    std::fs::write(&rows_file, serde_json::to_string(&rows).unwrap()).unwrap();
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/dwq_reference.py"))
        .arg("--model")
        .arg(&teacher_dir)
        .arg("--rows")
        .arg(&rows_file)
        .arg("--target-dir")
        .arg(&targets)
        .args(["--learning-rate", &LR.to_string()])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dwq_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = json_lines(&out.stdout).pop().unwrap_or_else(|| {
        panic!(
            "no JSON from dwq_reference.py: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let theirs = [
        r["initial_valid_loss"].as_f64().unwrap(),
        r["step_losses"][0].as_f64().unwrap(),
        r["final_valid_loss"].as_f64().unwrap(),
    ];
    eprintln!("ours {ours:?}, mlx-lm {theirs:?}");
    // Before any update the same computation; after one Adam step (which
    // moves every trained element by about lr) still the same to 1e-4.
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        let tol = 1e-4;
        assert!(
            (a - b).abs() <= tol * b.abs(),
            "value {i}: ours {a} vs mlx-lm {b}"
        );
    }
    // The update moved the student toward the teacher.
    assert!(ours[2] < ours[0], "{ours:?}");
}

fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn dwq_args<'a>(teacher: &'a str, data: &'a str, targets: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "--method",
        "dwq",
        "--model",
        teacher,
        "--data",
        data,
        "--num-samples",
        "4",
        "--num-valid-samples",
        "2",
        "--batch-size",
        "2",
        "--max-seq-length",
        "24",
        "--top-k",
        "64",
        "--target-dir",
        targets,
    ]
}

#[test]
fn two_phase_dwq_writes_a_model_mlx_lm_loads() {
    let Some(py) = oracle_python() else {
        return;
    };
    let teacher = float32_model();
    let work = tempfile::tempdir().unwrap();
    let data = repo_root().join("tests/data/eval/dwq.jsonl");
    let targets = work.path().join("targets");
    let out_dir = work.path().join("student");
    let db = work.path().join("evals.db");
    let (t, d, g) = (
        teacher.to_str().unwrap(),
        data.to_str().unwrap(),
        targets.to_str().unwrap(),
    );

    let mut phase1 = dwq_args(t, d, g);
    phase1.push("--targets-only");
    run_ok(&phase1);
    assert!(targets.join("train/0000000000.safetensors").is_file());
    assert!(targets.join("valid/0000000000.safetensors").is_file());
    assert!(!out_dir.exists());

    let mut phase2 = dwq_args(t, d, g);
    phase2.extend([
        "--mlx-path",
        out_dir.to_str().unwrap(),
        "--learning-rate",
        "1e-4",
        "--json",
        "--db",
        db.to_str().unwrap(),
    ]);
    let out = run_ok(&phase2);
    let lines = json_lines(&out.stdout);
    let done = lines
        .iter()
        .find(|l| l["event"] == "done")
        .expect("a summary");
    let (kl0, kl1) = (
        done["before"]["kl"].as_f64().unwrap(),
        done["after"]["kl"].as_f64().unwrap(),
    );
    let ppl1 = done["after"]["perplexity"].as_f64().unwrap();
    assert!(kl0 > 0.0 && kl1.is_finite() && ppl1 > 1.0, "{done}");
    assert_eq!(done["iters"], 2);
    assert_eq!(lines.iter().filter(|l| l["event"] == "step").count(), 2);

    // A normal quantized folder: mlx-bun and mlx-lm load it, and its
    // scales are the trained ones, not plain quantization's.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    let student = Model::load(&out_dir).unwrap();
    let plain_dir = work.path().join("plain");
    quantize_folder(&teacher, &plain_dir, QuantSpec::affine(64, 4)).unwrap();
    let plain = Model::load(&plain_dir).unwrap();
    let sites = trainable_tensors(&student);
    let (a, b) = (
        read_params(&student, &sites[2..3]).unwrap(),
        read_params(&plain, &sites[2..3]).unwrap(),
    );
    let diff = mlx_rs::ops::abs(&(&a[0] - &b[0]))
        .unwrap()
        .max(None)
        .unwrap();
    assert!(diff.item_cast::<f32>() > 0.0, "the scales were not trained");
    let loaded = Command::new(py)
        .args([
            "-c",
            "import sys; from mlx_lm import load; load(sys.argv[1]); print('ok')",
        ])
        .arg(&out_dir)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        loaded.status.success() && String::from_utf8_lossy(&loaded.stdout).contains("ok"),
        "mlx-lm could not load the DWQ model: {}",
        String::from_utf8_lossy(&loaded.stderr)
    );

    // Recorded in the eval DB with before/after metrics.
    let db = mlx_bun::evaldb::EvalDb::open(&db).unwrap();
    let runs = db.list(Some("dwq"), 10).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, "done");
    let names: Vec<String> = db
        .metrics(runs[0].id)
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert!(names.contains(&"kl_after".to_string()), "{names:?}");
}
