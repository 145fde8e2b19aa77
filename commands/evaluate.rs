//! `mlx-bun evaluate`: multiple-choice tasks scored by log-likelihood (as
//! lm-evaluation-harness through `mlx_lm.evaluate`), from local files.

use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlx_bun::eval::tasks::{evaluate, load_task_seeded};
use mlx_bun::evaldb::{EvalDb, Metric};
use mlx_bun::model::Model;
use mlx_bun::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded model).
    #[arg(long, short)]
    model: Option<String>,
    /// Tasks, comma-separated: arc_easy, arc_challenge, hellaswag, piqa, mmlu;
    /// each read from <task-dir>/<task>.jsonl, or TASK=FILE for another file.
    #[arg(long, value_delimiter = ',', required = true)]
    tasks: Vec<String>,
    /// Folder of the task files.
    #[arg(long, default_value = ".")]
    task_dir: PathBuf,
    /// Solved examples before each question, drawn from the task file as
    /// lm-evaluation-harness draws them (MMLU: the first others of its subject).
    #[arg(long, default_value_t = 0)]
    num_shots: usize,
    /// Seed of the few-shot sampler (Python's `random.Random`, as mlx_lm.evaluate).
    #[arg(long, default_value_t = mlx_bun::eval::tasks::FEWSHOT_SEED)]
    seed: u64,
    /// Score at most this many items per task.
    #[arg(long, value_parser = crate::validate::at_least_one)]
    limit: Option<usize>,
    /// Accepted for mlx-lm compatibility; log-likelihood requests are scored
    /// one continuation at a time on the shared context's cache.
    #[arg(long, default_value_t = 8, value_parser = crate::validate::at_least_one)]
    batch_size: usize,
    /// Print the results as JSON (with every choice's log-likelihood).
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
    let model_dir = crate::model_arg::resolve(a.model.as_deref())?;
    let mut tasks = Vec::new();
    for spec in &a.tasks {
        let (name, file) = match spec.split_once('=') {
            Some((n, f)) => (n.to_string(), PathBuf::from(f)),
            None => (spec.clone(), a.task_dir.join(format!("{spec}.jsonl"))),
        };
        let items = load_task_seeded(&name, &file, a.num_shots, a.seed, a.limit)
            .with_context(|| format!("task {name}"))?;
        tasks.push((name, items));
    }
    let tok = Tokenizer::load(&model_dir)?;
    let model = Model::load(&model_dir)?;
    let db = if a.no_db {
        None
    } else {
        Some(EvalDb::open(
            &a.db.clone().unwrap_or_else(mlx_bun::evaldb::default_path),
        )?)
    };
    let flags = serde_json::json!({
        "tasks": a.tasks, "task_dir": a.task_dir, "num_shots": a.num_shots, "seed": a.seed,
        "limit": a.limit, "batch_size": a.batch_size,
    });
    let run_id = match &db {
        Some(db) => Some(db.start_run("evaluate", &model_dir.display().to_string(), &flags)?),
        None => None,
    };
    let mut results = Vec::new();
    for (name, items) in &tasks {
        let bar = ProgressBar::new(0);
        if a.json {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} contexts {elapsed}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(name.clone());
        let r = evaluate(name, &model, &tok, items, &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        });
        bar.finish_and_clear();
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                if let (Some(db), Some(run)) = (&db, run_id) {
                    let _ = db.finish_run(
                        run,
                        "failed",
                        &serde_json::json!({"error": format!("{e:#}")}),
                    );
                }
                return Err(e.context(format!("task {name}")));
            }
        };
        if let (Some(db), Some(run)) = (&db, run_id) {
            let acc = format!("{name}/acc");
            let acc_norm = format!("{name}/acc_norm");
            db.record_metrics(
                run,
                &[
                    Metric {
                        name: &acc,
                        value: r.acc,
                        unit: "",
                        higher_is_better: Some(true),
                    },
                    Metric {
                        name: &acc_norm,
                        value: r.acc_norm,
                        unit: "",
                        higher_is_better: Some(true),
                    },
                ],
            )?;
        }
        if !a.json {
            println!(
                "{name}: acc {:.4} ± {:.4}, acc_norm {:.4} ± {:.4} ({} items)",
                r.acc, r.acc_stderr, r.acc_norm, r.acc_norm_stderr, r.items
            );
        }
        results.push(r);
    }
    let mut summary = serde_json::json!({ "results": results });
    if a.num_shots > 0 {
        // Each item's few-shot rows (0-based, file order), per task.
        let shots: serde_json::Map<String, serde_json::Value> = tasks
            .iter()
            .map(|(name, items)| {
                let rows: Vec<&Vec<usize>> = items.iter().map(|i| &i.shots).collect();
                (name.clone(), serde_json::json!(rows))
            })
            .collect();
        summary["fewshot"] = serde_json::Value::Object(shots);
    }
    if let (Some(db), Some(run)) = (&db, run_id) {
        let brief: Vec<serde_json::Value> = results
            .iter()
            .map(|r| serde_json::json!({"task": r.task, "items": r.items, "acc": r.acc,
                "acc_stderr": r.acc_stderr, "acc_norm": r.acc_norm, "acc_norm_stderr": r.acc_norm_stderr}))
            .collect();
        db.finish_run(run, "done", &serde_json::json!({ "results": brief }))?;
    }
    if a.json {
        println!("{summary}");
    }
    Ok(())
}
