//! Decode steps through compiled layer pieces (`MLX_BUN_COMPILE_STEP=1`,
//! the default on a GPU) give mlx-lm's logits: the tiny checkpoints of
//! `goldens/arch/` whose layers the pieces cover, prefilled and then decoded
//! one token per step and four tokens per step (a speculative verify), each
//! against mlx-lm's cached-step logits.
//!
//! This process installs settings with compiled steps on, on the CPU.

mod common;

use std::sync::Once;

use mlx_bun::model::Model;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::ops::{abs, concatenate};
use mlx_rs::Array;

/// Pre-norm attention layers with dense MLPs (plain, q/k norms, NoPE
/// layers, sliding windows, position-scaled queries, gated attention
/// outputs, 4-bit weights).
const CASES: [&str; 12] = [
    "llama",
    "llama_q4",
    "llama_sliding",
    "mistral",
    "qwen2",
    "qwen3",
    "smollm3",
    "smollm3_q4",
    "ministral3",
    "seed_oss",
    "qwen3_5",
    "qwen3_next",
];

fn compiled_steps_on() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut settings = mlx_bun::settings::Settings::from_env().unwrap();
        settings.compile_step = Some(true);
        mlx_bun::settings::install(settings).unwrap();
    });
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    abs(&(a - b)).unwrap().max(None).unwrap().item_cast::<f32>()
}

/// Logits of positions 7.. after prefilling 8 tokens, then `per_step`
/// tokens per forward pass.
fn stepped_logits(model: &Model, ids: &Array, per_step: i32) -> Array {
    let n = ids.shape()[1];
    let mut caches = model.make_caches();
    let mut steps = vec![model
        .forward(&ids.index((.., ..8)), &mut caches)
        .unwrap()
        .index((0, 7..8, ..))];
    let mut i = 8;
    while i < n {
        let end = (i + per_step).min(n);
        steps.push(
            model
                .forward(&ids.index((.., i..end)), &mut caches)
                .unwrap()
                .index((0, .., ..)),
        );
        i = end;
    }
    concatenate(&steps, 0).unwrap()
}

#[test]
fn compiled_steps_give_mlx_lm_logits() {
    compiled_steps_on();
    for case in CASES {
        let dir = common::repo_root().join("goldens/arch").join(case);
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        let expected = Array::load_safetensors(dir.join("expected.safetensors")).unwrap();
        let n = expected["tokens"].shape()[0];
        let ids = expected["tokens"].reshape(&[1, n]).unwrap();
        for per_step in [1, 4] {
            let before = mlx_bun::model::compiled::layer_steps();
            let logits = stepped_logits(&model, &ids, per_step);
            let compiled = mlx_bun::model::compiled::layer_steps() - before;
            assert!(
                compiled > 0,
                "{case}: no layer step went through the compiled pieces"
            );
            let diff = max_abs_diff(&logits, &expected["incremental"]);
            assert!(
                diff < 1e-3,
                "{case}, {per_step} per step: logits differ from mlx-lm's by {diff}"
            );
            let ours: Vec<u32> = argmax_axis(&logits, -1, None).unwrap().as_slice().to_vec();
            let theirs: Vec<u32> = argmax_axis(&expected["incremental"], -1, None)
                .unwrap()
                .as_slice()
                .to_vec();
            assert_eq!(
                ours, theirs,
                "{case}, {per_step} per step: greedy tokens differ"
            );
            eprintln!("{case}, {per_step} per step: {compiled} compiled layer steps, max difference {diff:.1e}");
        }
    }
}

/// The default model decodes the same greedy tokens with and without
/// compiled steps (each run in its own process: the setting is per process).
#[test]
fn default_model_tokens_do_not_change() {
    // Installed before the default model is prepared (which reads the
    // settings), so the other test finds them installed whichever runs first.
    compiled_steps_on();
    let model = common::model_dir();
    let run = |compile: &str| -> serde_json::Value {
        let out = common::output_ok(
            common::bin()
                .env("MLX_BUN_COMPILE_STEP", compile)
                .args(["generate", "-m"])
                .arg(&model)
                .args(["--prompt", "Write a haiku about the sea.", "-n", "48"])
                .args(["--temp", "0", "--json"]),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim().lines().last().unwrap()).unwrap()
    };
    let (off, on) = (run("0"), run("1"));
    let ids = |v: &serde_json::Value| v["token_ids"].as_array().unwrap().clone();
    assert!(ids(&off).len() >= 30, "{off}");
    assert_eq!(ids(&off), ids(&on));
}
