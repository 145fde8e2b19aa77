//! `mlx-bun evals`: list, show and compare the runs in the eval database;
//! import samples measured by a script; render a run as Markdown tables.

mod report;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_bun::evaldb::{compare, CompareRule, EvalDb, MetricComparison, RunRow, Verdict};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db).
    #[arg(long, global = true)]
    db: Option<PathBuf>,
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// The newest runs, one line each.
    List {
        /// Only runs of this kind (bench, sft, orpo, perplexity, evaluate, ...).
        #[arg(long)]
        kind: Option<String>,
        #[arg(long, default_value_t = 30)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// One run: provenance, flags and every metric.
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Metric by metric, run B against baseline A; flags regressions.
    Compare {
        a: i64,
        b: i64,
        /// With repeated samples, a change must exceed K pooled standard deviations.
        #[arg(long, default_value_t = CompareRule::default().k)]
        k: f64,
        /// ... and this relative change (alone it decides for single samples).
        #[arg(long, default_value_t = CompareRule::default().threshold)]
        threshold: f64,
        /// Exit with status 1 when any metric regressed.
        #[arg(long)]
        check: bool,
        #[arg(long)]
        json: bool,
    },
    /// Record metric samples (JSON lines: name, value, unit, higher_is_better)
    /// as one run; prints its id.
    Import {
        /// The metric rows; a name repeated adds a sample.
        metrics: PathBuf,
        /// The run's kind (peers, bench, ...).
        #[arg(long)]
        kind: String,
        #[arg(long)]
        label: Option<String>,
        /// The model measured (a folder is fingerprinted).
        #[arg(long)]
        model: String,
        /// The run's flags, as a JSON object.
        #[arg(long, default_value = "{}")]
        flags: String,
        /// A folder of logs kept with the run (the end of each file).
        #[arg(long)]
        logs: Option<PathBuf>,
        /// A text file kept with the run (provenance: date, machine, command).
        #[arg(long)]
        note: Option<PathBuf>,
    },
    /// One run's metrics as Markdown tables: medians, spread, and
    /// mlx-bun's ratio to each other program.
    Report { id: i64 },
}

pub fn run(args: Args) -> Result<()> {
    let path = args.db.unwrap_or_else(mlx_bun::evaldb::default_path);
    let db = EvalDb::open(&path)?;
    match args.what {
        What::List { kind, limit, json } => list(&db, kind.as_deref(), limit, json),
        What::Show { id, json } => show(&db, id, json),
        What::Compare {
            a,
            b,
            k,
            threshold,
            check,
            json,
        } => {
            if !(k >= 0.0 && threshold >= 0.0) {
                bail!("--k and --threshold must be 0 or more");
            }
            let regressions = compare_runs(&db, a, b, CompareRule { k, threshold }, json)?;
            if check && regressions > 0 {
                bail!("{regressions} metric(s) regressed from run {a} to run {b}");
            }
            Ok(())
        }
        What::Import {
            metrics,
            kind,
            label,
            model,
            flags,
            logs,
            note,
        } => {
            let flags: serde_json::Value =
                serde_json::from_str(&flags).context("--flags is not JSON")?;
            if !flags.is_object() {
                bail!("--flags must be a JSON object");
            }
            let id = report::import(
                &db,
                &report::Import {
                    metrics: &metrics,
                    kind: &kind,
                    label: label.as_deref(),
                    model: &model,
                    flags,
                    logs: logs.as_deref(),
                    note: note.as_deref(),
                },
            )?;
            println!("{id}");
            Ok(())
        }
        What::Report { id } => {
            let run = get(&db, id)?;
            print!("{}", report::render(&run, &db.metrics(id)?));
            Ok(())
        }
    }
}

fn time(t: f64) -> String {
    let secs = t as i64;
    let (y, m, d) = crate::bench::civil_date(secs);
    let rem = secs.rem_euclid(86400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}

fn short(s: &Option<String>, n: usize) -> String {
    s.as_deref()
        .map(|s| s.chars().take(n).collect())
        .unwrap_or_else(|| "-".into())
}

fn model_name(m: &str) -> String {
    std::path::Path::new(m)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| m.to_string())
}

fn list(db: &EvalDb, kind: Option<&str>, limit: usize, json: bool) -> Result<()> {
    let runs = db.list(kind, limit)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(());
    }
    if runs.is_empty() {
        println!("no runs in {}", db.path().display());
        return Ok(());
    }
    println!(
        "{:>5}  {:<10} {:<36} {:<8} {:<16} {:>7}  {:<8} {:<24}",
        "id", "kind", "label", "status", "started (UTC)", "secs", "commit", "model"
    );
    for r in &runs {
        let secs = r
            .finished_at
            .map(|f| format!("{:.0}", f - r.started_at))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:>5}  {:<10} {:<36} {:<8} {:<16} {:>7}  {:<8} {:<24}",
            r.id,
            r.kind,
            short(&r.label, 36),
            r.status,
            time(r.started_at),
            secs,
            short(&r.git_commit, 8),
            model_name(&r.model)
        );
    }
    Ok(())
}

fn get(db: &EvalDb, id: i64) -> Result<RunRow> {
    db.get(id)?
        .with_context(|| format!("no run {id} in {}", db.path().display()))
}

fn show(db: &EvalDb, id: i64, json: bool) -> Result<()> {
    let run = get(db, id)?;
    let metrics = db.metrics(id)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"run": run, "metrics": metrics}))?
        );
        return Ok(());
    }
    println!("run {}  {}  {}", run.id, run.kind, run.status);
    if let Some(label) = &run.label {
        println!("label        {label}");
    }
    println!("model        {}", run.model);
    println!("fingerprint  {}", short(&run.model_fingerprint, 16));
    println!("host         {}", short(&run.host, 64));
    println!("commit       {}", short(&run.git_commit, 40));
    println!("started      {} UTC", time(run.started_at));
    if let Some(f) = run.finished_at {
        println!("finished     {} UTC ({:.1} s)", time(f), f - run.started_at);
    }
    println!("flags        {}", run.flags);
    if !run.summary.is_null() {
        println!("summary      {}", run.summary);
    }
    if !metrics.is_empty() {
        println!();
        println!(
            "{:<40} {:>14} {:>12} {:>4} {:<8}",
            "metric", "mean", "std", "n", "unit"
        );
        for m in &metrics {
            println!(
                "{:<40} {:>14} {:>12} {:>4} {:<8}",
                m.name,
                fmt_opt(Some(m.mean())),
                fmt_opt(Some(m.std_dev())),
                m.samples.len(),
                m.unit
            );
        }
    }
    Ok(())
}

fn fmt_opt(x: Option<f64>) -> String {
    match x {
        Some(x) if x.abs() >= 1e4 => format!("{x:.0}"),
        Some(x) => format!("{x:.4}"),
        None => "-".into(),
    }
}

fn compare_runs(db: &EvalDb, a: i64, b: i64, rule: CompareRule, json: bool) -> Result<usize> {
    let (ra, rb) = (get(db, a)?, get(db, b)?);
    let rows: Vec<MetricComparison> = compare(&db.metrics(a)?, &db.metrics(b)?, rule);
    let regressions = rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regression)
        .count();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "a": ra, "b": rb, "rule": rule, "regressions": regressions, "metrics": rows,
            }))?
        );
        return Ok(regressions);
    }
    if ra.model_fingerprint != rb.model_fingerprint {
        println!("note: the runs used different models");
    }
    println!(
        "run {a} ({}) -> run {b} ({}); rule: > {}σ and > {:.0}%",
        ra.label.as_deref().unwrap_or(&ra.kind),
        rb.label.as_deref().unwrap_or(&rb.kind),
        rule.k,
        rule.threshold * 100.0
    );
    println!(
        "{:<40} {:>12} {:>12} {:>9} {:>7}  verdict",
        "metric", "A", "B", "change", "σ"
    );
    for r in &rows {
        let change = r
            .relative_change
            .map(|c| format!("{:+.1}%", c * 100.0))
            .unwrap_or_else(|| "-".into());
        let sigmas = r
            .sigmas
            .map(|s| format!("{s:.1}"))
            .unwrap_or_else(|| "-".into());
        let verdict = match r.verdict {
            Verdict::Same => "same",
            Verdict::Better => "better",
            Verdict::Regression => "REGRESSION",
            Verdict::Changed => "changed",
            Verdict::Missing => "missing",
        };
        println!(
            "{:<40} {:>12} {:>12} {:>9} {:>7}  {verdict}",
            r.name,
            fmt_opt(r.a_mean),
            fmt_opt(r.b_mean),
            change,
            sigmas
        );
    }
    println!("{regressions} regression(s)");
    Ok(regressions)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::time(0.0), "1970-01-01 00:00");
        assert_eq!(super::time(1_764_554_400.0), "2025-12-01 02:00");
    }
}
