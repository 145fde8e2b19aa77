//! Structured-output benchmark: grammar compile time cold vs cached, mask
//! time per token, and decode speed with vs without a JSON schema on the
//! same prompt (runs interleaved). Run through `scripts/bench-grammar.sh`.
//!
//! Arguments: `[--model DIR] [--rounds N] [--max-tokens N] [--case NAME]`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mlx_bun::constraint::TokenConstraint;
use mlx_bun::generate::{generate, GenerateOptions};
use mlx_bun::grammar::{clear_cache, ConstraintSpec, GrammarEngine};
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
        rounds: 7,
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

    // Unconstrained runs must produce as many tokens: ban end-of-sequence.
    let mut free_sampling = SamplingParams::greedy();
    for &eos in &tokenizer.eos_ids {
        free_sampling.logit_bias.insert(eos, -1e9);
    }
    let mut with_tps = Vec::new();
    let mut without_tps = Vec::new();
    let mut mask_ms = Vec::new();
    let mut tokens = 0;
    for round in 0..args.rounds {
        let mut constraint = engine.matcher(&spec)?;
        let opts = GenerateOptions {
            max_tokens: args.max_tokens,
            sampling: SamplingParams::greedy(),
            ..GenerateOptions::default()
        };
        let mut caches = model.make_caches();
        let with = generate(
            &model,
            &tokenizer,
            &mut caches,
            &prompt,
            0,
            &opts,
            Some(&mut constraint as &mut dyn TokenConstraint),
            &mut |_| true,
        )?;
        serde_json::from_str::<Value>(&with.text)
            .with_context(|| format!("constrained output is not JSON: {}", with.text))?;
        mask_ms.extend(constraint.mask_times().iter().map(|&d| ms(d)));
        tokens = with.generation_tokens;

        let opts = GenerateOptions {
            max_tokens: with.generation_tokens,
            sampling: free_sampling.clone(),
            ..GenerateOptions::default()
        };
        let mut caches = model.make_caches();
        let without = generate(
            &model,
            &tokenizer,
            &mut caches,
            &prompt,
            0,
            &opts,
            None,
            &mut |_| true,
        )?;
        println!(
            "round {}: with schema {} tokens {:.2} tok/s; without {} tokens {:.2} tok/s",
            round + 1,
            with.generation_tokens,
            with.generation_tps,
            without.generation_tokens,
            without.generation_tps
        );
        with_tps.push(with.generation_tps);
        without_tps.push(without.generation_tps);
    }
    let (w, wo) = (quantile(&with_tps, 0.5), quantile(&without_tps, 0.5));
    let overhead = (wo - w) / wo * 100.0;
    // The best round of each is the least disturbed by other load.
    let (wb, wob) = (quantile(&with_tps, 1.0), quantile(&without_tps, 1.0));
    let best_overhead = (wob - wb) / wob * 100.0;
    println!(
        "mask per token ({} masks): median {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        mask_ms.len(),
        quantile(&mask_ms, 0.5),
        quantile(&mask_ms, 0.99),
        quantile(&mask_ms, 1.0)
    );
    println!(
        "decode ({} prompt tokens, {tokens} generated, median of {} interleaved rounds): with schema {w:.2} tok/s, without {wo:.2} tok/s, overhead {overhead:.1}%",
        prompt.len(),
        args.rounds
    );
    println!(
        "decode, best round of each: with schema {wb:.2} tok/s, without {wob:.2} tok/s, overhead {best_overhead:.1}%"
    );
    let report = json!({
        "model": dir.display().to_string(),
        "token_env_ms": env_ms,
        "compile": compile,
        "mask_ms": {"count": mask_ms.len(), "median": quantile(&mask_ms, 0.5),
                    "p99": quantile(&mask_ms, 0.99), "max": quantile(&mask_ms, 1.0)},
        "decode": {"case": args.case, "prompt_tokens": prompt.len(), "generated_tokens": tokens,
                   "rounds": args.rounds, "with_schema_tps": w, "without_schema_tps": wo,
                   "overhead_pct": overhead, "best_with_tps": wb, "best_without_tps": wob,
                   "best_overhead_pct": best_overhead, "with_all": with_tps, "without_all": without_tps},
    });
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
