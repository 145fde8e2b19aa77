//! Structured output on the real default model, greedy: every schema of the
//! corpus in `tests/schemas/` must yield JSON that validates, and regex,
//! choice, JSON-object and Lark constraints must hold end to end.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use mlx_bun::cache::{clone_all, KvCache};
use mlx_bun::constraint::TokenConstraint;
use mlx_bun::decode::generate;
use mlx_bun::generate::{prefill, FinishReason, GenerateOptions, GenerationResult, Prompt};
use mlx_bun::grammar::{constraint_from_request, ConstraintSpec, GrammarEngine};
use mlx_bun::model::Model;
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::sampling::SamplingParams;
use mlx_bun::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// The model tests run one at a time: the machine has two cores.
static MODEL_LOCK: Mutex<()> = Mutex::new(());

fn model_lock() -> std::sync::MutexGuard<'static, ()> {
    MODEL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `MLX_BUN_TEST_MODEL` overrides the default model (any model directory).
fn model_dir() -> PathBuf {
    match std::env::var_os("MLX_BUN_TEST_MODEL") {
        Some(dir) => PathBuf::from(dir),
        None => common::model_dir(),
    }
}

struct Session {
    model: Model,
    tokenizer: Tokenizer,
    engine: GrammarEngine,
    /// Caches holding the chat template's opening, shared by every prompt.
    opening: Vec<Box<dyn KvCache>>,
    opening_ids: Vec<u32>,
}

impl Session {
    fn load() -> Self {
        let dir = model_dir();
        let model = Model::load(&dir).expect("loading the model");
        let tokenizer = Tokenizer::load(&dir).expect("loading the tokenizer");
        let engine = GrammarEngine::new(&tokenizer).expect("building the grammar engine");
        let mut s = Self {
            model,
            tokenizer,
            engine,
            opening: Vec::new(),
            opening_ids: Vec::new(),
        };
        let (a, b) = (s.prompt("Alpha"), s.prompt("Zulu"));
        let n = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        s.opening_ids = a[..n].to_vec();
        s.opening = s.model.make_caches();
        prefill(&s.model, &mut s.opening, &s.opening_ids, 512).expect("prefill");
        s
    }

    fn prompt(&self, text: &str) -> Vec<u32> {
        let input = PromptInput::Text {
            text: text.to_string(),
            system: None,
            use_chat_template: true,
        };
        build_prompt(&self.tokenizer, &input).expect("prompt").1
    }

    /// Greedy generation for the chat prompt `text` under `spec`.
    fn run(
        &self,
        text: &str,
        spec: &ConstraintSpec,
        max_tokens: usize,
    ) -> (GenerationResult, Box<dyn TokenConstraint>) {
        let prompt = self.prompt(text);
        let mut constraint = self
            .engine
            .constraint(spec)
            .expect("compiling the constraint");
        let shared = self.opening_ids.len();
        let (mut caches, cached) =
            if shared < prompt.len() && prompt[..shared] == self.opening_ids[..] {
                (clone_all(&self.opening), shared)
            } else {
                (self.model.make_caches(), 0)
            };
        let opts = GenerateOptions {
            max_tokens,
            sampling: SamplingParams::greedy(),
            ..GenerateOptions::default()
        };
        let result = generate(
            &self.model,
            &self.tokenizer,
            &mut caches,
            Prompt::continuing(&prompt, cached),
            &opts,
            Some(constraint.as_mut()),
            &mut |_| true,
        )
        .expect("generation");
        (result, constraint)
    }
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("corpus schema is a valid JSON schema")
}

fn corpus() -> Vec<(String, String, Value)> {
    let dir = common::repo_root().join("tests/schemas");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/schemas")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let case: Value =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            let prompt = case["prompt"].as_str().expect("prompt").to_string();
            (name, prompt, case["schema"].clone())
        })
        .collect()
}

#[test]
fn every_corpus_schema_yields_valid_json() {
    let _guard = model_lock();
    let s = Session::load();
    let cases = corpus();
    assert!(
        cases.len() >= 30,
        "the corpus needs at least 30 schemas, has {}",
        cases.len()
    );
    let mut failures = Vec::new();
    let mut total_tokens = 0;
    let start = Instant::now();
    for (name, prompt, schema) in &cases {
        let spec = ConstraintSpec::JsonSchema(schema.clone());
        let (result, _) = s.run(prompt, &spec, 160);
        total_tokens += result.generation_tokens;
        eprintln!(
            "{name}: {} tokens at {:.1} tok/s: {}",
            result.generation_tokens, result.generation_tps, result.text
        );
        if result.finish_reason != FinishReason::Stop {
            failures.push(format!(
                "{name}: finished by {:?}: {}",
                result.finish_reason, result.text
            ));
            continue;
        }
        let value: Value = match serde_json::from_str(&result.text) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name}: not JSON ({e}): {}", result.text));
                continue;
            }
        };
        let v = validator(schema);
        let errors: Vec<String> = v.iter_errors(&value).map(|e| e.to_string()).collect();
        if !errors.is_empty() {
            failures.push(format!("{name}: {} -> {}", result.text, errors.join("; ")));
        }
    }
    eprintln!(
        "{} schemas, {total_tokens} tokens in {:.1}s",
        cases.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} outputs failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A full match of `pattern`, checked by the independent JSON-schema validator.
fn matches_pattern(text: &str, pattern: &str) -> bool {
    validator(&json!({"type": "string", "pattern": pattern})).is_valid(&json!(text))
}

/// `expr: term (("+" | "-" | "*") term)*; term: NUMBER | "(" expr ")"`.
fn is_expression(s: &str) -> bool {
    fn expr(b: &[u8], i: &mut usize) -> bool {
        if !term(b, i) {
            return false;
        }
        while *i < b.len() && matches!(b[*i], b'+' | b'-' | b'*') {
            *i += 1;
            if !term(b, i) {
                return false;
            }
        }
        true
    }
    fn term(b: &[u8], i: &mut usize) -> bool {
        if *i < b.len() && b[*i] == b'(' {
            *i += 1;
            if !expr(b, i) || *i >= b.len() || b[*i] != b')' {
                return false;
            }
            *i += 1;
            return true;
        }
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        (1..=3).contains(&(*i - start))
    }
    let mut i = 0;
    expr(s.as_bytes(), &mut i) && i == s.len()
}

#[test]
fn regex_choice_object_and_lark_hold_end_to_end() {
    let _guard = model_lock();
    let s = Session::load();

    // Regex, with the usual ^...$ spelling; the grammar ends the output.
    let phone = r"^\(\d{3}\) \d{3}-\d{4}$";
    let (r, c) = s.run(
        "What is the phone number of the front desk?",
        &ConstraintSpec::Regex(phone.into()),
        40,
    );
    assert_eq!(r.finish_reason, FinishReason::Stop, "{}", r.text);
    assert!(c.is_finished());
    assert!(
        matches_pattern(&r.text, r"^\([0-9]{3}\) [0-9]{3}-[0-9]{4}$"),
        "{:?}",
        r.text
    );

    // Choice: exactly one of the strings, including ones needing escapes.
    let choices = vec![
        "yes".to_string(),
        "no".to_string(),
        "it says \"maybe\"".to_string(),
    ];
    let (r, c) = s.run(
        "Is the sky blue on a clear day? Answer yes or no.",
        &ConstraintSpec::Choice(choices.clone()),
        20,
    );
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert!(c.is_finished());
    assert!(choices.contains(&r.text), "{:?}", r.text);
    assert_eq!(
        s.tokenizer.decode(&r.token_ids).unwrap(),
        r.text,
        "nothing may be emitted after the grammar completes"
    );
    let (r, _) = s.run(
        "Repeat exactly: it says \"maybe\"",
        &ConstraintSpec::Choice(choices.clone()),
        20,
    );
    assert!(choices.contains(&r.text), "{:?}", r.text);

    // Any JSON object.
    let (r, _) = s.run(
        "Give me a JSON object with the name and age of a cat.",
        &ConstraintSpec::JsonObject,
        80,
    );
    assert_eq!(r.finish_reason, FinishReason::Stop, "{}", r.text);
    let v: Value = serde_json::from_str(&r.text).expect("json_object output parses");
    assert!(v.is_object(), "{}", r.text);

    // A recursive Lark grammar.
    let lark = r#"
start: expr
expr: term (("+" | "-" | "*") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"#;
    let (r, _) = s.run(
        "Write an arithmetic expression that equals 10.",
        &ConstraintSpec::Lark(lark.into()),
        30,
    );
    assert!(
        r.finish_reason == FinishReason::Stop || r.finish_reason == FinishReason::Length,
        "{:?}",
        r.finish_reason
    );
    if r.finish_reason == FinishReason::Stop {
        assert!(is_expression(&r.text), "{:?}", r.text);
    }
    let sql = r#"
start: "SELECT " column " FROM " table
column: "name" | "age" | "*"
table: /[a-z]{1,12}/
"#;
    let (r, c) = s.run(
        "Write a SQL query that lists the names of all users.",
        &ConstraintSpec::Lark(sql.into()),
        30,
    );
    assert_eq!(r.finish_reason, FinishReason::Stop, "{}", r.text);
    assert!(c.is_finished() || r.token_ids.len() < 30);
    assert!(
        matches_pattern(&r.text, r"^SELECT (name|age|\*) FROM [a-z]{1,12}$"),
        "{:?}",
        r.text
    );

    // max_tokens in the middle of a value ends with "length".
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}},
        "required": ["name"], "additionalProperties": false});
    let (r, c) = s.run(
        "Give a name as JSON.",
        &ConstraintSpec::JsonSchema(schema),
        4,
    );
    assert_eq!(r.finish_reason, FinishReason::Length);
    assert_eq!(r.generation_tokens, 4);
    assert!(!c.is_finished());
    assert!(r.text.starts_with('{'), "{:?}", r.text);
}

#[test]
fn a_forked_matcher_checks_drafts_and_rolls_back() {
    let tokenizer = Tokenizer::load(&model_dir()).unwrap();
    let engine = GrammarEngine::new(&tokenizer).unwrap();
    let spec = ConstraintSpec::Choice(vec!["alpha".into(), "beta".into()]);
    let mut c = engine.constraint(&spec).unwrap();
    let alpha = tokenizer.encode("alpha").unwrap();
    let beta = tokenizer.encode("beta").unwrap();
    assert!(c.allows(alpha[0]).unwrap());
    assert!(c.allows(beta[0]).unwrap());
    let eos = *tokenizer.eos_ids.iter().next().unwrap();
    assert!(!c.allows(eos).unwrap(), "eos before a complete value");
    let padded = tokenizer.vocab_size() as u32 + 5;
    assert!(
        !c.allows(padded).unwrap(),
        "ids past the tokenizer are never allowed"
    );
    assert!(
        c.allows(alpha[0]).unwrap(),
        "and asking does not break the matcher"
    );

    // A draft walks a fork; the original does not move.
    let mut draft = c.fork().unwrap();
    for &t in &alpha {
        assert!(draft.allows(t).unwrap());
        draft.commit(t).unwrap();
    }
    assert!(draft.is_finished());
    assert!(draft.allows(eos).unwrap());
    assert!(!c.is_finished());
    draft.rollback(alpha.len()).unwrap();
    assert!(!draft.is_finished());
    for &t in &beta {
        draft.commit(t).unwrap();
    }
    assert!(draft.is_finished());

    // Masks follow the same state, and a rejected token is an error.
    let mask = c.mask(tokenizer.vocab_size() + 64).unwrap().unwrap();
    assert_eq!(mask.shape(), &[tokenizer.vocab_size() as i32 + 64]);
    let allowed: Vec<bool> = mask.as_slice::<bool>().to_vec();
    assert!(allowed[alpha[0] as usize] && allowed[beta[0] as usize]);
    assert!(
        !allowed[tokenizer.vocab_size() + 10],
        "padding is never allowed"
    );
    assert!(allowed.iter().filter(|&&b| b).count() <= 16);
    let gamma = tokenizer.encode("gamma").unwrap();
    assert!(!c.allows(gamma[0]).unwrap());
    assert!(c.commit(gamma[0]).is_err());
}

#[test]
fn compiled_grammars_are_cached() {
    let tokenizer = Tokenizer::load(&model_dir()).unwrap();
    let engine = GrammarEngine::new(&tokenizer).unwrap();
    let schema = json!({"type": "object", "properties": {
        "q": {"type": "string", "pattern": "^[a-z]{3}[0-9]{2}$"},
        "n": {"type": "integer", "minimum": 7, "maximum": 4242}},
        "required": ["q", "n"]});
    let spec = ConstraintSpec::JsonSchema(schema);
    let first = engine.matcher(&spec).unwrap().compile_info();
    let again = GrammarEngine::new(&tokenizer)
        .unwrap()
        .matcher(&spec)
        .unwrap()
        .compile_info();
    assert!(!first.cached);
    assert!(
        again.cached,
        "a second engine for the same tokenizer shares the cache"
    );
    assert!(again.elapsed < first.elapsed);
}

fn error_of(engine: &GrammarEngine, spec: ConstraintSpec) -> String {
    match engine.constraint(&spec) {
        Ok(_) => panic!("{spec:?} should be refused"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_constraints_are_clear_errors() {
    let tokenizer = Tokenizer::load(&model_dir()).unwrap();
    let engine = GrammarEngine::new(&tokenizer).unwrap();
    let e = error_of(&engine, ConstraintSpec::Regex("(ab".into()));
    assert!(e.contains("invalid regular expression"), "{e}");
    let e = error_of(&engine, ConstraintSpec::Lark("start: (".into()));
    assert!(e.contains("invalid Lark grammar"), "{e}");
    let e = error_of(
        &engine,
        ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "strng"}}}),
        ),
    );
    assert!(e.contains("invalid JSON schema"), "{e}");
    let e = error_of(
        &engine,
        ConstraintSpec::JsonSchema(json!({"type": "string", "format": "no-such-format"})),
    );
    assert!(e.contains("no-such-format"), "{e}");
    let e = error_of(
        &engine,
        ConstraintSpec::JsonSchema(json!({"oneOf": [{"type": "integer"}, {"type": "number"}]})),
    );
    assert!(e.contains("oneOf"), "{e}");
    let e = error_of(&engine, ConstraintSpec::JsonSchema(json!([1, 2])));
    assert!(e.contains("must be an object"), "{e}");
    let e = error_of(&engine, ConstraintSpec::Choice(vec![]));
    assert!(e.contains("at least one choice"), "{e}");

    let request_error = |body: Value| match constraint_from_request(&body) {
        Ok(spec) => panic!("{body} should be refused, got {spec:?}"),
        Err(e) => e.to_string(),
    };
    let e = request_error(json!({"response_format": {"type": "yaml"}}));
    assert!(
        e.contains("unsupported response_format type \"yaml\""),
        "{e}"
    );
    let e = request_error(json!({"guided_json": "{\"type\": "}));
    assert!(e.contains("guided_json"), "{e}");
    let e = request_error(json!({"guided_regex": "a+", "guided_choice": ["a"]}));
    assert!(e.contains("at most one"), "{e}");
    assert_eq!(
        constraint_from_request(&json!({"response_format": {"type": "json_object"}})).unwrap(),
        Some(ConstraintSpec::JsonObject)
    );
    assert_eq!(
        constraint_from_request(&json!({"guided_choice": ["a", "b"]})).unwrap(),
        Some(ConstraintSpec::Choice(vec!["a".into(), "b".into()]))
    );
    assert_eq!(
        constraint_from_request(&json!({"guided_grammar": "start: \"x\""})).unwrap(),
        Some(ConstraintSpec::Lark("start: \"x\"".into()))
    );
}

fn cli(args: &[&str]) -> std::process::Output {
    let dir = model_dir();
    let mut all = vec!["generate", "--model", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    common::bin().args(&all).output().expect("running mlx-bun")
}

fn cli_json(args: &[&str]) -> Value {
    let out = cli(args);
    assert!(
        out.status.success(),
        "mlx-bun generate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

fn write_temp(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn cli_flags_constrain_end_to_end() {
    let _guard = model_lock();
    let tmp = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"], "additionalProperties": false});
    let file = write_temp(tmp.path(), "schema.json", &schema.to_string());
    let out = cli_json(&[
        "--json-schema",
        &file,
        "--json",
        "-n",
        "60",
        "-p",
        "What is the largest city in Japan?",
    ]);
    assert_eq!(out["finish_reason"], "stop", "{out}");
    let text = out["text"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).expect("output parses");
    assert!(validator(&schema).is_valid(&value), "{text}");

    let out = cli_json(&[
        "--choice",
        "red,green,blue",
        "--json",
        "-n",
        "10",
        "-p",
        "What color is grass?",
    ]);
    assert_eq!(out["finish_reason"], "stop");
    assert!(
        ["red", "green", "blue"].contains(&out["text"].as_str().unwrap()),
        "{out}"
    );

    let grammar = write_temp(
        tmp.path(),
        "answer.lark",
        "start: \"Answer: \" WORD\nWORD: /[A-Z][a-z]{1,10}/\n",
    );
    let out = cli_json(&[
        "--grammar",
        &grammar,
        "--json",
        "-n",
        "20",
        "-p",
        "What is the capital of France?",
    ]);
    let text = out["text"].as_str().unwrap();
    assert!(
        matches_pattern(text, "^Answer: [A-Z][a-z]{1,10}$"),
        "{text}"
    );

    // Bad input: a clear error and a non-zero exit, never unconstrained text.
    for (args, needle) in [
        (vec!["--json-schema", "{not json"], "--json-schema"),
        (vec!["--regex", "(unclosed"], "invalid regular expression"),
        (
            vec![
                "--json-schema",
                r#"{"type": "object", "minProperties": "x"}"#,
            ],
            "invalid JSON schema",
        ),
    ] {
        let mut all = args.clone();
        all.extend_from_slice(&["-n", "5", "-p", "hi"]);
        let out = cli(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr.contains("error") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "no text on failure: {:?}",
            out.stdout
        );
    }
}
