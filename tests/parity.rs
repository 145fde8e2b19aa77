//! Parity with mlx-lm: tokenizer ids, chat-template text, greedy continuations
//! (library and CLI) and prefill logits must equal the goldens that
//! `scripts/oracle/make_goldens.py` recorded with mlx-lm on the same model.
//!
//! The goldens belong to the default model. To check another model, point
//! `MLX_BUN_PARITY_MODEL` at it and `MLX_BUN_PARITY_GOLDENS` at goldens made
//! from it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use mlx_bun::chat_template::Message;
use mlx_bun::decode::generate;
use mlx_bun::generate::{GenerateOptions, TokenEvent};
use mlx_bun::model::Model;
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::sampling::SamplingParams;
use mlx_bun::tokenizer::Tokenizer;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde::Deserialize;

/// Logits may differ by this much (absolute) from mlx-lm's. Both sides run the
/// same MLX 0.32.2 kernels in float32; the one difference is the BLAS behind
/// the attention matmuls: the binary links OpenBLAS ahead of the reference
/// BLAS that mlx-lm's wheel uses, which sums in another order. Measured: at
/// most 3.5e-5 on logits of about 25 (bit-identical when the oracle is run on
/// OpenBLAS too); see docs/parity.md.
const LOGIT_TOL: f32 = 1e-3;

// ---------------------------------------------------------------- goldens

#[derive(Deserialize)]
struct Meta {
    model: ModelFingerprint,
}

#[derive(Deserialize)]
struct ModelFingerprint {
    config_sha256: String,
    weights_sha256: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct TokenizeGoldens {
    meta: Meta,
    cases: Vec<TokenizeCase>,
}

#[derive(Deserialize)]
struct TokenizeCase {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct GenerateGoldens {
    meta: Meta,
    max_tokens: usize,
    cases: Vec<GenerateCase>,
}

#[derive(Deserialize)]
struct GenerateCase {
    name: String,
    input: CaseInput,
    rendered: String,
    prompt_ids: Vec<u32>,
    continuation_ids: Vec<u32>,
    continuation_text: String,
    continuation_decoded: String,
    finish_reason: String,
}

/// A prompt as a user gives it: text (with or without the chat template) or messages.
#[derive(Deserialize)]
struct CaseInput {
    text: Option<String>,
    #[serde(default)]
    chat: bool,
    system: Option<String>,
    messages: Option<Vec<Message>>,
}

#[derive(Deserialize)]
struct LogitsGolden {
    meta: Meta,
    case: String,
    prompt_ids: Vec<u32>,
    vocab: usize,
    top_ids: Vec<u32>,
    top_values: Vec<f32>,
    probe_ids: Vec<u32>,
    probe_values: Vec<f32>,
    stats: LogitStats,
}

#[derive(Deserialize, Debug)]
struct LogitStats {
    mean: f32,
    std: f32,
    min: f32,
    max: f32,
    logsumexp: f32,
}

fn goldens_dir() -> PathBuf {
    std::env::var_os("MLX_BUN_PARITY_GOLDENS")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("goldens"))
}

/// The model under test; `None` means the default model (so the CLI runs without `--model`).
fn model_override() -> Option<PathBuf> {
    std::env::var_os("MLX_BUN_PARITY_MODEL").map(PathBuf::from)
}

fn model_dir() -> PathBuf {
    model_override().unwrap_or_else(common::model_dir)
}

fn read_golden<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = goldens_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading golden {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// SHA-256 of a file through `sha256sum`; `None` when the tool is missing.
fn sha256(path: &Path) -> Option<String> {
    let out = Command::new("sha256sum").arg(path).output().ok()?;
    assert!(
        out.status.success(),
        "sha256sum {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace().next().map(String::from)
}

/// Fails early, with the fix, when the goldens were made from other files.
fn assert_goldens_match_model(meta: &Meta, dir: &Path) {
    let regenerate = format!(
        "regenerate them: \"$(scripts/oracle/setup.sh)\" scripts/oracle/make_goldens.py \
         --model {} --out goldens/",
        dir.display()
    );
    let Some(config) = sha256(&dir.join("config.json")) else {
        common::missing("sha256sum", "install coreutils");
        return;
    };
    assert_eq!(
        config,
        meta.model.config_sha256,
        "the goldens were made from another config.json than {}'s; {regenerate}",
        dir.display()
    );
    for (file, want) in &meta.model.weights_sha256 {
        let got = sha256(&dir.join(file));
        assert_eq!(
            got.as_deref(),
            Some(want.as_str()),
            "the goldens were made from another {file} than {}'s; {regenerate}",
            dir.display()
        );
    }
}

impl CaseInput {
    fn prompt_input(&self) -> PromptInput {
        match (&self.messages, &self.text) {
            (Some(messages), _) => PromptInput::Messages(messages.clone()),
            (None, Some(text)) => PromptInput::Text {
                text: text.clone(),
                system: self.system.clone(),
                use_chat_template: self.chat,
            },
            (None, None) => panic!("a golden case has neither text nor messages"),
        }
    }
}

// ---------------------------------------------------------------- tokenizer and template

#[test]
fn tokenizer_ids_match_mlx_lm() {
    let goldens: TokenizeGoldens = read_golden("tokenize.json");
    let dir = model_dir();
    assert_goldens_match_model(&goldens.meta, &dir);
    let tok = Tokenizer::load(&dir).expect("loading the tokenizer");
    let mut failures = Vec::new();
    for case in &goldens.cases {
        let ids = tok.encode(&case.text).expect("encoding");
        if ids != case.ids {
            failures.push(format!(
                "{:?}: ids {ids:?}, mlx-lm {:?}",
                case.text, case.ids
            ));
            continue;
        }
        let decoded = tok.decode(&ids).expect("decoding");
        if decoded != case.decoded {
            failures.push(format!(
                "{:?}: decoded {decoded:?}, mlx-lm {:?}",
                case.text, case.decoded
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{} strings tokenized as mlx-lm does", goldens.cases.len());
}

#[test]
fn chat_template_rendering_matches_mlx_lm() {
    let goldens: GenerateGoldens = read_golden("generate.json");
    let dir = model_dir();
    assert_goldens_match_model(&goldens.meta, &dir);
    let tok = Tokenizer::load(&dir).expect("loading the tokenizer");
    let mut failures = Vec::new();
    for case in &goldens.cases {
        let (text, ids) = build_prompt(&tok, &case.input.prompt_input()).expect("building");
        let text = text.expect("text or chat prompts have a rendered text");
        if text != case.rendered {
            failures.push(format!(
                "{}: rendered\n{text:?}\nmlx-lm rendered\n{:?}",
                case.name, case.rendered
            ));
        } else if ids != case.prompt_ids {
            failures.push(format!(
                "{}: prompt ids {ids:?}, mlx-lm {:?}",
                case.name, case.prompt_ids
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- library: one model load

#[test]
fn library_logits_and_greedy_match_mlx_lm() {
    let logits: LogitsGolden = read_golden("logits.json");
    let goldens: GenerateGoldens = read_golden("generate.json");
    let dir = model_dir();
    assert_goldens_match_model(&goldens.meta, &dir);
    assert_goldens_match_model(&logits.meta, &dir);
    let model = Model::load(&dir).expect("loading the model");
    let tok = Tokenizer::load(&dir).expect("loading the tokenizer");

    check_prefill_logits(&model, &logits).unwrap_or_else(|e| panic!("{e:#}"));

    let mut failures = Vec::new();
    for case in &goldens.cases {
        let started = std::time::Instant::now();
        match library_continuation(&model, &tok, case, goldens.max_tokens) {
            Ok((ids, text, finish)) => {
                eprintln!(
                    "{}: {} prompt + {} generated tokens in {:.1} s",
                    case.name,
                    case.prompt_ids.len(),
                    ids.len(),
                    started.elapsed().as_secs_f64()
                );
                if let Err(e) = compare_outcome(case, &ids, &text, &finish) {
                    failures.push(format!("{}: {e:#}", case.name));
                }
            }
            Err(e) => failures.push(format!("{}: {e:#}", case.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Last-position logits of one forward pass over the whole prompt (fresh cache).
fn check_prefill_logits(model: &Model, golden: &LogitsGolden) -> Result<()> {
    let ids: Vec<i32> = golden.prompt_ids.iter().map(|&t| t as i32).collect();
    let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
    let mut caches = model.make_caches();
    let logits = model.forward(&input, &mut caches)?;
    let last = logits.index((0, -1, ..)).as_dtype(mlx_rs::Dtype::Float32)?;
    last.eval()?;
    let values: &[f32] = last.as_slice();
    ensure!(
        values.len() == golden.vocab,
        "vocabulary {} but mlx-lm's has {}",
        values.len(),
        golden.vocab
    );

    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    order.sort_by(|&a, &b| values[b as usize].total_cmp(&values[a as usize]));
    let top: Vec<u32> = order[..golden.top_ids.len()].to_vec();
    ensure!(
        top == golden.top_ids,
        "{}: top-{} ids {top:?}, mlx-lm {:?}",
        golden.case,
        top.len(),
        golden.top_ids
    );

    let mut worst_logit = 0f32;
    let pairs = golden
        .top_ids
        .iter()
        .zip(&golden.top_values)
        .chain(golden.probe_ids.iter().zip(&golden.probe_values));
    for (&id, &want) in pairs {
        let got = values[id as usize];
        let diff = (got - want).abs();
        worst_logit = worst_logit.max(diff);
        ensure!(
            diff <= LOGIT_TOL,
            "logit of token {id}: {got} vs mlx-lm {want} (|diff| {diff:e} > {LOGIT_TOL:e})"
        );
    }

    let ours = logit_stats(&last)?;
    let mut worst_stat = 0f32;
    let pairs = [
        ("mean", ours.mean, golden.stats.mean),
        ("std", ours.std, golden.stats.std),
        ("min", ours.min, golden.stats.min),
        ("max", ours.max, golden.stats.max),
        ("logsumexp", ours.logsumexp, golden.stats.logsumexp),
    ];
    for (name, got, want) in pairs {
        let diff = (got - want).abs();
        worst_stat = worst_stat.max(diff);
        ensure!(
            diff <= LOGIT_TOL,
            "logit {name}: {got} vs mlx-lm {want} (|diff| {diff:e} > {LOGIT_TOL:e})"
        );
    }
    eprintln!(
        "prefill logits ({} tokens): top-{} order equal, max |diff| {worst_logit:e} \
         over {} logits, {worst_stat:e} over the summary stats",
        ids.len(),
        top.len(),
        golden.top_ids.len() + golden.probe_ids.len()
    );
    Ok(())
}

/// The summary statistics the golden records, with the same MLX float32
/// reductions, so equal logits give equal statistics.
fn logit_stats(logits: &Array) -> Result<LogitStats> {
    let scalar = |a: Array| -> Result<f32> {
        a.eval()?;
        Ok(a.item_cast::<f32>())
    };
    Ok(LogitStats {
        mean: scalar(mlx_rs::ops::mean(logits, None)?)?,
        std: scalar(mlx_rs::ops::std(logits, None, None)?)?,
        min: scalar(mlx_rs::ops::min(logits, None)?)?,
        max: scalar(mlx_rs::ops::max(logits, None)?)?,
        logsumexp: scalar(mlx_rs::ops::logsumexp(logits, None)?)?,
    })
}

fn library_continuation(
    model: &Model,
    tok: &Tokenizer,
    case: &GenerateCase,
    max_tokens: usize,
) -> Result<(Vec<u32>, String, String)> {
    let (_, prompt) = build_prompt(tok, &case.input.prompt_input())?;
    ensure!(prompt == case.prompt_ids, "prompt ids differ from mlx-lm's");
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };
    let mut caches = model.make_caches();
    let mut on_token = |_: &TokenEvent| true;
    let result = generate(model, tok, &mut caches, &prompt, &opts, None, &mut on_token)?;
    Ok((
        result.token_ids,
        result.text,
        result.finish_reason.as_str().to_string(),
    ))
}

/// Token-for-token equality (reporting the first divergence), then the text
/// and the finish reason.
fn compare_outcome(case: &GenerateCase, ids: &[u32], text: &str, finish: &str) -> Result<()> {
    let want = &case.continuation_ids;
    if ids != want.as_slice() {
        let at = ids.iter().zip(want).take_while(|(a, b)| a == b).count();
        bail!(
            "diverges at generated token {at}: ours {:?}, mlx-lm {:?} \
             (ours {} tokens, mlx-lm {})",
            ids.get(at),
            want.get(at),
            ids.len(),
            want.len()
        );
    }
    ensure!(
        finish == case.finish_reason,
        "same ids, finish {finish}, mlx-lm {}",
        case.finish_reason
    );
    // mlx-lm's streaming BPE detokenizer drops the leading space of the first
    // generated token (" the" streams as "the"); ours keeps it, as the
    // tokenizer's own decode does. That is the one accepted text difference.
    let mlx_lm_trimmed_first_space =
        case.continuation_decoded.strip_prefix(' ') == Some(case.continuation_text.as_str());
    let accepted = text == case.continuation_text
        || (mlx_lm_trimmed_first_space && text == case.continuation_decoded);
    ensure!(
        accepted,
        "same ids, text {text:?}, mlx-lm streamed {:?} (decoded {:?})",
        case.continuation_text,
        case.continuation_decoded
    );
    Ok(())
}

// ---------------------------------------------------------------- the CLI

/// `mlx-bun generate` arguments that give this case's prompt the way a user would.
fn cli_args(case: &GenerateCase, scratch: &Path) -> Result<Vec<String>> {
    let input = &case.input;
    let mut args = vec!["generate".to_string()];
    if let Some(messages) = &input.messages {
        let file = scratch.join(format!("{}.json", case.name));
        std::fs::write(&file, serde_json::to_string(messages)?)?;
        args.push("--messages-file".to_string());
        args.push(file.display().to_string());
        return Ok(args);
    }
    let text = input.text.clone().context("case without text")?;
    if text.contains('\n') {
        let file = scratch.join(format!("{}.txt", case.name));
        std::fs::write(&file, &text)?;
        args.push("--prompt-file".to_string());
        args.push(file.display().to_string());
    } else {
        args.push("--prompt".to_string());
        args.push(text);
    }
    if let Some(system) = &input.system {
        args.push("--system".to_string());
        args.push(system.clone());
    }
    if !input.chat {
        args.push("--ignore-chat-template".to_string());
    }
    Ok(args)
}

#[derive(Deserialize)]
struct CliResult {
    text: String,
    token_ids: Vec<u32>,
    prompt_tokens: usize,
    finish_reason: String,
}

#[test]
fn cli_greedy_matches_mlx_lm() {
    let goldens: GenerateGoldens = read_golden("generate.json");
    let dir = model_dir();
    assert_goldens_match_model(&goldens.meta, &dir);
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    // The long prompt is left to the library test: its prefill alone takes ~30 s here.
    for case in goldens.cases.iter().filter(|c| c.name != "long") {
        let mut args = cli_args(case, scratch.path()).expect("building arguments");
        args.extend(["--json".into(), "-n".into(), goldens.max_tokens.to_string()]);
        if let Some(dir) = model_override() {
            args.extend(["--model".into(), dir.display().to_string()]);
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = common::run_ok(&argv);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result: CliResult = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{}: --json printed {stdout:?}: {e}", case.name));
        if result.prompt_tokens != case.prompt_ids.len() {
            failures.push(format!(
                "{}: {} prompt tokens, mlx-lm {}",
                case.name,
                result.prompt_tokens,
                case.prompt_ids.len()
            ));
        } else if let Err(e) =
            compare_outcome(case, &result.token_ids, &result.text, &result.finish_reason)
        {
            failures.push(format!("{} (cli): {e:#}", case.name));
        } else {
            eprintln!(
                "{} (cli): {} tokens equal",
                case.name,
                result.token_ids.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
