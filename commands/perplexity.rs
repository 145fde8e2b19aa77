//! `mlx-bun perplexity`: perplexity of a model on text, as `mlx_lm.perplexity`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use mlx_bun::eval::perplexity::{perplexity, token_rows, RowOptions};
use mlx_bun::evaldb::{EvalDb, Metric};
use mlx_bun::runtime::{Runtime, RuntimeSpec};
use mlx_bun::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded model).
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// Data to score: a plain-text file (one document), a JSONL or parquet
    /// file (text, chat `messages` or `prompt`/`completion` rows), a folder
    /// of such files, or a Hugging Face dataset id.
    #[arg(long, visible_alias = "data")]
    data_path: String,
    /// Tokens per row.
    #[arg(long, default_value_t = 512, value_parser = crate::validate::at_least_one)]
    sequence_length: usize,
    /// Rows to score (-1: every complete row of the data).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    num_samples: i64,
    /// Rows per forward pass.
    #[arg(long, default_value_t = 8, value_parser = crate::validate::at_least_one)]
    batch_size: usize,
    /// Seed of the document order (numpy's, as mlx_lm.perplexity).
    #[arg(long, default_value_t = 123)]
    seed: u32,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Do not record the run in the eval database.
    #[arg(long)]
    no_db: bool,
}

pub fn run(a: Args) -> Result<()> {
    let num_samples = match a.num_samples {
        -1 => None,
        n if n > 0 => Some(n as usize),
        n => anyhow::bail!("--num-samples must be positive or -1 (all), got {n}"),
    };
    let model_dir = crate::model_arg::resolve(a.model.as_deref())?;
    let tok = Arc::new(Tokenizer::load(&model_dir)?);
    let records = mlx_bun::eval::data::load_records(&a.data_path)?;
    let rows = token_rows(
        &tok,
        &records,
        &RowOptions {
            sequence_length: a.sequence_length,
            num_samples,
            seed: a.seed.into(),
        },
    )?;
    let spec = RuntimeSpec {
        materialize: false,
        ..RuntimeSpec::new(model_dir.clone(), a.compute.dtype)
    };
    let model = Runtime::assemble(&spec, tok)?.model;
    let flags = serde_json::json!({
        "data_path": a.data_path,
        "sequence_length": a.sequence_length,
        "num_samples": a.num_samples,
        "batch_size": a.batch_size,
        "seed": a.seed,
    });
    let db = if a.no_db {
        None
    } else {
        Some(EvalDb::open(
            &a.db.clone().unwrap_or_else(mlx_bun::evaldb::default_path),
        )?)
    };
    let run_id = match &db {
        Some(db) => Some(db.start_run("perplexity", &model_dir.display().to_string(), &flags)?),
        None => None,
    };

    let bar = crate::progress::bar(
        "perplexity [{bar:30}] {pos}/{len} batches {elapsed}",
        rows.len().div_ceil(a.batch_size) as u64,
        !a.json,
    );
    let started = std::time::Instant::now();
    let result = perplexity(&model, &rows, a.batch_size, &mut |done, _| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    let result = match result {
        Ok(r) => r,
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
    let seconds = started.elapsed().as_secs_f64();
    if let (Some(db), Some(run)) = (&db, run_id) {
        db.record_metrics(
            run,
            &[
                Metric {
                    name: "perplexity",
                    value: result.perplexity,
                    unit: "",
                    higher_is_better: Some(false),
                },
                Metric {
                    name: "perplexity_se",
                    value: result.standard_error,
                    unit: "",
                    higher_is_better: None,
                },
                Metric {
                    name: "tokens_per_sec",
                    value: result.tokens as f64 / seconds,
                    unit: "tok/s",
                    higher_is_better: Some(true),
                },
            ],
        )?;
        db.finish_run(run, "done", &serde_json::to_value(&result)?)?;
    }
    if a.json {
        let mut v = serde_json::to_value(&result)?;
        v["seconds"] = seconds.into();
        println!("{v}");
    } else {
        println!(
            "Perplexity: {:.3} ± {:.3}",
            result.perplexity, result.standard_error
        );
        println!(
            "{} rows of {} tokens, {} scored tokens, {:.1} s ({:.0} tok/s)",
            result.rows,
            result.sequence_length,
            result.tokens,
            seconds,
            result.tokens as f64 / seconds
        );
    }
    Ok(())
}
