//! Speculative rows inside the continuous batch: every row, whatever its
//! drafter (prompt lookup or a draft model), its `k`, its grammar, or when it
//! joins, emits exactly the tokens plain greedy decoding of the same request
//! gives alone, while drafted tokens are verified in the batch's shared
//! forward pass.

mod common;

use std::sync::Mutex;

use mlx_bun::chat_template::Message;
use mlx_bun::decode::generate;
use mlx_bun::decode::{BatchLimits, BatchScheduler, ConstraintSlot, Row};
use mlx_bun::generate::{GenerateOptions, GenerationResult, SpeculationStats};
use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::model::Model;
use mlx_bun::speculative::{DraftSource, ModelDrafter, NgramDrafter};
use mlx_bun::tokenizer::Tokenizer;
use serde_json::json;

/// MLX work in one process runs one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const COPY_TEXT: &str = "Copy this list exactly, one item per line: apples, pears, plums, \
    cherries, grapes, lemons, limes, oranges.";

fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let rendered = tok
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[Message::new("user", text)], true)
        .unwrap();
    tok.encode(&rendered).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

/// What a request gives decoded alone, without drafts.
fn alone(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    grammar: Option<&GrammarEngine>,
    spec: &ConstraintSpec,
) -> GenerationResult {
    let mut constraint = grammar.map(|g| g.constraint(spec).unwrap());
    let mut caches = model.make_caches();
    generate(
        model,
        tok,
        &mut caches,
        prompt,
        opts,
        constraint.as_deref_mut(),
        &mut |_| true,
    )
    .unwrap()
}

/// One request of a mixed batch.
struct Case {
    prompt: Vec<u32>,
    /// `None`: no drafts; `Some((draft model or prompt lookup, k))`.
    draft: Option<(bool, usize)>,
    grammar: bool,
    /// Scheduler steps before it is inserted.
    join_at: usize,
}

/// What a batch run decodes with.
struct Setup<'a> {
    model: &'a Model,
    draft: &'a Model,
    /// Rows drafting with the model share its forward passes (the batch's
    /// draft model) instead of each running its own.
    share: bool,
    /// The batch verifies as many drafts as its measured step times say pay.
    measured_width: bool,
    tok: &'a Tokenizer,
    engine: &'a GrammarEngine,
    spec: &'a ConstraintSpec,
}

fn run_batch(setup: &Setup<'_>, cases: &[Case], opts: &GenerateOptions) -> Vec<GenerationResult> {
    let Setup {
        model,
        draft,
        share,
        measured_width,
        tok,
        engine,
        spec,
    } = *setup;
    let limits = BatchLimits {
        prompt_concurrency: 2,
        measured_draft_width: measured_width,
        ..BatchLimits::default()
    };
    let mut sched = BatchScheduler::new(model, limits);
    if share {
        sched = sched.with_draft_model(draft);
    }
    let mut results: Vec<Option<GenerationResult>> = cases.iter().map(|_| None).collect();
    let mut inserted = vec![false; cases.len()];
    let mut steps = 0;
    while !sched.is_idle() || inserted.iter().any(|i| !i) {
        for (i, case) in cases.iter().enumerate() {
            if inserted[i] || case.join_at > steps {
                continue;
            }
            let constraint = case
                .grammar
                .then(|| ConstraintSlot::Owned(engine.constraint(spec).unwrap()));
            let mut row = Row::new(
                model,
                tok,
                case.prompt.clone(),
                0,
                opts,
                constraint,
                Box::new(|_| true),
            )
            .unwrap();
            if let Some((true, k)) = case.draft.filter(|_| share) {
                row = row.with_shared_draft_model(&opts.sampling, k).unwrap();
            } else if let Some((with_model, k)) = case.draft {
                let drafter: Box<dyn DraftSource> = if with_model {
                    Box::new(ModelDrafter::new(draft, &opts.sampling).unwrap())
                } else {
                    Box::new(NgramDrafter::default())
                };
                row = row.with_drafter(drafter, k);
            }
            sched.insert(i as u64, row, Vec::new());
            inserted[i] = true;
        }
        for f in sched.step().unwrap() {
            results[f.id as usize] = Some(f.result);
        }
        steps += 1;
    }
    results.into_iter().map(Option::unwrap).collect()
}

#[test]
fn drafting_rows_in_a_batch_equal_plain_greedy_alone() {
    drafting_rows_equal_plain_greedy_alone(false, true);
}

/// The same mix with the draft model's rows sharing its forward passes:
/// rows join the shared draft cache mid-run, draft different `k`, under a
/// grammar or not, and leave it as they finish.
#[test]
fn rows_sharing_the_draft_model_equal_plain_greedy_alone() {
    // Every row verifies its `k` drafts: how many a measured width would
    // take depends on the machine's timings.
    let shared = drafting_rows_equal_plain_greedy_alone(true, false);
    // Sharing the draft model's passes changes no row's drafts.
    let alone = drafting_rows_equal_plain_greedy_alone(false, false);
    for (i, (s, a)) in shared.iter().zip(&alone).enumerate() {
        assert_eq!(
            s.as_ref().map(|s| (s.drafted, s.accepted, s.target_calls)),
            a.as_ref().map(|a| (a.drafted, a.accepted, a.target_calls)),
            "row {i}"
        );
    }
}

/// The float32 copy of the default model with its final norm's weights
/// scaled unevenly: it drafts plausible tokens, and the target rejects
/// some of them.
fn perturbed_draft() -> Model {
    let mut draft = Model::load(&common::float32_model()).unwrap();
    let weight = &draft.decoder.norm.weight;
    let n = weight.shape()[0] as usize;
    let factors: Vec<f32> = (0..n)
        .map(|i| 0.7 + 0.6 * ((i * 7919) % 13) as f32 / 12.0)
        .collect();
    let factors = mlx_rs::Array::from_slice(&factors, &[n as i32])
        .as_dtype(weight.dtype())
        .unwrap();
    draft.decoder.norm.weight = weight.multiply(&factors).unwrap();
    draft
}

fn drafting_rows_equal_plain_greedy_alone(
    share: bool,
    measured_width: bool,
) -> Vec<Option<SpeculationStats>> {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    // A different model of the same tokenizer drafts: its proposals are
    // sometimes rejected, so rows trim different numbers of positions.
    let draft = perturbed_draft();
    let engine = GrammarEngine::new(&tok).unwrap();
    let spec = ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "fruits": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}
        },
        "required": ["fruits"],
        "additionalProperties": false
    }));
    let copy = encode(&tok, COPY_TEXT);
    let json_prompt = encode(
        &tok,
        "List three fruits from this text as JSON: apples, pears, plums.",
    );
    let short = encode(&tok, "Hi!");
    let repeat = encode(
        &tok,
        "Repeat exactly: the red fox, the red fox, the red fox jumps.",
    );
    let cases = vec![
        Case {
            prompt: copy.clone(),
            draft: Some((false, 3)),
            grammar: false,
            join_at: 0,
        },
        Case {
            prompt: short.clone(),
            draft: None,
            grammar: false,
            join_at: 0,
        },
        Case {
            prompt: repeat.clone(),
            draft: Some((false, 2)),
            grammar: false,
            join_at: 0,
        },
        Case {
            prompt: json_prompt.clone(),
            draft: Some((false, 3)),
            grammar: true,
            join_at: 3,
        },
        Case {
            prompt: copy.clone(),
            draft: Some((true, 3)),
            grammar: false,
            join_at: 5,
        },
        Case {
            prompt: repeat.clone(),
            draft: Some((true, 1)),
            grammar: false,
            join_at: 9,
        },
        Case {
            prompt: json_prompt.clone(),
            draft: Some((true, 2)),
            grammar: true,
            join_at: 9,
        },
    ];
    let opts = greedy(40);
    let batch = run_batch(
        &Setup {
            model: &model,
            draft: &draft,
            share,
            measured_width,
            tok: &tok,
            engine: &engine,
            spec: &spec,
        },
        &cases,
        &opts,
    );
    let (mut drafted, mut accepted) = (0, 0);
    for (i, (case, got)) in cases.iter().zip(&batch).enumerate() {
        let want = alone(
            &model,
            &tok,
            &case.prompt,
            &opts,
            case.grammar.then_some(&engine),
            &spec,
        );
        assert_eq!(
            got.token_ids, want.token_ids,
            "row {i} (draft {:?}, grammar {}) differs from plain greedy alone",
            case.draft, case.grammar
        );
        assert_eq!(got.finish_reason, want.finish_reason, "row {i}");
        match (&case.draft, &got.speculation) {
            (Some(_), Some(s)) => {
                drafted += s.drafted;
                accepted += s.accepted;
                assert!(s.target_calls > 0, "row {i} never verified");
            }
            (None, None) => {}
            (d, s) => panic!("row {i}: draft {d:?} but speculation {s:?}"),
        }
    }
    // With a measured width, how many drafts are verified depends on the
    // machine; with every row's `k`, the trims of both kinds are exercised.
    assert!(
        (measured_width && accepted <= drafted) || (accepted > 0 && accepted < drafted),
        "the batch must accept some drafts and reject others: {accepted}/{drafted}"
    );
    let model_rows = cases
        .iter()
        .zip(&batch)
        .filter(|(c, _)| matches!(c.draft, Some((true, _))));
    let (model_drafted, model_accepted) = model_rows
        .filter_map(|(_, b)| b.speculation.as_ref())
        .fold((0, 0), |(d, a), s| (d + s.drafted, a + s.accepted));
    assert!(
        (measured_width && model_accepted <= model_drafted)
            || (model_accepted > 0 && model_accepted < model_drafted),
        "the draft model's rows must have drafts accepted and rejected: {model_accepted}/{model_drafted}"
    );
    batch.into_iter().map(|b| b.speculation).collect()
}

#[test]
fn a_self_draft_under_a_grammar_in_the_batch_accepts_what_the_target_samples() {
    self_draft_under_a_grammar(false);
}

#[test]
fn a_shared_self_draft_under_a_grammar_accepts_what_the_target_samples() {
    self_draft_under_a_grammar(true);
}

fn self_draft_under_a_grammar(share: bool) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let engine = GrammarEngine::new(&tok).unwrap();
    let spec = ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    }));
    let cases: Vec<Case> = [
        "Describe a person named Ana, 31, as JSON.",
        "Give me a JSON record of Bob, age 7.",
    ]
    .iter()
    .map(|t| Case {
        prompt: encode(&tok, t),
        draft: Some((true, 3)),
        grammar: true,
        join_at: 0,
    })
    .collect();
    let opts = greedy(60);
    let batch = run_batch(
        &Setup {
            model: &model,
            draft: &model,
            share,
            measured_width: true,
            tok: &tok,
            engine: &engine,
            spec: &spec,
        },
        &cases,
        &opts,
    );
    for (case, got) in cases.iter().zip(&batch) {
        let want = alone(&model, &tok, &case.prompt, &opts, Some(&engine), &spec);
        assert_eq!(got.token_ids, want.token_ids);
        let s = got.speculation.as_ref().unwrap();
        let acceptance = s.accepted as f64 / s.drafted.max(1) as f64;
        assert!(acceptance >= 0.95, "acceptance {acceptance:.2}: {s:?}");
    }
}

#[test]
fn drafting_rows_report_the_log_probabilities_of_plain_decoding() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let engine = GrammarEngine::new(&tok).unwrap();
    let spec = ConstraintSpec::JsonSchema(json!({"type": "object"}));
    let cases = vec![
        Case {
            prompt: encode(&tok, COPY_TEXT),
            draft: Some((false, 3)),
            grammar: false,
            join_at: 0,
        },
        Case {
            prompt: encode(
                &tok,
                "Repeat exactly: the red fox, the red fox, the red fox jumps.",
            ),
            draft: Some((false, 2)),
            grammar: false,
            join_at: 2,
        },
    ];
    let opts = GenerateOptions {
        logprobs: Some(3),
        ..greedy(24)
    };
    let batch = run_batch(
        &Setup {
            model: &model,
            draft: &model,
            share: false,
            measured_width: true,
            tok: &tok,
            engine: &engine,
            spec: &spec,
        },
        &cases,
        &opts,
    );
    for (i, (case, got)) in cases.iter().zip(&batch).enumerate() {
        let want = alone(&model, &tok, &case.prompt, &opts, None, &spec);
        assert_eq!(got.token_ids, want.token_ids, "row {i}");
        assert!(got.speculation.as_ref().unwrap().accepted > 0, "row {i}");
        assert_eq!(got.logprobs.len(), want.logprobs.len(), "row {i}");
        for (g, w) in got.logprobs.iter().zip(&want.logprobs) {
            assert_eq!(g.token, w.token);
            assert!(
                (g.logprob - w.logprob).abs() < 1e-3,
                "row {i}: logprob {} vs {} alone",
                g.logprob,
                w.logprob
            );
            let ids = |t: &[(u32, f32)]| t.iter().map(|p| p.0).collect::<Vec<_>>();
            assert_eq!(ids(&g.top), ids(&w.top), "row {i}: top tokens");
        }
    }
}
