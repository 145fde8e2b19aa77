//! Continuous batching against mlx-lm's `BatchGenerator`: every row's greedy
//! tokens equal the goldens of `scripts/oracle/make_batch_goldens.py`, for
//! rows inserted together and rows that join while others decode, on the
//! 4-bit default model and a float32 copy of it. Also: grammar rows with
//! joins and evictions, seeded rows, and `generate --batch-file`.

mod common;

use std::path::PathBuf;
use std::sync::Mutex;

use mlx_bun::chat_template::Message;
use mlx_bun::decode::generate;
use mlx_bun::decode::{BatchLimits, BatchScheduler, ConstraintSlot, Row};
use mlx_bun::generate::{GenerateOptions, GenerationResult};
use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::model::Model;
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::sampling::SamplingParams;
use mlx_bun::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// MLX work in one process runs one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn goldens() -> Value {
    let path = common::repo_root().join("goldens/batch.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn sha256_file(path: &std::path::Path) -> String {
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

/// The goldens belong to exactly these weights.
fn check_fingerprint(dir: &std::path::Path, fp: &Value) {
    for (name, want) in fp["weights_sha256"].as_object().unwrap() {
        assert_eq!(
            sha256_file(&dir.join(name)),
            want.as_str().unwrap(),
            "{} differs from the model the batch goldens were made from; regenerate them \
             with scripts/oracle/make_batch_goldens.py",
            dir.join(name).display()
        );
    }
}

fn messages(goldens: &Value) -> Vec<Vec<Message>> {
    goldens["meta"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| serde_json::from_value(m.clone()).unwrap())
        .collect()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

fn row<'a>(model: &Model, tok: &'a Tokenizer, prompt: &[u32], opts: &GenerateOptions) -> Row<'a> {
    Row::new(
        model,
        tok,
        prompt.to_vec(),
        0,
        opts,
        None,
        Box::new(|_| true),
    )
    .unwrap()
}

/// Runs one golden scenario through the scheduler: the first rows, then
/// (after `join_after` steps, while they decode) the later ones.
fn run_scenario(
    model: &Model,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    scenario: &Value,
    max_tokens: usize,
) -> Vec<(usize, GenerationResult)> {
    let ids = |key: &str| -> Vec<usize> {
        scenario[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect()
    };
    let opts = greedy(max_tokens);
    let mut sched = BatchScheduler::new(model, BatchLimits::default());
    for i in ids("first") {
        sched.insert(i as u64, row(model, tok, &prompts[i], &opts), Vec::new());
    }
    let mut results = Vec::new();
    let later = ids("later");
    let join_after = scenario["join_after_steps"].as_u64().unwrap_or(0);
    let mut steps = 0;
    let mut joined = later.is_empty();
    while !sched.is_idle() || !joined {
        if !joined && steps == join_after {
            assert!(
                sched.decoding() > 0,
                "the later rows must join while others decode"
            );
            for &i in &later {
                sched.insert(i as u64, row(model, tok, &prompts[i], &opts), Vec::new());
            }
            joined = true;
        }
        for f in sched.step().unwrap() {
            results.push((f.id as usize, f.result));
        }
        steps += 1;
    }
    results
}

fn check_model(name: &str, dir: PathBuf) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let gm = &g["models"][name];
    check_fingerprint(&dir, &gm["fingerprint"]);
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let max_tokens = g["meta"]["max_tokens"].as_u64().unwrap() as usize;
    let prompts: Vec<Vec<u32>> = messages(&g)
        .into_iter()
        .map(|m| build_prompt(&tok, &PromptInput::Messages(m)).unwrap().1)
        .collect();
    let want_prompts: Vec<Vec<u32>> = serde_json::from_value(gm["prompt_ids"].clone()).unwrap();
    assert_eq!(prompts, want_prompts, "prompt ids differ from mlx-lm's");
    for (sname, scenario) in gm["scenarios"].as_object().unwrap() {
        let results = run_scenario(&model, &tok, &prompts, scenario, max_tokens);
        let want = scenario["tokens"].as_object().unwrap();
        assert_eq!(results.len(), want.len(), "{name}/{sname}: rows finished");
        for (i, result) in results {
            let expected: Vec<u32> = serde_json::from_value(want[&i.to_string()].clone()).unwrap();
            assert_eq!(
                result.token_ids, expected,
                "{name}/{sname}: row {i} differs from mlx-lm's BatchGenerator"
            );
        }
    }
}

#[test]
fn q4_rows_match_mlx_lm_batch_generator() {
    check_model("q4", common::model_dir());
}

#[test]
fn float32_rows_match_mlx_lm_batch_generator() {
    check_model("f32", common::float32_model());
}

fn schema_case(i: usize) -> (Value, &'static str) {
    match i % 4 {
        0 => (
            json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                   "required": ["color"], "additionalProperties": false}),
            "Pick a color for the sky. Answer in JSON.",
        ),
        1 => (
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["n"], "additionalProperties": false}),
            "How many legs does a spider have? Answer in JSON.",
        ),
        2 => (
            json!({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3}),
            "Give two true/false values as a JSON array.",
        ),
        _ => (
            json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                   "ok": {"type": "boolean"}}, "required": ["name", "ok"], "additionalProperties": false}),
            "Give a short name and a flag as JSON.",
        ),
    }
}

#[test]
fn four_schemas_in_one_batch_with_joins_and_evictions_all_validate() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let engine = GrammarEngine::new(&tok).unwrap();
    let mut sched = BatchScheduler::new(
        &model,
        BatchLimits {
            decode_concurrency: 4,
            ..BatchLimits::default()
        },
    );
    // Six rows for four slots: two join when others leave; a plain row with
    // a small token limit is evicted early.
    let mut specs: Vec<(u64, usize, Option<Value>, &str)> =
        vec![(100, 3, None, "Tell me a story.")];
    for i in 0..5 {
        let (schema, q) = schema_case(i);
        specs.push((i as u64, 60, Some(schema), q));
    }
    for (id, max_tokens, schema, q) in specs {
        let (_, prompt) = build_prompt(
            &tok,
            &PromptInput::Text {
                text: q.to_string(),
                system: None,
                use_chat_template: true,
            },
        )
        .unwrap();
        let constraint = schema.map(|s| {
            ConstraintSlot::Owned(engine.constraint(&ConstraintSpec::JsonSchema(s)).unwrap())
        });
        let row = Row::new(
            &model,
            &tok,
            prompt,
            0,
            &greedy(max_tokens),
            constraint,
            Box::new(|_| true),
        )
        .unwrap();
        sched.insert(id, row, Vec::new());
    }
    let mut done = Vec::new();
    let mut max_rows = 0;
    while !sched.is_idle() {
        max_rows = max_rows.max(sched.decoding());
        done.extend(sched.step().unwrap());
    }
    assert!(max_rows <= 4, "the batch exceeded its decode concurrency");
    assert_eq!(done.len(), 6);
    assert_eq!(done[0].id, 100, "the short row leaves first");
    for f in done.iter().filter(|f| f.id != 100) {
        let (schema, _) = schema_case(f.id as usize);
        let value: Value = serde_json::from_str(&f.result.text)
            .unwrap_or_else(|e| panic!("row {} is not JSON ({e}): {:?}", f.id, f.result.text));
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(
            validator.is_valid(&value),
            "row {} does not validate: {}",
            f.id,
            f.result.text
        );
    }
}

#[test]
fn seeded_rows_batch_with_their_own_keys() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let (_, prompt) = build_prompt(
        &tok,
        &PromptInput::Text {
            text: "Write a word.".into(),
            system: None,
            use_chat_template: true,
        },
    )
    .unwrap();
    let seeded = |seed| GenerateOptions {
        max_tokens: 8,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        ..GenerateOptions::default()
    };
    let mut caches = model.make_caches();
    let alone = generate(
        &model,
        &tok,
        &mut caches,
        &prompt,
        &seeded(7),
        None,
        &mut |_| true,
    )
    .unwrap();
    let mut sched = BatchScheduler::new(&model, BatchLimits::default());
    for (id, seed) in [(0u64, 7u64), (1, 7), (2, 8)] {
        let row = Row::new(
            &model,
            &tok,
            prompt.clone(),
            0,
            &seeded(seed),
            None,
            Box::new(|_| true),
        )
        .unwrap();
        sched.insert(id, row, Vec::new());
    }
    let mut out = vec![Vec::new(); 3];
    while !sched.is_idle() {
        for f in sched.step().unwrap() {
            out[f.id as usize] = f.result.token_ids;
        }
    }
    assert_eq!(
        out[0], alone.token_ids,
        "a seeded row draws as it does alone"
    );
    assert_eq!(
        out[0], out[1],
        "the same seed gives the same tokens in one batch"
    );
}

#[test]
fn batch_file_prints_rows_in_input_order() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = goldens();
    let want = &g["models"]["q4"]["scenarios"]["b4"]["tokens"];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = messages(&g)
        .iter()
        .map(|m| serde_json::to_string(&json!({"messages": m})).unwrap())
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = common::run_ok(&[
        "generate",
        "--batch-file",
        file.to_str().unwrap(),
        "--json",
        "-n",
        &g["meta"]["max_tokens"].to_string(),
    ]);
    let rows: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["token_ids"], want[i.to_string()], "line {}", i + 1);
    }

    std::fs::write(&file, "{\"prompt\": \"hi\", \"bogus\": 1}\n").unwrap();
    let bad = common::bin()
        .args(["generate", "--batch-file", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("line 1"), "the error names the line: {err}");
}

/// `--kv-bits` reaches every row of a batch file: each row decodes as the
/// same prompt does alone with the same quantized cache, which differs from
/// the dense cache's tokens.
#[test]
fn batch_file_rows_use_the_quantized_kv_cache() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prompts = [
        "Name three rivers in Europe and one fact about each.",
        "Write a short story about a lighthouse keeper.",
        "Explain how a refrigerator works.",
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = prompts.iter().map(|p| json!(p).to_string()).collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let kv = ["--kv-bits", "4", "--quantized-kv-start", "0"];
    let tokens = |out: std::process::Output| -> Vec<Value> {
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["token_ids"].clone())
            .collect()
    };
    let batch = |extra: &[&str]| {
        let mut args = vec!["generate", "--batch-file", file.to_str().unwrap()];
        args.extend(["--json", "-n", "48"]);
        args.extend(extra);
        tokens(common::run_ok(&args))
    };
    let quantized = batch(&kv);
    let dense = batch(&[]);
    assert_eq!(quantized.len(), prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let mut args = vec!["generate", "-p", p, "--json", "-n", "48"];
        args.extend(kv);
        let alone = tokens(common::run_ok(&args));
        assert_eq!(
            quantized[i],
            alone[0],
            "row {} against the prompt alone",
            i + 1
        );
    }
    assert_ne!(
        quantized, dense,
        "4-bit keys and values change some row's tokens: the flag took effect"
    );
}
