//! `mlx-bun evals import` and `mlx-bun evals report`: samples measured by a
//! script (`scripts/bench-peers.sh`) become a run of the eval database, and
//! a run's metrics become the Markdown tables docs/BENCHMARKS.md shows.
//!
//! Metric names of the form `<scenario>/<metric>/<program>` render as one
//! table per scenario (a row per program, a column per metric); any other
//! name renders in one plain table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use mlx_bun::evaldb::{EvalDb, Metric, MetricSeries, RunMeta, RunRow};
use serde_json::{json, Value};

/// The program the ratios are taken against.
const OURS: &str = "mlx-bun";
/// Bytes of each log kept in the run's summary (its end, where errors and totals are).
const LOG_TAIL_BYTES: usize = 16 * 1024;

/// What `evals import` records.
pub struct Import<'a> {
    pub metrics: &'a Path,
    pub kind: &'a str,
    pub label: Option<&'a str>,
    pub model: &'a str,
    pub flags: Value,
    pub logs: Option<&'a Path>,
    pub note: Option<&'a Path>,
}

/// One metric row of the imported file.
#[derive(Debug)]
struct Row {
    name: String,
    value: f64,
    unit: String,
    higher_is_better: Option<bool>,
}

fn parse_rows(text: &str, path: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let name = v["name"].as_str().filter(|n| !n.is_empty());
        let value = v["value"].as_f64().filter(|x| x.is_finite());
        let (Some(name), Some(value)) = (name, value) else {
            bail!(
                "{}: needs a non-empty \"name\" and a finite \"value\"",
                at()
            );
        };
        let higher_is_better = match &v["higher_is_better"] {
            Value::Bool(b) => Some(*b),
            Value::Null => None,
            other => bail!(
                "{}: \"higher_is_better\" is {other}, not true, false or null",
                at()
            ),
        };
        rows.push(Row {
            name: name.to_string(),
            value,
            unit: v["unit"].as_str().unwrap_or("").to_string(),
            higher_is_better,
        });
    }
    if rows.is_empty() {
        bail!("{} holds no metric rows", path.display());
    }
    Ok(rows)
}

/// The end of a log, cut at a character boundary.
fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(LOG_TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

fn read_logs(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut logs = BTreeMap::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_file() {
            let bytes = std::fs::read(&path)?;
            let text = String::from_utf8_lossy(&bytes);
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            logs.insert(name, tail(&text).to_string());
        }
    }
    Ok(logs)
}

/// Records the rows of `import.metrics` as one finished run; returns its id.
pub fn import(db: &EvalDb, import: &Import) -> Result<i64> {
    let text = std::fs::read_to_string(import.metrics)
        .with_context(|| format!("reading {}", import.metrics.display()))?;
    let rows = parse_rows(&text, import.metrics)?;
    let logs = match import.logs {
        Some(dir) => read_logs(dir)?,
        None => BTreeMap::new(),
    };
    let note = match import.note {
        Some(path) => Some(
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        ),
        None => None,
    };
    let dir = Path::new(import.model);
    let meta = RunMeta::detect(dir.is_dir().then_some(dir));
    let id = db.start_run_with(
        import.kind,
        import.label,
        import.model,
        &import.flags,
        &meta,
    )?;
    for row in &rows {
        db.record_metrics(
            id,
            &[Metric {
                name: &row.name,
                value: row.value,
                unit: &row.unit,
                higher_is_better: row.higher_is_better,
            }],
        )?;
    }
    db.finish_run(id, "done", &json!({"note": note, "logs": logs}))?;
    Ok(id)
}

fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Decimals that show a value of `x`'s magnitude to about four digits.
fn decimals(x: f64) -> usize {
    if x.abs() >= 100.0 {
        1
    } else if x.abs() >= 1.0 {
        2
    } else {
        3
    }
}

/// `median (min–max)`, or the median alone for one sample.
fn cell(series: &MetricSeries) -> String {
    let m = median(&series.samples);
    let lo = series.samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = series
        .samples
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let d = decimals(m);
    if series.samples.len() > 1 {
        format!("{m:.d$} ({lo:.d$}–{hi:.d$})")
    } else {
        format!("{m:.d$}")
    }
}

/// How much better ours is: our speed over theirs, or their latency over ours.
fn advantage(ours: &MetricSeries, theirs: &MetricSeries) -> Option<f64> {
    let (o, t) = (median(&ours.samples), median(&theirs.samples));
    let ratio = match ours.higher_is_better? {
        true => o / t,
        false => t / o,
    };
    ratio.is_finite().then_some(ratio)
}

/// One series of a scenario: (metric, program, samples).
type Cell<'a> = (&'a str, &'a str, &'a MetricSeries);

/// A scenario's table: programs in the order they first appear, metrics as columns.
fn scenario_table(out: &mut String, scenario: &str, series: &[Cell]) {
    let mut metrics: Vec<&str> = Vec::new();
    let mut programs: Vec<&str> = Vec::new();
    for (metric, program, _) in series {
        if !metrics.contains(metric) {
            metrics.push(metric);
        }
        if !programs.contains(program) {
            programs.push(program);
        }
    }
    if let Some(i) = programs.iter().position(|p| *p == OURS) {
        let ours = programs.remove(i);
        programs.insert(0, ours);
    }
    let find = |metric: &str, program: &str| {
        series
            .iter()
            .find(|(m, p, _)| *m == metric && *p == program)
            .map(|(_, _, s)| *s)
    };
    let _ = writeln!(out, "**{scenario}**\n");
    let mut header = String::from("| program |");
    let mut rule = String::from("|---|");
    for metric in &metrics {
        let unit = series
            .iter()
            .find(|(m, _, _)| m == metric)
            .map(|(_, _, s)| s.unit.as_str())
            .unwrap_or("");
        let _ = write!(header, " {metric} ({unit}) |");
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for program in &programs {
        let mut line = format!("| {program} |");
        for metric in &metrics {
            let text = match find(metric, program) {
                None => "-".to_string(),
                Some(s) => {
                    let ratio = match find(metric, OURS) {
                        Some(ours) if *program != OURS => advantage(ours, s),
                        _ => None,
                    };
                    match ratio {
                        Some(r) => format!("{} · **{r:.2}x**", cell(s)),
                        None => cell(s),
                    }
                }
            };
            let _ = write!(line, " {text} |");
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out);
}

fn date(t: f64) -> String {
    let (y, m, d) = crate::bench::civil_date(t as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The run's Markdown: provenance, then its tables.
pub fn render(run: &RunRow, metrics: &[MetricSeries]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run {} ({}{}), {} UTC, host {}, commit {}, model {}.\n",
        run.id,
        run.kind,
        run.label
            .as_deref()
            .map(|l| format!(": {l}"))
            .unwrap_or_default(),
        date(run.started_at),
        run.host.as_deref().unwrap_or("-"),
        run.git_commit
            .as_deref()
            .map(|c| &c[..c.len().min(12)])
            .unwrap_or("-"),
        run.model
    );
    if let Some(note) = run.summary["note"].as_str() {
        let _ = writeln!(out, "```\n{}\n```\n", note.trim_end());
    }
    let mut scenarios: Vec<(&str, Vec<Cell>)> = Vec::new();
    let mut plain = Vec::new();
    for s in metrics {
        let parts: Vec<&str> = s.name.splitn(3, '/').collect();
        if let [scenario, metric, program] = parts[..] {
            match scenarios.iter_mut().find(|(name, _)| *name == scenario) {
                Some((_, rows)) => rows.push((metric, program, s)),
                None => scenarios.push((scenario, vec![(metric, program, s)])),
            }
        } else {
            plain.push(s);
        }
    }
    scenarios.sort_by_key(|(name, _)| scenario_order(name));
    for (scenario, series) in &scenarios {
        scenario_table(&mut out, scenario, series);
    }
    if !plain.is_empty() {
        let _ = writeln!(
            out,
            "| metric | median (min–max) | n | unit |\n|---|---|---|---|"
        );
        for s in plain {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                s.name,
                cell(s),
                s.samples.len(),
                s.unit
            );
        }
        let _ = writeln!(out);
    }
    if !scenarios.is_empty() {
        let _ = writeln!(
            out,
            "Cells: median (min–max) over the rounds. **Nx**: {OURS}'s advantage over that \
             program (its speed over the program's, or the program's latency over its); \
             below 1, {OURS} is behind."
        );
    }
    out
}

/// `generate` first, then serving by client count, then the rest by name.
fn scenario_order(name: &str) -> (u8, usize, String) {
    if name == "generate" {
        return (0, 0, String::new());
    }
    match name.strip_prefix("serve-c").and_then(|c| c.parse().ok()) {
        Some(c) => (1, c, String::new()),
        None => (2, 0, name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, samples: &[f64], higher: Option<bool>) -> MetricSeries {
        MetricSeries {
            name: name.into(),
            unit: "tok/s".into(),
            higher_is_better: higher,
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn medians_spread_and_advantage() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let ours = series("a", &[100.0, 90.0, 110.0], Some(true));
        let theirs = series("a", &[200.0, 190.0, 210.0], Some(true));
        assert_eq!(cell(&ours), "100.0 (90.0–110.0)");
        assert_eq!(advantage(&ours, &theirs), Some(0.5));
        let ours = series("t", &[0.1], Some(false));
        let theirs = series("t", &[0.2], Some(false));
        assert_eq!(advantage(&ours, &theirs), Some(2.0));
    }

    #[test]
    fn rows_are_checked_line_by_line() {
        let p = Path::new("m.jsonl");
        let err = parse_rows("{\"name\":\"x\",\"value\":1}\n{\"name\":\"y\"}\n", p).unwrap_err();
        assert!(err.to_string().contains("m.jsonl:2"), "{err}");
        let err = parse_rows("\n", p).unwrap_err();
        assert!(err.to_string().contains("no metric rows"), "{err}");
        let rows = parse_rows(
            "{\"name\":\"s/m/p\",\"value\":2.5,\"unit\":\"s\",\"higher_is_better\":false}\n",
            p,
        )
        .unwrap();
        assert_eq!(rows[0].higher_is_better, Some(false));
    }

    #[test]
    fn a_log_tail_starts_on_a_character() {
        let text = "é".repeat(LOG_TAIL_BYTES);
        let t = tail(&text);
        assert!(t.len() <= LOG_TAIL_BYTES && t.starts_with('é'));
    }
}
