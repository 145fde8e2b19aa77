//! Generation tasks (lm-evaluation-harness's `generate_until` request type,
//! as in its `gsm8k` task), read from local JSONL files. The model side is
//! `mlx_lm.evaluate`'s `MLXLM.generate_until`: greedy decoding from the
//! rendered question, the text cut at the first of the task's `until`
//! strings. Answers are scored with the harness's `exact_match` after each of
//! the task's answer-extraction filters.

use std::path::Path;

use anyhow::{bail, Context, Result};
use regex::Regex;

use crate::decode::generate;
use crate::generate::GenerateOptions;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// The generation tasks this module knows.
pub const TASKS: [&str; 1] = ["gsm8k"];

/// gsm8k's `generation_kwargs.until` in the harness.
pub const GSM8K_UNTIL: [&str; 3] = ["Question:", "</s>", "<|im_end|>"];

/// The harness's default generation cap when a task sets no `max_gen_toks`.
pub const DEFAULT_MAX_GEN_TOKENS: usize = 256;

/// One question: the prompt (few-shot examples included) and the reference
/// answer as the dataset writes it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GenItem {
    /// The prompt, few-shot examples included.
    pub context: String,
    /// The reference answer, as the dataset writes it.
    pub target: String,
}

fn str_field<'a>(row: &'a serde_json::Value, key: &str, at: &str) -> Result<&'a str> {
    row.get(key)
        .with_context(|| format!("{at}: no field {key:?}"))?
        .as_str()
        .with_context(|| format!("{at}: field {key:?} is not a string"))
}

/// The items of `task` from the JSONL file `path` (at most `limit`), each
/// prompt `Question: {question}\nAnswer:` preceded by `num_shots` solved
/// examples (drawn from the file as lm-evaluation-harness draws them, with
/// `seed`), each `Question: …\nAnswer: {answer}` and a blank line.
pub fn load_items(
    task: &str,
    path: &Path,
    num_shots: usize,
    seed: u64,
    limit: Option<usize>,
) -> Result<Vec<GenItem>> {
    if !TASKS.contains(&task) {
        bail!(
            "unknown generation task {task:?} (known: {})",
            TASKS.join(", ")
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading task file {}", path.display()))?;
    let mut raw = Vec::new();
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{} line {}", path.display(), i + 1);
        let row: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{at}: not JSON"))?;
        let question = format!("Question: {}\nAnswer:", str_field(&row, "question", &at)?);
        rows.push((question, str_field(&row, "answer", &at)?.to_string()));
        raw.push(row);
    }
    if rows.is_empty() {
        bail!("task file {} has no items", path.display());
    }
    let refs: Vec<&serde_json::Value> = raw.iter().collect();
    let shots = super::tasks::fewshot_rows(task, &refs, num_shots, seed, limit)?;
    Ok(shots
        .into_iter()
        .enumerate()
        .map(|(i, picked)| {
            let mut context = String::new();
            for (q, a) in picked.iter().map(|&j| &rows[j]) {
                context.push_str(&format!("{q} {a}\n\n"));
            }
            context.push_str(&rows[i].0);
            GenItem {
                context,
                target: rows[i].1.clone(),
            }
        })
        .collect())
}

/// `s` up to the first occurrence of any of `until` (mlx-lm's `_rstrip_until`).
fn cut_at_until(s: &str, until: &[&str]) -> String {
    let end = until
        .iter()
        .filter_map(|u| s.find(u))
        .min()
        .unwrap_or(s.len());
    s[..end].to_string()
}

/// Greedy continuations of each prompt, at most `max_tokens` tokens, cut at
/// the first `until` string, as `MLXLM.generate_until`. Decoding stops as
/// soon as an `until` string appears (mlx-lm decodes to the token limit and
/// cuts afterwards: the text before the cut is the same).
pub fn generate_until(
    model: &Model,
    tok: &Tokenizer,
    prompts: &[String],
    until: &[&str],
    max_tokens: usize,
    on_progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<String>> {
    let opts = GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    };
    let mut out = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let ids = tok.encode(prompt)?;
        if ids.is_empty() {
            bail!("prompt {} has no tokens", i + 1);
        }
        let mut caches = model.make_caches();
        let mut text = String::new();
        let mut on_token = |ev: &crate::generate::TokenEvent| {
            text.push_str(ev.text);
            !until.iter().any(|u| text.contains(u))
        };
        let r = generate(model, tok, &mut caches, &ids, &opts, None, &mut on_token)?;
        // `tokenizer.decode` of the generated tokens, as mlx-lm's `batch_generate`.
        out.push(cut_at_until(&tok.decode(&r.token_ids)?, until));
        on_progress(i + 1, prompts.len());
    }
    Ok(out)
}

/// One answer-extraction filter of the harness: a regex, which match
/// (`group_select`: 0 the first, -1 the last), then `take_first`.
struct Filter {
    name: &'static str,
    regex: Regex,
    last: bool,
}

/// gsm8k's two filters: `strict-match` (`#### (\-?[0-9\.\,]+)`, first
/// match) and `flexible-extract` (`(-?[$0-9.,]{2,})|(-?[0-9]+)`, last match).
fn gsm8k_filters() -> [Filter; 2] {
    [
        Filter {
            name: "strict-match",
            regex: Regex::new(r"#### (\-?[0-9\.\,]+)").expect("a valid regex"),
            last: false,
        },
        Filter {
            name: "flexible-extract",
            regex: Regex::new(r"(-?[$0-9.,]{2,})|(-?[0-9]+)").expect("a valid regex"),
            last: true,
        },
    ]
}

/// The harness's `RegexFilter` on one response: the selected match's first
/// non-empty group (or the whole match when the pattern has no group),
/// stripped; `[invalid]` when nothing matches.
fn apply_filter(f: &Filter, resp: &str) -> String {
    let caps = if f.last {
        f.regex.captures_iter(resp).last()
    } else {
        f.regex.captures_iter(resp).next()
    };
    let Some(caps) = caps else {
        return "[invalid]".to_string();
    };
    let text = match caps.len() {
        1 => caps.get(0).map_or("", |m| m.as_str()),
        2 => caps.get(1).map_or("", |m| m.as_str()),
        _ => match caps
            .iter()
            .skip(1)
            .flatten()
            .find(|m| !m.as_str().is_empty())
        {
            Some(m) => m.as_str(),
            None => return "[invalid]".to_string(),
        },
    };
    text.trim().to_string()
}

/// gsm8k's `exact_match`: `regexes_to_ignore` (`,`, `\$`, `(?s).*#### `,
/// `\.$`) removed from both strings, case ignored.
fn gsm8k_normalize(s: &str) -> String {
    let mut s = s.replace([',', '$'], "");
    if let Some(i) = s.rfind("#### ") {
        s = s[i + 5..].to_string();
    }
    // Python's `$` also matches before a final newline.
    if let Some(stripped) = s.strip_suffix(".\n") {
        s = format!("{stripped}\n");
    } else if let Some(stripped) = s.strip_suffix('.') {
        s = stripped.to_string();
    }
    s.to_lowercase()
}

/// Scores of one generation task, per filter.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GenResult {
    /// The task's name (such as `gsm8k`).
    pub task: String,
    /// Questions scored.
    pub items: usize,
    /// `(filter name, exact_match, its standard error)`.
    pub exact_match: Vec<(String, f64, f64)>,
    /// The generated continuations, cut at the `until` strings.
    pub generations: Vec<String>,
    /// What each filter extracted from each continuation.
    pub extracted: Vec<Vec<String>>,
}

/// The harness's metrics of gsm8k over `generations`.
pub fn score(task: &str, items: &[GenItem], generations: Vec<String>) -> GenResult {
    let mut exact_match = Vec::new();
    let mut extracted = Vec::new();
    for f in gsm8k_filters() {
        let picked: Vec<String> = generations.iter().map(|g| apply_filter(&f, g)).collect();
        let hits: Vec<f64> = picked
            .iter()
            .zip(items)
            .map(|(p, it)| (gsm8k_normalize(p) == gsm8k_normalize(&it.target)) as u8 as f64)
            .collect();
        let (mean, se) = super::tasks::mean_stderr(&hits);
        exact_match.push((f.name.to_string(), mean, se));
        extracted.push(picked);
    }
    GenResult {
        task: task.to_string(),
        items: items.len(),
        exact_match,
        generations,
        extracted,
    }
}

/// Generates and scores `items` with `model`.
pub fn evaluate(
    task: &str,
    model: &Model,
    tok: &Tokenizer,
    items: &[GenItem],
    max_tokens: usize,
    on_progress: &mut dyn FnMut(usize, usize),
) -> Result<GenResult> {
    let prompts: Vec<String> = items.iter().map(|it| it.context.clone()).collect();
    let generations = generate_until(model, tok, &prompts, &GSM8K_UNTIL, max_tokens, on_progress)?;
    Ok(score(task, items, generations))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_cuts_at_the_first_stop_string() {
        assert_eq!(cut_at_until("12\n\nQuestion: x", &GSM8K_UNTIL), "12\n\n");
        assert_eq!(cut_at_until("a</s>b<|im_end|>", &GSM8K_UNTIL), "a");
        assert_eq!(cut_at_until("no stop", &GSM8K_UNTIL), "no stop");
    }

    #[test]
    fn gsm8k_filters_extract_as_the_harness() {
        let [strict, flex] = gsm8k_filters();
        let resp = "She has 3 + 4 = 7 apples, costing $1,200.50.\n#### 1,200";
        assert_eq!(apply_filter(&strict, resp), "1,200");
        assert_eq!(apply_filter(&flex, resp), "1,200");
        assert_eq!(apply_filter(&strict, "The answer is 42."), "[invalid]");
        assert_eq!(apply_filter(&flex, "The answer is 42."), "42.");
        assert_eq!(apply_filter(&flex, "no digits"), "[invalid]");
        assert_eq!(apply_filter(&flex, "x 5 y"), "5");
    }

    #[test]
    fn exact_match_ignores_the_harness_regexes() {
        let target = "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72";
        assert_eq!(gsm8k_normalize(target), "72");
        assert_eq!(gsm8k_normalize("$72."), "72");
        assert_eq!(gsm8k_normalize("7,2"), "72");
        let items = [GenItem {
            context: String::new(),
            target: target.to_string(),
        }];
        let r = score("gsm8k", &items, vec!["So 72.".to_string()]);
        assert_eq!(r.exact_match[0].1, 0.0); // strict: no "#### "
        assert_eq!(r.exact_match[1].1, 1.0); // flexible: "72."
    }
}
