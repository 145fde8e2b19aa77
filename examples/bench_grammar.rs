//! Structured-output benchmark: grammar compile time cold vs cached, mask
//! time per token, and decode speed with vs without a JSON schema on the
//! same prompt (runs interleaved). Run through `scripts/bench-grammar.sh`.
//!
//! Arguments: `[--model DIR] [--rounds N] [--max-tokens N] [--case NAME]`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_bun::cache::{clone_all, KvCache};
use mlx_bun::constraint::TokenConstraint;
use mlx_bun::decode::generate;
use mlx_bun::generate::{prefill, GenerateOptions, Prompt};
use mlx_bun::grammar::{clear_cache, ConstraintSpec, GrammarConstraint, GrammarEngine};
use mlx_bun::model::Model;
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::sampling::SamplingParams;
use mlx_bun::tokenizer::Tokenizer;
use serde_json::{json, Value};

struct Args {
    model: Option<PathBuf>,
    rounds: usize,
    max_tokens: usize,
    case: String,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        model: None,
        rounds: 9,
        max_tokens: 64,
        case: "task_list".to_string(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = Some(PathBuf::from(value()?)),
            "--rounds" => args.rounds = value()?.parse().context("--rounds")?,
            "--max-tokens" => args.max_tokens = value()?.parse().context("--max-tokens")?,
            "--case" => args.case = value()?,
            other => bail!("unknown argument {other}"),
        }
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    Ok(args)
}

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schemas")
}

fn corpus() -> Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(schemas_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for path in paths {
        let case: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        out.push((name, case));
    }
    Ok(out)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The value at quantile `q` (0..=1) of `xs`, nearest rank.
fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The constraint alone, without the model: the tokens of a constrained
/// output fed again through fresh matchers (mask, then commit, per token).
fn replay(
    engine: &GrammarEngine,
    spec: &ConstraintSpec,
    ids: &[u32],
    vocab: usize,
) -> Result<Value> {
    const RUNS: usize = 50;
    let mut mask = Vec::new();
    let mut commit = Vec::new();
    for _ in 0..RUNS {
        let mut c = engine.matcher(spec)?;
        for &t in ids {
            c.mask(vocab)?;
            c.commit(t)?;
        }
        mask.extend(c.mask_times().iter().map(|&d| ms(d)));
        commit.extend(c.commit_times().iter().map(|&d| ms(d)));
    }
    println!(
        "replay without the model ({RUNS} x {} tokens): mask median {:.3} ms (p99 {:.3}), commit median {:.3} ms (p99 {:.3})",
        ids.len(),
        quantile(&mask, 0.5),
        quantile(&mask, 0.99),
        quantile(&commit, 0.5),
        quantile(&commit, 0.99)
    );
    Ok(json!({
        "runs": RUNS, "tokens": ids.len(),
        "mask_ms": {"median": quantile(&mask, 0.5), "p99": quantile(&mask, 0.99)},
        "commit_ms": {"median": quantile(&commit, 0.5), "p99": quantile(&commit, 0.99)},
    }))
}

fn bench_compile(engine: &GrammarEngine, cases: &[(String, Value)]) -> Result<Value> {
    let mut cold = Vec::new();
    let mut cached = Vec::new();
    for (name, case) in cases {
        let spec = ConstraintSpec::JsonSchema(case["schema"].clone());
        clear_cache();
        let info = engine
            .matcher(&spec)
            .with_context(|| format!("compiling {name}"))?
            .compile_info();
        assert!(!info.cached);
        cold.push(ms(info.elapsed));
        for _ in 0..20 {
            let info = engine.matcher(&spec)?.compile_info();
            assert!(info.cached);
            cached.push(ms(info.elapsed));
        }
    }
    let (cold_med, cached_med) = (quantile(&cold, 0.5), quantile(&cached, 0.5));
    println!(
        "compile ({} schemas): cold median {:.2} ms (p90 {:.2}, max {:.2}); cached median {:.3} ms (p99 {:.3}); {:.0}x",
        cases.len(),
        cold_med,
        quantile(&cold, 0.9),
        quantile(&cold, 1.0),
        cached_med,
        quantile(&cached, 0.99),
        cold_med / cached_med
    );
    Ok(json!({
        "schemas": cases.len(),
        "cold_ms": {"median": cold_med, "p90": quantile(&cold, 0.9), "max": quantile(&cold, 1.0)},
        "cached_ms": {"median": cached_med, "p99": quantile(&cached, 0.99)},
    }))
}

/// Decode timings of one kind of run, across rounds.
#[derive(Default)]
struct Run {
    tps: Vec<f64>,
    tokens: Vec<usize>,
    /// Time between consecutive emitted tokens.
    steps_ms: Vec<f64>,
}

impl Run {
    fn run(
        &mut self,
        model: &Model,
        tokenizer: &Tokenizer,
        base: &[Box<dyn KvCache>],
        prompt: &[u32],
        opts: &GenerateOptions,
        constraint: Option<&mut GrammarConstraint>,
    ) -> Result<(String, Vec<u32>)> {
        let mut caches = clone_all(base);
        let mut stamps = Vec::new();
        let result = generate(
            model,
            tokenizer,
            &mut caches,
            Prompt::continuing(prompt, prompt.len() - 1),
            opts,
            constraint.map(|c| c as &mut dyn TokenConstraint),
            &mut |ev| {
                if ev.token != u32::MAX {
                    stamps.push(Instant::now());
                }
                true
            },
        )?;
        // The last step of a run differs by how the run ends (grammar
        // complete or token limit); it is left out.
        let steady = &stamps[..stamps.len().saturating_sub(1)];
        self.steps_ms
            .extend(steady.windows(2).map(|w| ms(w[1] - w[0])));
        self.tps.push(result.generation_tps);
        self.tokens.push(result.generation_tokens);
        Ok((result.text, result.token_ids))
    }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => mlx_bun::default_model::ensure()?,
    };
    let model = Model::load(&dir)?;
    let tokenizer = Tokenizer::load(&dir)?;

    let t = std::time::Instant::now();
    let engine = GrammarEngine::new(&tokenizer)?;
    let env_ms = ms(t.elapsed());
    println!("token environment (once per tokenizer): {env_ms:.0} ms");

    let cases = corpus()?;
    let compile = bench_compile(&engine, &cases)?;

    let (_, case) = cases
        .iter()
        .find(|(n, _)| *n == args.case)
        .with_context(|| format!("no schema named {} in tests/schemas", args.case))?;
    let spec = ConstraintSpec::JsonSchema(case["schema"].clone());
    let text = format!("{} Answer in JSON.", case["prompt"].as_str().unwrap_or(""));
    let input = PromptInput::Text {
        text,
        system: None,
        use_chat_template: true,
    };
    let (_, prompt) = build_prompt(&tokenizer, &input)?;

    // The prompt (all but its last token) is prefilled once; every run
    // resumes from a copy, so the rounds time decoding only.
    let cached = prompt.len() - 1;
    let mut base = model.make_caches();
    prefill(&model, &mut base, &prompt[..cached], 2048)?;

    let mut with = Run::default();
    let mut without = Run::default();
    let mut ratios = Vec::new();
    let mut mask_ms = Vec::new();
    let mut compute_ms = Vec::new();
    let mut commit_ms = Vec::new();
    let mut replay_ids = Vec::new();
    // Same options for both kinds: the only difference is the schema.
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };
    // A warm-up of each kind; the unconstrained runs then stop at the same
    // length as the constrained one, so both decode at the same context.
    let mut warm = Run::default();
    let mut constraint = engine.matcher(&spec)?;
    warm.run(
        &model,
        &tokenizer,
        &base,
        &prompt,
        &opts,
        Some(&mut constraint),
    )?;
    let free_opts = GenerateOptions {
        max_tokens: warm.tokens[0],
        ..opts.clone()
    };
    warm.run(&model, &tokenizer, &base, &prompt, &free_opts, None)?;
    for round in 0..args.rounds {
        // Alternate which kind goes first, so order effects cancel.
        let constrained_first = round % 2 == 0;
        if !constrained_first {
            without.run(&model, &tokenizer, &base, &prompt, &free_opts, None)?;
        }
        let mut constraint = engine.matcher(&spec)?;
        let (text, ids) = with.run(
            &model,
            &tokenizer,
            &base,
            &prompt,
            &opts,
            Some(&mut constraint),
        )?;
        serde_json::from_str::<Value>(&text)
            .with_context(|| format!("constrained output is not JSON: {text}"))?;
        replay_ids = ids;
        mask_ms.extend(constraint.mask_times().iter().map(|&d| ms(d)));
        compute_ms.extend(constraint.compute_times().iter().map(|&d| ms(d)));
        commit_ms.extend(constraint.commit_times().iter().map(|&d| ms(d)));
        if constrained_first {
            without.run(&model, &tokenizer, &base, &prompt, &free_opts, None)?;
        }
        let (w, wo) = (*with.tps.last().unwrap(), *without.tps.last().unwrap());
        ratios.push(w / wo);
        println!(
            "round {}: with schema {} tokens {w:.2} tok/s; without {} tokens {wo:.2} tok/s",
            round + 1,
            with.tokens.last().unwrap(),
            without.tokens.last().unwrap(),
        );
    }
    let step_with = quantile(&with.steps_ms, 0.5);
    let step_without = quantile(&without.steps_ms, 0.5);
    let step_overhead = (step_with - step_without) / step_without * 100.0;
    let ratio = quantile(&ratios, 0.5);
    let (w, wo) = (quantile(&with.tps, 0.5), quantile(&without.tps, 0.5));
    let mask_med = quantile(&mask_ms, 0.5);
    println!(
        "mask per token ({} masks): median {mask_med:.3} ms, p99 {:.3} ms, max {:.3} ms; median mask / median step = {:.2}%",
        mask_ms.len(),
        quantile(&mask_ms, 0.99),
        quantile(&mask_ms, 1.0),
        mask_med / step_without * 100.0
    );
    println!(
        "  of which the grammar: median {:.3} ms, p99 {:.3} ms",
        quantile(&compute_ms, 0.5),
        quantile(&compute_ms, 0.99)
    );
    let commit_med = quantile(&commit_ms, 0.5);
    println!(
        "commit per token: median {commit_med:.3} ms, p99 {:.3} ms, max {:.3} ms",
        quantile(&commit_ms, 0.99),
        quantile(&commit_ms, 1.0)
    );
    println!(
        "constraint host time per token (mask + commit medians): {:.3} ms = {:.2}% of the median step without schema",
        mask_med + commit_med,
        (mask_med + commit_med) / step_without * 100.0
    );
    println!(
        "decode step ({} steps each): median with schema {step_with:.1} ms, without {step_without:.1} ms, overhead {step_overhead:.1}%; mean with {:.1} ms, without {:.1} ms",
        with.steps_ms.len(),
        mean(&with.steps_ms),
        mean(&without.steps_ms)
    );
    println!(
        "decode ({} prompt tokens, {} interleaved rounds): median with schema {w:.2} tok/s, without {wo:.2} tok/s; median paired ratio {ratio:.3} (overhead {:.1}%)",
        prompt.len(),
        args.rounds,
        (1.0 - ratio) * 100.0
    );
    let replay = replay(&engine, &spec, &replay_ids, model.vocab_size())?;
    let report = json!({
        "replay": replay,
        "model": dir.display().to_string(),
        "token_env_ms": env_ms,
        "compile": compile,
        "mask_ms": {"count": mask_ms.len(), "median": mask_med,
                    "p99": quantile(&mask_ms, 0.99), "max": quantile(&mask_ms, 1.0),
                    "grammar_median": quantile(&compute_ms, 0.5),
                    "grammar_p99": quantile(&compute_ms, 0.99)},
        "host_ms_per_token": mask_med + commit_med,
        "commit_ms": {"median": commit_med, "p99": quantile(&commit_ms, 0.99),
                      "max": quantile(&commit_ms, 1.0)},
        "decode": {"case": args.case, "prompt_tokens": prompt.len(),
                   "generated_with": with.tokens, "generated_without": without.tokens,
                   "rounds": args.rounds,
                   "step_ms_with": step_with, "step_ms_without": step_without,
                   "step_overhead_pct": step_overhead,
                   "with_schema_tps": w, "without_schema_tps": wo,
                   "paired_ratio_median": ratio, "paired_overhead_pct": (1.0 - ratio) * 100.0,
                   "with_all": with.tps, "without_all": without.tps},
    });
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
