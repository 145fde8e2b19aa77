//! `mlx-bun evaluate`: lm-evaluation-harness tasks as `mlx_lm.evaluate` runs
//! them (multiple-choice log-likelihood, rolling log-likelihood, generation
//! until a stop string), from local files.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_bun::eval::{generate_until, rolling, tasks};
use mlx_bun::evaldb::{EvalDb, Metric};
use mlx_bun::model::Model;
use mlx_bun::runtime::{Runtime, RuntimeSpec};
use mlx_bun::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded model).
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// Tasks, comma-separated: arc_easy, arc_challenge, hellaswag, piqa, mmlu
    /// (multiple choice), wikitext (rolling log-likelihood), gsm8k
    /// (generation); each read from <task-dir>/<task>.jsonl, or TASK=FILE.
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
    /// Most tokens generated per answer in generation tasks (gsm8k).
    #[arg(long, default_value_t = generate_until::DEFAULT_MAX_GEN_TOKENS,
          value_parser = crate::validate::at_least_one)]
    max_tokens: usize,
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

/// A task's inputs, by the harness's request type.
enum Loaded {
    Choice(Vec<tasks::Item>),
    Rolling(Vec<String>),
    Generate(Vec<generate_until::GenItem>),
}

fn load(name: &str, file: &std::path::Path, a: &Args) -> Result<Loaded> {
    Ok(if rolling::TASKS.contains(&name) {
        Loaded::Rolling(rolling::load_docs(name, file, a.limit)?)
    } else if generate_until::TASKS.contains(&name) {
        Loaded::Generate(generate_until::load_items(
            name,
            file,
            a.num_shots,
            a.seed,
            a.limit,
        )?)
    } else if tasks::TASKS.contains(&name) {
        Loaded::Choice(tasks::load_task_seeded(
            name,
            file,
            a.num_shots,
            a.seed,
            a.limit,
        )?)
    } else {
        let known: Vec<&str> = tasks::TASKS
            .iter()
            .chain(&rolling::TASKS)
            .chain(&generate_until::TASKS)
            .copied()
            .collect();
        bail!("unknown task {name:?} (known: {})", known.join(", "));
    })
}

/// One task's scores: its metrics (name, value, higher is better), a line
/// for the terminal, and the full result for `--json`.
struct Scored {
    metrics: Vec<(String, f64, bool)>,
    line: String,
    brief: serde_json::Value,
    full: serde_json::Value,
}

fn score(
    name: &str,
    loaded: &Loaded,
    model: &Model,
    tok: &Tokenizer,
    a: &Args,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Scored> {
    Ok(match loaded {
        Loaded::Choice(items) => {
            let r = tasks::evaluate(name, model, tok, items, progress)?;
            Scored {
                metrics: vec![
                    (format!("{name}/acc"), r.acc, true),
                    (format!("{name}/acc_norm"), r.acc_norm, true),
                ],
                line: format!(
                    "{name}: acc {:.4} ± {:.4}, acc_norm {:.4} ± {:.4} ({} items)",
                    r.acc, r.acc_stderr, r.acc_norm, r.acc_norm_stderr, r.items
                ),
                brief: serde_json::json!({"task": r.task, "items": r.items, "acc": r.acc,
                    "acc_stderr": r.acc_stderr, "acc_norm": r.acc_norm,
                    "acc_norm_stderr": r.acc_norm_stderr}),
                full: serde_json::to_value(&r)?,
            }
        }
        Loaded::Rolling(docs) => {
            let r = rolling::evaluate(name, model, tok, docs, progress)?;
            Scored {
                metrics: vec![
                    (format!("{name}/word_perplexity"), r.word_perplexity, false),
                    (format!("{name}/byte_perplexity"), r.byte_perplexity, false),
                    (format!("{name}/bits_per_byte"), r.bits_per_byte, false),
                ],
                line: format!(
                    "{name}: word_perplexity {:.4}, byte_perplexity {:.4}, bits_per_byte {:.4} ({} documents)",
                    r.word_perplexity, r.byte_perplexity, r.bits_per_byte, r.docs
                ),
                brief: serde_json::json!({"task": r.task, "docs": r.docs,
                    "word_perplexity": r.word_perplexity, "byte_perplexity": r.byte_perplexity,
                    "bits_per_byte": r.bits_per_byte}),
                full: serde_json::to_value(&r)?,
            }
        }
        Loaded::Generate(items) => {
            let r = generate_until::evaluate(name, model, tok, items, a.max_tokens, progress)?;
            let parts: Vec<String> = r
                .exact_match
                .iter()
                .map(|(f, v, se)| format!("exact_match,{f} {v:.4} ± {se:.4}"))
                .collect();
            let mut brief = serde_json::json!({"task": r.task, "items": r.items});
            for (f, v, se) in &r.exact_match {
                brief[format!("exact_match,{f}")] = serde_json::json!(v);
                brief[format!("exact_match_stderr,{f}")] = serde_json::json!(se);
            }
            Scored {
                metrics: r
                    .exact_match
                    .iter()
                    .map(|(f, v, _)| (format!("{name}/exact_match,{f}"), *v, true))
                    .collect(),
                line: format!("{name}: {} ({} items)", parts.join(", "), r.items),
                brief,
                full: serde_json::to_value(&r)?,
            }
        }
    })
}

pub fn run(a: Args) -> Result<()> {
    let model_dir = crate::model_arg::resolve(a.model.as_deref())?;
    let mut loaded = Vec::new();
    for spec in &a.tasks {
        let (name, file) = match spec.split_once('=') {
            Some((n, f)) => (n.to_string(), PathBuf::from(f)),
            None => (spec.clone(), a.task_dir.join(format!("{spec}.jsonl"))),
        };
        let task = load(&name, &file, &a).with_context(|| format!("task {name}"))?;
        loaded.push((name, task));
    }
    let spec = RuntimeSpec {
        materialize: false,
        ..RuntimeSpec::new(model_dir.clone(), a.compute.dtype)
    };
    let runtime = Runtime::assemble(&spec, Tokenizer::load(&model_dir)?)?;
    let (model, tok) = (&runtime.model, &*runtime.tokenizer);
    let db = if a.no_db {
        None
    } else {
        Some(EvalDb::open(
            &a.db.clone().unwrap_or_else(mlx_bun::evaldb::default_path),
        )?)
    };
    let flags = serde_json::json!({
        "tasks": a.tasks, "task_dir": a.task_dir, "num_shots": a.num_shots, "seed": a.seed,
        "limit": a.limit, "batch_size": a.batch_size, "max_tokens": a.max_tokens,
    });
    let run_id = match &db {
        Some(db) => Some(db.start_run("evaluate", &model_dir.display().to_string(), &flags)?),
        None => None,
    };
    let (mut results, mut briefs) = (Vec::new(), Vec::new());
    for (name, task) in &loaded {
        let unit = match task {
            Loaded::Choice(_) => "contexts",
            Loaded::Rolling(_) => "documents",
            Loaded::Generate(_) => "answers",
        };
        let bar = crate::progress::bar(
            &format!("{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{elapsed}}"),
            0,
            !a.json,
        );
        bar.set_prefix(name.clone());
        let r = score(name, task, model, tok, &a, &mut |done, total| {
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
            let metrics: Vec<Metric> = r
                .metrics
                .iter()
                .map(|(n, v, up)| Metric {
                    name: n,
                    value: *v,
                    unit: "",
                    higher_is_better: Some(*up),
                })
                .collect();
            db.record_metrics(run, &metrics)?;
        }
        if !a.json {
            println!("{}", r.line);
        }
        results.push(r.full);
        briefs.push(r.brief);
    }
    let mut summary = serde_json::json!({ "results": results });
    if a.num_shots > 0 {
        // Each item's few-shot rows (0-based, file order), per multiple-choice task.
        let shots: serde_json::Map<String, serde_json::Value> = loaded
            .iter()
            .filter_map(|(name, task)| match task {
                Loaded::Choice(items) => {
                    let rows: Vec<&Vec<usize>> = items.iter().map(|i| &i.shots).collect();
                    Some((name.clone(), serde_json::json!(rows)))
                }
                _ => None,
            })
            .collect();
        summary["fewshot"] = serde_json::Value::Object(shots);
    }
    if let (Some(db), Some(run)) = (&db, run_id) {
        db.finish_run(run, "done", &serde_json::json!({ "results": briefs }))?;
    }
    if a.json {
        println!("{summary}");
    }
    Ok(())
}
