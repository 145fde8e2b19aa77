//! `mlx-bun bench generate`: mlx-lm's `mlx_lm.benchmark` for one sequence.
//! A random prompt of `-p` tokens drawn as mlx-lm draws it (`mx.random.seed(0)`,
//! then `randint` over the vocabulary), `-g` generated tokens with
//! end-of-sequence ignored, one untimed warm-up, then `-n` timed trials,
//! printed in mlx-lm's format (`Trial i:  prompt_tps=…`) or as JSON lines.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use mlx_bun::evaldb::{EvalDb, Metric, RunMeta};
use mlx_bun::generate::{GenerateOptions, GenerationResult};
use mlx_bun::runtime::{Runtime, RuntimeSpec};
use mlx_bun::tokenizer::Tokenizer;
use mlx_rs::random;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// Length of the prompt, in tokens.
    #[arg(long, short = 'p', default_value_t = 512, value_parser = crate::validate::at_least_one)]
    prompt_tokens: usize,
    /// Tokens to generate (end-of-sequence does not stop them).
    #[arg(long, short = 'g', default_value_t = 1024, value_parser = crate::validate::at_least_one)]
    generation_tokens: usize,
    /// Timed trials after the warm-up.
    #[arg(long, short = 'n', default_value_t = 5, value_parser = crate::validate::at_least_one)]
    num_trials: usize,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 2048, value_parser = crate::validate::at_least_one)]
    prefill_step_size: usize,
    /// Print JSON lines instead of mlx-lm's: the prompt drawn, then one
    /// object per trial.
    #[arg(long)]
    json: bool,
    /// Do not record the run in the eval database.
    #[arg(long)]
    no_db: bool,
}

/// The prompt `mlx_lm.benchmark` draws: the first draw after `mx.random.seed(0)`.
fn random_prompt(vocab_size: usize, len: usize) -> Result<Vec<u32>> {
    if vocab_size == 0 || vocab_size > i32::MAX as usize {
        bail!("the model's vocabulary size {vocab_size} cannot be drawn from");
    }
    let (_, draw) = random::split(&random::key(0)?, 2)?;
    let tokens = random::randint::<_, i32>(0, vocab_size as i32, &[1, len as i32][..], &draw)?;
    Ok(tokens.as_slice::<i32>().iter().map(|&t| t as u32).collect())
}

pub fn run(args: Args) -> Result<()> {
    let dir = crate::model_arg::resolve(args.model.as_deref())?;
    let mut tokenizer = Tokenizer::load(&dir)?;
    // As mlx_lm.benchmark: every run generates exactly -g tokens.
    tokenizer.eos_ids.clear();
    let spec = RuntimeSpec::new(dir.clone(), args.compute.dtype);
    let runtime = Runtime::assemble(&spec, tokenizer)?;
    let prompt = random_prompt(runtime.model.vocab_size(), args.prompt_tokens)?;
    let opts = GenerateOptions {
        max_tokens: args.generation_tokens,
        prefill_step: args.prefill_step_size,
        ..GenerateOptions::default()
    };
    let once = || -> Result<(GenerationResult, f64)> {
        let mut caches = runtime.make_caches()?;
        let started = Instant::now();
        let result = mlx_bun::decode::generate(
            &runtime.model,
            &runtime.tokenizer,
            &mut caches,
            &prompt[..],
            &opts,
            None,
            &mut |_| true,
        )?;
        Ok((result, started.elapsed().as_secs_f64()))
    };
    let mut out = std::io::stdout();
    if args.json {
        writeln!(out, "{}", serde_json::json!({ "prompt": prompt }))?;
    } else {
        writeln!(out, "Running warmup..")?;
    }
    once()?;
    let db = if args.no_db {
        None
    } else {
        let db = EvalDb::open(&mlx_bun::evaldb::default_path())?;
        let flags = serde_json::json!({
            "prompt_tokens": args.prompt_tokens,
            "generation_tokens": args.generation_tokens,
            "num_trials": args.num_trials,
            "prefill_step_size": args.prefill_step_size,
        });
        let meta = RunMeta::detect(Some(&dir));
        let id = db.start_run_with(
            "bench",
            Some("generate"),
            &dir.display().to_string(),
            &flags,
            &meta,
        )?;
        Some((db, id))
    };
    if !args.json {
        writeln!(
            out,
            "Timing with prompt_tokens={}, generation_tokens={}, batch_size=1.",
            args.prompt_tokens, args.generation_tokens
        )?;
    }
    let (mut prompt_sum, mut gen_sum, mut peak_sum) = (0.0, 0.0, 0.0);
    for trial in 1..=args.num_trials {
        let (result, total) = once()?;
        if result.generation_tokens != args.generation_tokens {
            bail!(
                "trial {trial} generated {} tokens, not {}",
                result.generation_tokens,
                args.generation_tokens
            );
        }
        let peak_gb = result.peak_memory_bytes as f64 / 1e9;
        prompt_sum += result.prompt_tps;
        gen_sum += result.generation_tps;
        peak_sum += peak_gb;
        if let Some((db, id)) = &db {
            db.record_metrics(
                *id,
                &[
                    Metric {
                        name: "prompt_tps",
                        value: result.prompt_tps,
                        unit: "tok/s",
                        higher_is_better: Some(true),
                    },
                    Metric {
                        name: "generation_tps",
                        value: result.generation_tps,
                        unit: "tok/s",
                        higher_is_better: Some(true),
                    },
                ],
            )?;
        }
        if args.json {
            let row = serde_json::json!({
                "trial": trial,
                "prompt_tps": result.prompt_tps,
                "generation_tps": result.generation_tps,
                "peak_memory": peak_gb,
                "total_time": total,
            });
            writeln!(out, "{row}")?;
        } else {
            writeln!(
                out,
                "Trial {trial}:  prompt_tps={:.3}, generation_tps={:.3}, peak_memory={peak_gb:.3}, total_time={total:.3}",
                result.prompt_tps, result.generation_tps
            )?;
        }
    }
    let n = args.num_trials as f64;
    if !args.json {
        writeln!(
            out,
            "Averages: prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
            prompt_sum / n,
            gen_sum / n,
            peak_sum / n
        )?;
    }
    if let Some((db, id)) = &db {
        db.finish_run(*id, "done", &serde_json::json!({}))?;
    }
    Ok(())
}
