//! `mlx-bun bench`: micro-benchmarks of the engine on a real model, and the
//! serving feature matrix (`feature_matrix`).

mod feature_matrix;
mod plot;

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use mlx_bun::evaldb::{EvalDb, Metric, RunMeta};
use mlx_bun::model::Model;
use mlx_rs::transforms::eval;
use mlx_rs::Array;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
#[allow(clippy::large_enum_variant)]
enum What {
    /// Every serving feature combination against the real `mlx-bun serve`.
    FeatureMatrix(feature_matrix::Args),
    /// Time one forward pass over L new tokens after a fixed context.
    Forward {
        #[arg(long, short)]
        model: Option<String>,
        /// Comma-separated numbers of new tokens per forward pass.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = crate::validate::at_least_one)]
        lengths: Vec<usize>,
        /// Context already in the cache.
        #[arg(long, default_value_t = 64, value_parser = crate::validate::count)]
        context: usize,
        #[arg(long, default_value_t = 5, value_parser = crate::validate::at_least_one)]
        runs: usize,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Do not record the run in the eval database.
        #[arg(long)]
        no_db: bool,
    },
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::FeatureMatrix(args) => feature_matrix::run(args),
        What::Forward {
            model,
            lengths,
            context,
            runs,
            json,
            no_db,
        } => forward(model.as_deref(), &lengths, context, runs, json, no_db),
    }
}

fn forward(
    model: Option<&str>,
    lengths: &[usize],
    context: usize,
    runs: usize,
    json: bool,
    no_db: bool,
) -> Result<()> {
    if runs == 0 || lengths.contains(&0) {
        bail!("--runs and every --lengths entry must be at least 1");
    }
    let dir = crate::model_arg::resolve(model)?;
    let model = Model::load(&dir)?;
    let db = if no_db {
        None
    } else {
        let db = EvalDb::open(&mlx_bun::evaldb::default_path())?;
        let flags = serde_json::json!({"lengths": lengths, "context": context, "runs": runs});
        let meta = RunMeta::detect(Some(&dir));
        let id = db.start_run_with(
            "bench",
            Some("forward"),
            &dir.display().to_string(),
            &flags,
            &meta,
        )?;
        Some((db, id))
    };
    let ctx: Vec<u32> = (0..context as u32).map(|i| 100 + i % 1000).collect();
    let mut out = std::io::stdout();
    if !json {
        writeln!(
            out,
            "{:>6} {:>12} {:>14}",
            "tokens", "ms/forward", "ms/token"
        )?;
    }
    for &len in lengths {
        let mut times = Vec::new();
        for run in 0..runs + 1 {
            let mut caches = model.make_caches();
            mlx_bun::generate::prefill(&model, &mut caches, &ctx, 2048)?;
            let ids: Vec<i32> = (0..len as i32).map(|i| 200 + i).collect();
            let input = Array::from_slice(&ids, &[1, len as i32]);
            let t = Instant::now();
            let logits = model.forward(&input, &mut caches)?;
            eval([&logits])?;
            if run > 0 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        if let Some((db, id)) = &db {
            let name = format!("ms_per_forward.{len}");
            for &t in &times {
                db.record_metrics(
                    *id,
                    &[Metric {
                        name: &name,
                        value: t,
                        unit: "ms",
                        higher_is_better: Some(false),
                    }],
                )?;
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        if json {
            writeln!(
                out,
                "{}",
                serde_json::json!({"tokens": len, "ms_per_forward": median, "ms_per_token": median / len as f64})
            )?;
        } else {
            writeln!(out, "{len:>6} {median:>12.2} {:>14.2}", median / len as f64)?;
        }
    }
    if let Some((db, id)) = &db {
        db.finish_run(*id, "done", &serde_json::json!({}))?;
        if !json {
            writeln!(out, "recorded as run {id} in {}", db.path().display())?;
        }
    }
    Ok(())
}

/// Today's UTC date as YYYY-MM-DD (for report file names).
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (y, m, d) = civil_date(secs);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `(year, month, day)` in UTC of a Unix time (Howard Hinnant's algorithm).
pub fn civil_date(unix_secs: i64) -> (i64, i64, i64) {
    let z = unix_secs.div_euclid(86400) + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
