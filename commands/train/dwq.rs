//! `mlx-bun train --method dwq`: distilled weight quantization (as `mlx_lm.dwq`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use mlx_bun::evaldb::{EvalDb, Metric, StepRow};
use mlx_bun::quant::QuantSpec;
use mlx_bun::train::dwq::{run as run_dwq, DwqOptions, Event};

use super::TrainArgs;

/// Flags only `--method dwq` reads (it also reads --model as the teacher,
/// --data, --adapter-path/--mlx-path, --batch-size, --learning-rate, --seed,
/// --max-seq-length, --steps-per-eval, --db, --no-db, --json).
#[derive(clap::Args)]
pub(super) struct DwqArgs {
    /// dwq: an already quantized student (default: the teacher quantized
    /// with --bits and --group-size).
    #[arg(long)]
    quantized_model: Option<String>,
    /// dwq: bits per weight of the student.
    #[arg(long, default_value_t = 4)]
    bits: i32,
    /// dwq: quantization group size of the student.
    #[arg(long, default_value_t = 64)]
    group_size: i32,
    /// dwq: training documents to use. Default 2048.
    #[arg(long)]
    num_samples: Option<usize>,
    /// dwq: held-out documents for validation. Default 32.
    #[arg(long)]
    num_valid_samples: Option<usize>,
    /// dwq: temperature of the distillation KL. Default 2.
    #[arg(long, value_parser = crate::validate::positive)]
    temperature: Option<f32>,
    /// dwq: teacher logits kept per position. Default 1024.
    #[arg(long)]
    top_k: Option<usize>,
    /// dwq: folder of the teacher's targets (computed there when missing).
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// dwq: compute the teacher's targets into --target-dir and stop.
    #[arg(long, requires = "target_dir")]
    targets_only: bool,
}

pub(super) fn run(a: TrainArgs) -> Result<()> {
    let d = &a.dwq;
    let defaults = DwqOptions::default();
    let teacher = crate::model_arg::resolve(a.model.as_deref())?;
    let quantized_model = d
        .quantized_model
        .as_deref()
        .map(mlx_bun::hub::resolve_model)
        .transpose()?;
    let opts = DwqOptions {
        teacher: teacher.clone(),
        quantized_model,
        spec: QuantSpec::affine(d.group_size, d.bits),
        data: a
            .data
            .as_ref()
            .context("--data is required (a text/JSONL file, a folder, or a dataset id)")?
            .display()
            .to_string(),
        mlx_path: a.adapter_path.clone().unwrap_or(defaults.mlx_path.clone()),
        num_samples: d.num_samples.unwrap_or(defaults.num_samples),
        num_valid_samples: d.num_valid_samples.unwrap_or(defaults.num_valid_samples),
        max_seq_length: a.max_seq_length.unwrap_or(defaults.max_seq_length),
        seed: a.seed.unwrap_or(defaults.seed),
        learning_rate: a.learning_rate.unwrap_or(defaults.learning_rate),
        batch_size: a.batch_size.unwrap_or(defaults.batch_size),
        temperature: d.temperature.unwrap_or(defaults.temperature),
        top_k: d.top_k.unwrap_or(defaults.top_k),
        target_dir: d.target_dir.clone(),
        targets_only: d.targets_only,
        steps_per_eval: a.steps_per_eval.unwrap_or(defaults.steps_per_eval),
    };
    if opts.quantized_model.is_none() {
        mlx_bun::convert::quantize::validate_spec(opts.spec)?;
    }
    let flags = serde_json::json!({
        "method": "dwq",
        "quantized_model": opts.quantized_model,
        "bits": opts.spec.bits,
        "group_size": opts.spec.group_size,
        "data": opts.data,
        "mlx_path": opts.mlx_path,
        "num_samples": opts.num_samples,
        "num_valid_samples": opts.num_valid_samples,
        "max_seq_length": opts.max_seq_length,
        "seed": opts.seed,
        "learning_rate": opts.learning_rate,
        "batch_size": opts.batch_size,
        "temperature": opts.temperature,
        "top_k": opts.top_k,
        "target_dir": opts.target_dir,
        "targets_only": opts.targets_only,
    });
    let db = if a.no_db || opts.targets_only {
        None
    } else {
        Some(EvalDb::open(
            &a.db.clone().unwrap_or_else(mlx_bun::evaldb::default_path),
        )?)
    };
    let run_id = match &db {
        Some(db) => Some(db.start_run("dwq", &teacher.display().to_string(), &flags)?),
        None => None,
    };

    let bar = crate::progress::bar("{prefix} [{bar:30}] {pos}/{len} {msg}", 0, !a.json);
    let mut stdout = std::io::stdout();
    let json = a.json;
    let mut on_event = |event: Event| -> Result<()> {
        match event {
            Event::Phase { name, total } => {
                bar.set_prefix(name.to_string());
                bar.set_length(total as u64);
                bar.set_position(0);
                bar.set_message("");
            }
            Event::Progress { done } => bar.set_position(done as u64),
            Event::Step { iter, loss, tokens } => {
                let line = serde_json::json!({"event": "step", "iter": iter, "loss": loss, "tokens": tokens});
                if let (Some(db), Some(run)) = (&db, run_id) {
                    db.record_step(
                        run,
                        &StepRow {
                            iter: iter as i64,
                            loss: loss as f64,
                            tokens: tokens as i64,
                            seconds: 0.0,
                            tokens_per_sec: 0.0,
                            learning_rate: opts.learning_rate,
                            peak_memory_bytes: 0,
                            metrics: line.clone(),
                        },
                    )?;
                }
                if json {
                    writeln!(stdout, "{line}")?;
                }
                bar.set_message(format!("loss {loss:.4}"));
                bar.set_position(iter as u64);
            }
            Event::Validation {
                iter,
                kl,
                perplexity,
            } => {
                let line = serde_json::json!({"event": "validation", "iter": iter, "kl": kl, "perplexity": perplexity});
                if let (Some(db), Some(run)) = (&db, run_id) {
                    db.record_eval(run, iter as i64, "valid", kl, 0.0, &line)?;
                }
                if json {
                    writeln!(stdout, "{line}")?;
                } else {
                    bar.println(format!(
                        "validation at step {iter}: KL to teacher {kl:.5}, perplexity {perplexity:.3}"
                    ));
                }
            }
        }
        Ok(())
    };
    let result = run_dwq(&opts, &mut on_event);
    bar.finish_and_clear();
    let summary = match result {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!(
                "wrote the teacher's targets to {}",
                opts.target_dir
                    .as_deref()
                    .unwrap_or(std::path::Path::new("?"))
                    .display()
            );
            return Ok(());
        }
        Err(e) => {
            if let (Some(db), Some(run)) = (&db, run_id) {
                let _ = db.finish_run(
                    run,
                    "failed",
                    &serde_json::json!({"error": format!("{e:#}")}),
                );
            }
            return Err(e);
        }
    };
    if let (Some(db), Some(run)) = (&db, run_id) {
        let m = |name, value| Metric {
            name,
            value,
            unit: "",
            higher_is_better: Some(false),
        };
        db.record_metrics(
            run,
            &[
                m("kl_before", summary.before.kl),
                m("kl_after", summary.after.kl),
                m("perplexity_before", summary.before.perplexity),
                m("perplexity_after", summary.after.perplexity),
            ],
        )?;
        db.finish_run(run, "done", &serde_json::to_value(&summary)?)?;
    }
    if summary.got_worse {
        eprintln!(
            "warning: the final validation KL {:.5} is worse than the initial {:.5}: \
             the model's quality has likely degraded",
            summary.after.kl, summary.before.kl
        );
    }
    if json {
        let mut v = serde_json::to_value(&summary)?;
        v["event"] = "done".into();
        println!("{v}");
    } else {
        println!(
            "KL to teacher {:.5} -> {:.5}, perplexity {:.3} -> {:.3} ({} steps, {} tokens, {:.0} s); wrote {}",
            summary.before.kl,
            summary.after.kl,
            summary.before.perplexity,
            summary.after.perplexity,
            summary.iters,
            summary.tokens,
            summary.seconds,
            summary.output.display()
        );
    }
    Ok(())
}
