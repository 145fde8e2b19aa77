//! `mlx-bun manage`: list and delete models in the Hugging Face Hub cache
//! (as `mlx_lm.manage`).

use std::io::{BufRead, Write};
use std::time::SystemTime;

use anyhow::{Context, Result};
use mlx_bun::hub::{scan_cache, CachedRepo};

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("action").required(true))]
pub struct Args {
    /// List the cached repos whose id contains --pattern.
    #[arg(long, group = "action")]
    scan: bool,
    /// Delete the cached repos whose id contains this pattern (asks first).
    #[arg(long, group = "action", value_name = "PATTERN", num_args = 0..=1, default_missing_value = "")]
    delete: Option<String>,
    /// Repo ids must contain this (for --scan, and for --delete without a pattern).
    #[arg(long, default_value = "mlx")]
    pattern: String,
    /// Delete without asking.
    #[arg(long, short = 'y')]
    yes: bool,
}

fn size_str(bytes: u64) -> String {
    let units = ["", "K", "M", "G", "T"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1}{}", units[unit])
}

fn ago(t: Option<SystemTime>) -> String {
    let Some(t) = t else { return "-".into() };
    let secs = SystemTime::now()
        .duration_since(t)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        0..=59 => "a few seconds ago".into(),
        60..=3599 => format!("{} minutes ago", secs / 60),
        3600..=86399 => format!("{} hours ago", secs / 3600),
        _ => format!("{} days ago", secs / 86400),
    }
}

fn table(rows: &[Vec<String>], headers: &[&str]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect::<Vec<_>>()
            .join(" ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![
        line(headers.iter().map(|h| h.to_string()).collect()),
        line(widths.iter().map(|w| "-".repeat(*w)).collect()),
    ];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

fn scan_rows(repos: &[CachedRepo]) -> Vec<Vec<String>> {
    repos
        .iter()
        .map(|r| {
            vec![
                r.repo_id.clone(),
                r.repo_type.to_string(),
                format!("{:>12}", size_str(r.size)),
                r.files.to_string(),
                ago(r.last_accessed),
                ago(r.last_modified),
                r.path.display().to_string(),
            ]
        })
        .collect()
}

pub fn run(args: Args) -> Result<()> {
    if args.scan {
        println!(
            "Scanning Hugging Face cache for models with pattern \"{}\".",
            args.pattern
        );
        let repos = scan_cache(&args.pattern)?;
        println!(
            "{}",
            table(
                &scan_rows(&repos),
                &[
                    "REPO ID",
                    "REPO TYPE",
                    "SIZE ON DISK",
                    "NB FILES",
                    "LAST_ACCESSED",
                    "LAST_MODIFIED",
                    "LOCAL PATH"
                ],
            )
        );
        return Ok(());
    }
    let pattern = match args.delete.as_deref() {
        Some("") | None => args.pattern.clone(),
        Some(p) => p.to_string(),
    };
    println!("Deleting models matching pattern \"{pattern}\"");
    let repos = scan_cache(&pattern)?;
    if repos.is_empty() {
        println!("No models found matching pattern \"{pattern}\"");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = repos
        .iter()
        .map(|r| {
            vec![
                r.repo_id.clone(),
                size_str(r.size),
                r.path.display().to_string(),
            ]
        })
        .collect();
    println!("\nFound the following models:");
    println!("{}", table(&rows, &["REPO ID", "SIZE", "LOCAL PATH"]));
    if !args.yes && !confirm("\nAre you sure you want to delete these models?")? {
        println!("\nDeletion cancelled - no changes made.");
        return Ok(());
    }
    for repo in &repos {
        println!("\nDeleting {}...", repo.repo_id);
        std::fs::remove_dir_all(&repo.path)
            .with_context(|| format!("deleting {}", repo.path.display()))?;
    }
    println!("\nModel(s) deleted successfully.");
    Ok(())
}

fn confirm(message: &str) -> Result<bool> {
    let stdin = std::io::stdin();
    loop {
        print!("{message} (y/n) ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        if stdin.lock().read_line(&mut answer)? == 0 {
            return Ok(false);
        }
        match answer.trim().to_lowercase().as_str() {
            "y" | "yes" | "1" => return Ok(true),
            "n" | "no" | "0" | "" => return Ok(false),
            _ => println!("Invalid input. Must be one of: yes/no/y/n or empty for no"),
        }
    }
}
