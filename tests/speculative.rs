//! Speculative decoding against mlx-lm's own speculative path (goldens), and
//! equivalence to plain decoding where no oracle exists (n-gram drafting,
//! grammar + speculation).

mod common;

use std::sync::Mutex;

use mlx_bun::decode::{self, generate, ConstraintSlot, Row};
use mlx_bun::generate::{GenerateOptions, GenerationResult, TokenEvent};
use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::model::Model;
use mlx_bun::speculative::{ModelDrafter, NgramDrafter};
use mlx_bun::tokenizer::Tokenizer;
use serde_json::Value;

/// MLX work in one process runs one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn plain(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> GenerationResult {
    let mut caches = model.make_caches();
    generate(model, tok, &mut caches, prompt, opts, None, &mut |_| true).unwrap()
}

#[test]
fn two_model_speculation_matches_mlx_lm() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let goldens: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo_root().join("goldens/speculative.json")).unwrap(),
    )
    .unwrap();
    let target_dir = common::float32_model();
    let target = Model::load(&target_dir).unwrap();
    let tok = Tokenizer::load(&target_dir).unwrap();
    let draft = Model::load(&common::model_dir()).unwrap();
    for case in goldens["cases"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let expected: Vec<u32> = serde_json::from_value(case["tokens"].clone()).unwrap();
        let k = case["num_draft_tokens"].as_u64().unwrap() as usize;
        let opts = GenerateOptions {
            max_tokens: case["max_tokens"].as_u64().unwrap() as usize,
            ..GenerateOptions::default()
        };
        let mut drafter = ModelDrafter::new(&draft, &opts.sampling).unwrap();
        let mut caches = target.make_caches();
        let out = decode::run(
            &target,
            &mut caches,
            Row::new(
                &target,
                &tok,
                ids.to_vec(),
                0,
                &opts,
                None,
                Box::new(|_: &TokenEvent| true),
            )
            .unwrap()
            .with_drafter(Box::new(&mut drafter), k),
            opts.prefill_step,
        )
        .unwrap();
        assert_eq!(out.token_ids, expected, "tokens differ from mlx-lm (k={k})");
        let stats = out.speculation.unwrap();
        assert_eq!(
            stats.accepted,
            case["accepted"].as_u64().unwrap() as usize,
            "accepted draft tokens differ from mlx-lm (k={k})"
        );
        assert!(
            stats.target_calls < out.token_ids.len(),
            "no verification saved a call"
        );
    }
}

#[test]
fn ngram_drafting_equals_plain_greedy() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let text = "Repeat exactly: the red fox, the red fox, the red fox jumps.";
    let rendered = tok
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[mlx_bun::chat_template::Message::new("user", text)], true)
        .unwrap();
    let prompt = tok.encode(&rendered).unwrap();
    let opts = GenerateOptions {
        max_tokens: 20,
        ..GenerateOptions::default()
    };
    let reference = plain(&model, &tok, &prompt, &opts);
    for k in [1, 3] {
        let mut caches = model.make_caches();
        let out = decode::run(
            &model,
            &mut caches,
            Row::new(
                &model,
                &tok,
                prompt.to_vec(),
                0,
                &opts,
                None,
                Box::new(|_: &TokenEvent| true),
            )
            .unwrap()
            .with_drafter(Box::new(&mut NgramDrafter::default()), k),
            opts.prefill_step,
        )
        .unwrap();
        assert_eq!(
            out.token_ids, reference.token_ids,
            "n-gram speculation changed the output (k={k})"
        );
        assert_eq!(out.text, reference.text);
        let stats = out.speculation.unwrap();
        assert!(
            stats.drafted > 0 && stats.accepted > 0,
            "n-gram drafter never helped: {stats:?}"
        );
    }
}

#[test]
fn grammar_with_speculation_equals_grammar_alone() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let engine = GrammarEngine::new(&tok).unwrap();
    let schema: Value = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    });
    let spec = ConstraintSpec::JsonSchema(schema.clone());
    let validator = jsonschema::validator_for(&schema).unwrap();
    let prompts = [
        "Describe a person named Ana, 31, who likes chess, as JSON.",
        "Give me a JSON record of Bob, age 7, with tags.",
    ];
    for text in prompts {
        let rendered = tok
            .chat_template
            .as_ref()
            .unwrap()
            .render(&[mlx_bun::chat_template::Message::new("user", text)], true)
            .unwrap();
        let prompt = tok.encode(&rendered).unwrap();
        let opts = GenerateOptions {
            max_tokens: 80,
            ..GenerateOptions::default()
        };
        let mut alone_constraint = engine.constraint(&spec).unwrap();
        let mut caches = model.make_caches();
        let alone = generate(
            &model,
            &tok,
            &mut caches,
            &prompt,
            &opts,
            Some(alone_constraint.as_mut()),
            &mut |_| true,
        )
        .unwrap();
        for (name, drafter) in [("model", None), ("ngram", Some(NgramDrafter::default()))] {
            let mut constraint = engine.constraint(&spec).unwrap();
            let mut caches = model.make_caches();
            let out = match drafter {
                Some(mut ngram) => decode::run(
                    &model,
                    &mut caches,
                    Row::new(
                        &model,
                        &tok,
                        prompt.to_vec(),
                        0,
                        &opts,
                        Some(ConstraintSlot::Borrowed(constraint.as_mut())),
                        Box::new(|_: &TokenEvent| true),
                    )
                    .unwrap()
                    .with_drafter(Box::new(&mut ngram), 3),
                    opts.prefill_step,
                ),
                None => {
                    let mut drafter = ModelDrafter::new(&model, &opts.sampling).unwrap();
                    decode::run(
                        &model,
                        &mut caches,
                        Row::new(
                            &model,
                            &tok,
                            prompt.to_vec(),
                            0,
                            &opts,
                            Some(ConstraintSlot::Borrowed(constraint.as_mut())),
                            Box::new(|_: &TokenEvent| true),
                        )
                        .unwrap()
                        .with_drafter(Box::new(&mut drafter), 3),
                        opts.prefill_step,
                    )
                }
            }
            .unwrap();
            assert_eq!(
                out.token_ids, alone.token_ids,
                "{name} drafter: grammar+spec differs from grammar alone"
            );
            assert_eq!(out.finish_reason, alone.finish_reason);
            if name == "model" {
                // The model drafts for itself under the grammar: it proposes
                // what the target samples.
                let stats = out.speculation.unwrap();
                let acceptance = stats.accepted as f64 / stats.drafted.max(1) as f64;
                assert!(
                    acceptance >= 0.95,
                    "self-draft under a grammar accepted {acceptance:.2} ({stats:?})"
                );
            }
            let value: Value = serde_json::from_str(&out.text)
                .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {}", out.text));
            assert!(
                validator.is_valid(&value),
                "{name}: output violates the schema: {}",
                out.text
            );
        }
    }
}

#[test]
fn cli_reports_speculation_and_refuses_foreign_tokenizers() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = common::run_ok(&[
        "generate",
        "--prompt",
        "Say: one two three, one two three.",
        "--draft-model",
        "ngram",
        "--num-draft-tokens",
        "2",
        "-n",
        "12",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let spec = &v["speculation"];
    assert!(spec["target_calls"].as_u64().unwrap() >= 1);
    assert!(spec["drafted"].as_u64().unwrap() >= spec["accepted"].as_u64().unwrap());

    // A draft whose vocabulary numbers words differently is another family.
    let tmp = tempfile::tempdir().unwrap();
    let foreign = tmp.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    let src = common::model_dir();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if name == "tokenizer.json" {
            let mut json: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let vocab = json["model"]["vocab"].as_object_mut().unwrap();
            let quick = vocab["\u{120}quick"].clone();
            let brown = vocab["\u{120}brown"].clone();
            vocab.insert("\u{120}quick".into(), brown);
            vocab.insert("\u{120}brown".into(), quick);
            std::fs::write(foreign.join(&name), json.to_string()).unwrap();
        } else {
            std::os::unix::fs::symlink(&path, foreign.join(&name)).unwrap();
        }
    }
    let out = common::bin()
        .args(["generate", "--prompt", "hi", "-n", "2", "--draft-model"])
        .arg(&foreign)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("different tokenizer"),
        "unexpected error: {err}"
    );
    assert!(!err.contains("panicked"));
}
