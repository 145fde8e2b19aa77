//! Continuous batching of sliding-window models, on the tiny mlx-lm-made
//! checkpoints of `goldens/arch/` (window 5): every row's greedy tokens equal
//! mlx-lm's `BatchGenerator` (goldens of
//! `scripts/oracle/make_batch_sliding_goldens.py`, prompts longer than the
//! window and more new tokens than it holds) and our own serial decode, for
//! rows inserted together and rows joining while others decode. Also:
//! `--max-kv-size` rows (rotating caches keeping their first 4 positions)
//! batch like they decode alone, and a row's cache taken out of the batch
//! continues exactly as a serial cache does.

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
    let path = common::repo_root().join("goldens/batch_sliding.json");
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
                     with scripts/oracle/make_batch_sliding_goldens.py";
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

/// Caches for one sequence: the model's own, or bounded to `max_kv` positions.
fn caches(model: &Model, max_kv: Option<usize>) -> Vec<Box<dyn KvCache>> {
    match max_kv {
        Some(n) => model.decoder.make_caches_with(Some(n), None).unwrap(),
        None => model.make_caches(),
    }
}

fn serial(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    max_kv: Option<usize>,
) -> Vec<u32> {
    let mut caches = caches(model, max_kv);
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
    max_kv: Option<usize>,
}

fn run_batch<'a>(model: &'a Model, tok: &'a Tokenizer, s: &Scenario) -> Vec<Finished> {
    let opts = greedy(s.max_tokens);
    let mut sched = BatchScheduler::new(model, BatchLimits::default());
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
        let fresh = match s.max_kv {
            Some(_) => caches(model, s.max_kv),
            None => Vec::new(),
        };
        sched.insert(i as u64, row, fresh);
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

fn check_family(case: &str) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let gm = &g["models"][case];
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(case, Some(&gm["fingerprint"]), tmp.path());
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    assert!(model.supports_batching(), "{case}: windowed layers batch");
    // One cache per cache-keeping layer, as mlx-lm's batch holds them
    // (Gemma 4's KV-shared layers keep none).
    let kinds = gm["batch_caches"].as_array().unwrap();
    assert_eq!(model.make_caches().len(), kinds.len(), "{case}: caches");
    let window = gm["sliding_window"].as_u64().unwrap() as usize;
    let max_tokens = g["meta"]["max_tokens"].as_u64().unwrap() as usize;
    let prompts: Vec<Vec<u32>> = serde_json::from_value(g["meta"]["prompt_ids"].clone()).unwrap();
    assert!(prompts.iter().all(|p| p.len() > window) && max_tokens > window);

    let want_serial: Vec<Vec<u32>> = serde_json::from_value(gm["serial_tokens"].clone()).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let ours = serial(&model, &tok, p, max_tokens, None);
        assert_eq!(
            ours, want_serial[i],
            "{case}: serial prompt {i} differs from mlx-lm"
        );
    }
    for (name, sc) in gm["scenarios"].as_object().unwrap() {
        let scenario = Scenario {
            prompts: &prompts,
            first: ids(&sc["first"]),
            later: ids(&sc["later"]),
            join_after: sc["join_after_steps"].as_u64().unwrap_or(0) as usize,
            max_tokens,
            max_kv: None,
        };
        let finished = run_batch(&model, &tok, &scenario);
        let want = sc["tokens"].as_object().unwrap();
        assert_eq!(finished.len(), want.len(), "{case}/{name}: rows finished");
        for f in finished {
            let i = f.id as usize;
            let expected: Vec<u32> = serde_json::from_value(want[&i.to_string()].clone()).unwrap();
            assert_eq!(
                f.result.token_ids, expected,
                "{case}/{name}: row {i} differs from mlx-lm's BatchGenerator"
            );
            assert_eq!(
                f.result.token_ids, want_serial[i],
                "{case}/{name}: row {i} differs from serial decoding"
            );
        }
    }
}

#[test]
fn gemma3_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("gemma3_text");
}

#[test]
fn gpt_oss_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("gpt_oss");
}

/// Gemma 4: the KV-shared layers attend over the rows of the earlier
/// windowed and global layers' batch caches.
#[test]
fn gemma4_rows_match_mlx_lm_batch_generator_and_serial() {
    check_family("gemma4_text");
}

const PROMPTS: [&[u32]; 4] = [
    &[1, 17, 42, 99, 3, 250, 7, 7, 128, 31, 4],
    &[
        64, 5, 200, 9, 11, 31, 4, 77, 160, 2, 90, 13, 54, 201, 6, 19, 44,
    ],
    &[8, 16, 32, 64, 128, 255, 1],
    &[
        5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100,
    ],
];

/// `--max-kv-size 8`: dense layers rotate too, keeping their first 4
/// positions; rows of a batch (together and joining late) decode as alone.
#[test]
fn max_kv_size_rows_match_serial() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| p.to_vec()).collect();
    let max_tokens = 20;
    for case in ["llama", "gemma3_text"] {
        let dir = checkpoint(case, None, tmp.path());
        let model = Model::load(&dir).unwrap();
        let tok = Tokenizer::load(&dir).unwrap();
        let kinds: Vec<(Option<usize>, usize)> = caches(&model, Some(8))
            .iter()
            .map(|c| (c.max_size(), c.keep()))
            .collect();
        assert!(kinds.contains(&(Some(8), 4)), "{case}: {kinds:?}");
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| serial(&model, &tok, p, max_tokens, Some(8)))
            .collect();
        let scenario = Scenario {
            prompts: &prompts,
            first: vec![1, 2],
            later: vec![0, 3],
            join_after: 5,
            max_tokens,
            max_kv: Some(8),
        };
        let finished = run_batch(&model, &tok, &scenario);
        assert_eq!(finished.len(), 4, "{case}: rows finished");
        for f in finished {
            let i = f.id as usize;
            assert_eq!(
                f.result.token_ids, want[i],
                "{case}: --max-kv-size row {i} differs from serial decoding"
            );
        }
    }
}

/// A row's caches taken out of the batch (what the prompt cache stores)
/// continue a longer prompt exactly as the caches of the same row decoded
/// alone.
#[test]
fn extracted_caches_continue_like_serial_ones() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint("gemma3_text", None, tmp.path());
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| p.to_vec()).collect();
    let continue_from = |caches: &mut Vec<Box<dyn KvCache>>, held: &[u32]| -> Vec<u32> {
        let mut next = held.to_vec();
        next.extend([3, 141, 59]);
        let opts = greedy(12);
        generate(
            &model,
            &tok,
            caches,
            Prompt::continuing(&next, held.len()),
            &opts,
            None,
            &mut |_| true,
        )
        .unwrap()
        .token_ids
    };
    for max_kv in [None, Some(8)] {
        let scenario = Scenario {
            prompts: &prompts,
            first: vec![0, 1, 3],
            later: vec![],
            join_after: 0,
            max_tokens: 9,
            max_kv,
        };
        for f in run_batch(&model, &tok, &scenario) {
            let i = f.id as usize;
            let mut alone = caches(&model, max_kv);
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
            assert_eq!(held[..fed], first.cache_tokens, "row {i} ({max_kv:?})");
            prefill(&model, &mut alone, &held[fed..], 1).unwrap();
            let mut from_batch = f.caches;
            assert_eq!(
                continue_from(&mut from_batch, &held),
                continue_from(&mut alone, &held),
                "row {i} ({max_kv:?}): a cache from the batch continues differently"
            );
        }
    }
}
