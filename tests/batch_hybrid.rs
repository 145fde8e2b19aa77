//! Continuous batching of hybrid models (gated DeltaNet or short-convolution
//! layers keeping a recurrent state beside attention layers), on the tiny
//! mlx-lm-made checkpoints of `goldens/arch/`: every row's greedy tokens
//! equal mlx-lm's `BatchGenerator` (goldens of
//! `scripts/oracle/make_batch_hybrid_goldens.py`, whose state layers hold
//! `ArraysCache`) and our own serial decode, for rows of uneven lengths
//! inserted together and rows joining while others decode. Also: the same
//! rows prefilled in chunks smaller than the prompts, the 4-bit MoE
//! checkpoints (which mlx-lm's CPU build cannot run: `gather_qmm` rejects
//! its arguments) against our serial decode, and a row's caches taken out of
//! the batch continuing exactly as serial ones.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mlx_bun::cache::KvCache;
use mlx_bun::decode::generate;
use mlx_bun::decode::{BatchLimits, BatchScheduler, Finished, Row};
use mlx_bun::generate::{prefill, GenerateOptions, Prompt};
use mlx_bun::model::Model;
use mlx_bun::tokenizer::Tokenizer;
use serde_json::Value;

/// MLX work in one process runs one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn goldens() -> Value {
    let path = common::repo_root().join("goldens/batch_hybrid.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn sha256_file(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("running sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A copy of a tiny checkpoint with a word-level tokenizer over its 256 ids,
/// checked to be the one the goldens were made from.
fn checkpoint(case: &str, fingerprint: Option<&Value>, tmp: &Path) -> PathBuf {
    let src = common::repo_root().join("goldens/arch").join(case);
    if let Some(fp) = fingerprint {
        let stale = "differs from the checkpoint the goldens were made from; regenerate them \
                     with scripts/oracle/make_batch_hybrid_goldens.py";
        let config = src.join("config.json");
        assert_eq!(
            sha256_file(&config),
            fp["config_sha256"].as_str().unwrap(),
            "{} {stale}",
            config.display()
        );
        for (name, want) in fp["weights_sha256"].as_object().unwrap() {
            let file = src.join(name);
            assert_eq!(
                sha256_file(&file),
                want.as_str().unwrap(),
                "{} {stale}",
                file.display()
            );
        }
    }
    common::arch_with_tokenizer(case, tmp)
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

fn serial(model: &Model, tok: &Tokenizer, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut caches = model.make_caches();
    let result = generate(
        model,
        tok,
        &mut caches,
        prompt,
        &greedy(n),
        None,
        &mut |_| true,
    );
    result.unwrap().token_ids
}

/// A batch run: rows `first` inserted together, then (after `join_after`
/// scheduler steps, while they decode) rows `later`. Returns every row as it
/// left the batch.
struct Scenario<'p> {
    prompts: &'p [Vec<u32>],
    first: Vec<usize>,
    later: Vec<usize>,
    join_after: usize,
    max_tokens: usize,
    /// Prefill chunk per row and step (`None`: the default).
    prefill_step: Option<usize>,
}

fn run_batch<'a>(model: &'a Model, tok: &'a Tokenizer, s: &Scenario) -> Vec<Finished> {
    let opts = greedy(s.max_tokens);
    let mut limits = BatchLimits::default();
    if let Some(n) = s.prefill_step {
        limits.prefill_step = n;
    }
    let mut sched = BatchScheduler::new(model, limits);
    let insert = |sched: &mut BatchScheduler<'a>, i: usize| {
        let row = Row::new(
            model,
            tok,
            s.prompts[i].clone(),
            0,
            &opts,
            None,
            Box::new(|_| true),
        )
        .unwrap();
        sched.insert(i as u64, row, Vec::new());
    };
    for &i in &s.first {
        insert(&mut sched, i);
    }
    let mut finished = Vec::new();
    let mut joined = s.later.is_empty();
    let mut steps = 0;
    while !sched.is_idle() || !joined {
        if !joined && steps == s.join_after {
            assert!(
                sched.decoding() > 0,
                "the later rows must join while others decode"
            );
            for &i in &s.later {
                insert(&mut sched, i);
            }
            joined = true;
        }
        finished.extend(sched.step().unwrap());
        steps += 1;
    }
    finished
}

fn ids(v: &Value) -> Vec<usize> {
    serde_json::from_value(v.clone()).unwrap()
}

fn prompts(g: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(g["meta"]["prompt_ids"].clone()).unwrap()
}

/// The batch cache class of every layer, in mlx-lm's names.
fn batch_kinds(model: &Model) -> Vec<String> {
    model
        .make_caches()
        .iter()
        .map(|c| c.empty_batch().expect("a batch layout").kind().to_string())
        .collect()
}

fn check_family(case: &str) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let gm = &g["models"][case];
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(case, Some(&gm["fingerprint"]), tmp.path());
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    assert!(model.supports_batching(), "{case}: state layers batch");
    let want_kinds: Vec<String> = serde_json::from_value(gm["batch_caches"].clone()).unwrap();
    assert!(want_kinds.iter().any(|k| k == "ArraysCache"), "{case}");
    assert_eq!(batch_kinds(&model), want_kinds, "{case}: batch caches");
    let max_tokens = g["meta"]["max_tokens"].as_u64().unwrap() as usize;
    let prompts = prompts(&g);

    let want_serial: Vec<Vec<u32>> = serde_json::from_value(gm["serial_tokens"].clone()).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let ours = serial(&model, &tok, p, max_tokens);
        assert_eq!(
            ours, want_serial[i],
            "{case}: serial prompt {i} differs from mlx-lm"
        );
    }
    for (name, sc) in gm["scenarios"].as_object().unwrap() {
        // Default chunks (whole prompts, as mlx-lm), and chunks of 4 tokens:
        // a state carried across chunks, joiners prefilling over several
        // steps while the batch decodes.
        for prefill_step in [None, Some(4)] {
            let scenario = Scenario {
                prompts: &prompts,
                first: ids(&sc["first"]),
                later: ids(&sc["later"]),
                join_after: sc["join_after_steps"].as_u64().unwrap_or(0) as usize,
                max_tokens,
                prefill_step,
            };
            let finished = run_batch(&model, &tok, &scenario);
            let want = sc["tokens"].as_object().unwrap();
            assert_eq!(
                finished.len(),
                want.len(),
                "{case}/{name} ({prefill_step:?}): rows finished"
            );
            for f in finished {
                let i = f.id as usize;
                let expected: Vec<u32> =
                    serde_json::from_value(want[&i.to_string()].clone()).unwrap();
                assert_eq!(
                    f.result.token_ids, expected,
                    "{case}/{name} ({prefill_step:?}): row {i} differs from mlx-lm's \
                     BatchGenerator"
                );
                assert_eq!(
                    f.result.token_ids, want_serial[i],
                    "{case}/{name} ({prefill_step:?}): row {i} differs from serial decoding"
                );
            }
        }
    }
}

#[test]
fn qwen3_next_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("qwen3_next");
}

#[test]
fn qwen3_5_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("qwen3_5");
}

#[test]
fn qwen3_5_q4_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("qwen3_5_q4");
}

#[test]
fn qwen3_5_moe_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("qwen3_5_moe");
}

#[test]
fn lfm2_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("lfm2");
}

#[test]
fn lfm2_q4_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("lfm2_q4");
}

/// Granite 4: Mamba-2 layers given the rows' lengths in mlx-lm, so its
/// `BatchGenerator` rows equal its serial ones (experts and shared MLP; the
/// dense-MLP variant with RoPE).
#[test]
fn granitemoehybrid_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("granitemoehybrid");
}

#[test]
fn granitemoehybrid_dense_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("granitemoehybrid_dense");
}

/// Nemotron-H (Mamba-2 layers, MLP and experts layers keeping no cache): our serial
/// tokens are mlx-lm's (`generate_step`), and rows inserted together,
/// joining late and prefilled in chunks decode as they do alone. mlx-lm's
/// `BatchGenerator` is no reference here: it right-pads the prompts of rows
/// inserted together and its Mamba-2 scan, not given their lengths, leaves
/// a zero state in the shorter rows (the goldens' `nemotron_h_q4` batch
/// tokens of those rows are not its serial ones).
#[test]
fn nemotron_h_rows_match_mlx_lm_serial_and_our_serial() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let prompts = prompts(&g);
    let max_tokens = g["meta"]["max_tokens"].as_u64().unwrap() as usize;
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        "nemotron_h",
        "nemotron_h_q4",
        "nemotron_h_moe",
        "nemotron_h_moe_latent",
    ];
    for case in cases {
        let gm = &g["models"][case];
        let dir = checkpoint(case, Some(&gm["fingerprint"]), tmp.path());
        let model = Model::load(&dir).unwrap();
        let tok = Tokenizer::load(&dir).unwrap();
        assert!(model.supports_batching(), "{case}");
        let want_kinds: Vec<String> = serde_json::from_value(gm["batch_caches"].clone()).unwrap();
        assert_eq!(batch_kinds(&model), want_kinds, "{case}: batch caches");
        let want: Vec<Vec<u32>> = serde_json::from_value(gm["serial_tokens"].clone()).unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let ours = serial(&model, &tok, p, max_tokens);
            assert_eq!(
                ours, want[i],
                "{case}: serial prompt {i} differs from mlx-lm"
            );
        }
        for (name, sc) in gm["scenarios"].as_object().unwrap() {
            for prefill_step in [None, Some(4)] {
                let scenario = Scenario {
                    prompts: &prompts,
                    first: ids(&sc["first"]),
                    later: ids(&sc["later"]),
                    join_after: sc["join_after_steps"].as_u64().unwrap_or(0) as usize,
                    max_tokens,
                    prefill_step,
                };
                let finished = run_batch(&model, &tok, &scenario);
                assert_eq!(
                    finished.len(),
                    sc["tokens"].as_object().unwrap().len(),
                    "{case}/{name} ({prefill_step:?}): rows finished"
                );
                for f in finished {
                    let i = f.id as usize;
                    assert_eq!(
                        f.result.token_ids, want[i],
                        "{case}/{name} ({prefill_step:?}): row {i} differs from serial decoding"
                    );
                }
            }
        }
    }
}

/// The 4-bit MoE checkpoints, which mlx-lm's CPU build cannot run: rows
/// inserted together and joining late decode as they do alone.
#[test]
fn quantized_moe_rows_match_serial() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let prompts = prompts(&g);
    let max_tokens = g["meta"]["max_tokens"].as_u64().unwrap() as usize;
    let tmp = tempfile::tempdir().unwrap();
    for case in [
        "qwen3_next_q4",
        "qwen3_5_moe_q4",
        "granitemoehybrid_q4",
        "nemotron_h_moe_q4",
    ] {
        let dir = checkpoint(case, None, tmp.path());
        let model = Model::load(&dir).unwrap();
        let tok = Tokenizer::load(&dir).unwrap();
        assert!(model.supports_batching(), "{case}");
        assert!(
            batch_kinds(&model).iter().any(|k| k == "ArraysCache"),
            "{case}"
        );
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| serial(&model, &tok, p, max_tokens))
            .collect();
        for (first, later) in [(vec![2, 0, 3, 1], vec![]), (vec![2, 1], vec![0, 3])] {
            let scenario = Scenario {
                prompts: &prompts,
                first,
                later,
                join_after: 6,
                max_tokens,
                prefill_step: None,
            };
            let finished = run_batch(&model, &tok, &scenario);
            assert_eq!(finished.len(), 4, "{case}: rows finished");
            for f in finished {
                let i = f.id as usize;
                assert_eq!(
                    f.result.token_ids, want[i],
                    "{case}: row {i} differs from serial decoding"
                );
            }
        }
    }
}

/// A row's caches taken out of the batch (what the prompt cache stores:
/// recurrent or convolution states beside the attention caches) continue a
/// longer prompt exactly as the caches of the same row decoded alone.
#[test]
fn extracted_caches_continue_like_serial_ones() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let prompts = prompts(&g);
    let tmp = tempfile::tempdir().unwrap();
    for case in ["qwen3_next", "lfm2", "nemotron_h"] {
        let dir = checkpoint(case, None, tmp.path());
        let model = Model::load(&dir).unwrap();
        let tok = Tokenizer::load(&dir).unwrap();
        let continue_from = |caches: &mut Vec<Box<dyn KvCache>>, held: &[u32]| -> Vec<u32> {
            let mut next = held.to_vec();
            next.extend([3, 141, 59]);
            generate(
                &model,
                &tok,
                caches,
                Prompt::continuing(&next, held.len()),
                &greedy(12),
                None,
                &mut |_| true,
            )
            .unwrap()
            .token_ids
        };
        let scenario = Scenario {
            prompts: &prompts,
            first: vec![0, 1],
            later: vec![3],
            join_after: 3,
            max_tokens: 9,
            prefill_step: None,
        };
        for f in run_batch(&model, &tok, &scenario) {
            let i = f.id as usize;
            let mut alone = model.make_caches();
            let first = generate(
                &model,
                &tok,
                &mut alone,
                &prompts[i],
                &greedy(9),
                None,
                &mut |_| true,
            )
            .unwrap();
            // A batch row's cache also holds its last emitted token, which
            // serial decoding has not fed yet: feed it alone.
            let held = f.result.cache_tokens;
            let fed = first.cache_tokens.len();
            assert_eq!(held[..fed], first.cache_tokens, "{case}: row {i}");
            prefill(&model, &mut alone, &held[fed..], 1).unwrap();
            let mut from_batch = f.caches;
            assert_eq!(
                continue_from(&mut from_batch, &held),
                continue_from(&mut alone, &held),
                "{case}: row {i}: a cache from the batch continues differently"
            );
        }
    }
}
