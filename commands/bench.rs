//! `mlx-bun bench`: micro-benchmarks of the engine on a real model.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use mlx_bun::model::Model;
use mlx_rs::transforms::eval;
use mlx_rs::Array;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
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
    },
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::Forward {
            model,
            lengths,
            context,
            runs,
            json,
        } => forward(model.as_deref(), &lengths, context, runs, json),
    }
}

fn forward(
    model: Option<&str>,
    lengths: &[usize],
    context: usize,
    runs: usize,
    json: bool,
) -> Result<()> {
    let dir = crate::model_arg::resolve(model)?;
    let model = Model::load(&dir)?;
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
    Ok(())
}
