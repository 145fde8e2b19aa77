//! Whole-document log-likelihood tasks (lm-evaluation-harness's
//! `loglikelihood_rolling` request type, as in its `wikitext` task), read
//! from local JSONL files. The model side is `mlx_lm.evaluate`'s
//! `MLXLM.loglikelihood_rolling`: each document is tokenized on its own and
//! every token after the first is scored given all the tokens before it
//! (the first token has no context: mlx-lm does not score it). The metrics
//! are the harness's, weighted by the words and bytes of the document text.

use std::path::Path;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// The rolling tasks this module knows.
pub const TASKS: [&str; 1] = ["wikitext"];

/// Forward-pass chunk, as mlx-lm's `_score_fn` `step_size`.
const STEP: usize = 2048;

/// The documents of `task` from the JSONL file `path` (at most `limit`), as
/// the harness hands them to the model: for `wikitext`, the `page` field run
/// through the harness's `wikitext_detokenizer`; a row with a `text` field
/// instead is taken as already detokenized text.
pub fn load_docs(task: &str, path: &Path, limit: Option<usize>) -> Result<Vec<String>> {
    if !TASKS.contains(&task) {
        bail!(
            "unknown rolling task {task:?} (known: {})",
            TASKS.join(", ")
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading task file {}", path.display()))?;
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|l| docs.len() >= l) {
            break;
        }
        let at = format!("{} line {}", path.display(), i + 1);
        let row: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{at}: not JSON"))?;
        let doc = if let Some(page) = row.get("page") {
            let page = page
                .as_str()
                .with_context(|| format!("{at}: field \"page\" is not a string"))?;
            wikitext_detokenize(page)
        } else if let Some(text) = row.get("text") {
            text.as_str()
                .with_context(|| format!("{at}: field \"text\" is not a string"))?
                .to_string()
        } else {
            bail!("{at}: no field \"page\" (or \"text\")");
        };
        if doc.is_empty() {
            bail!("{at}: the document is empty");
        }
        docs.push(doc);
    }
    if docs.is_empty() {
        bail!("task file {} has no documents", path.display());
    }
    Ok(docs)
}

/// Replaces every match of a pair-of-delimiters pattern such as Python's
/// `\(\s*([^\)]*?)\s*\)` → `(\1)`: the shortest run from `open` to the next
/// `close` with no `close` inside, whitespace trimmed inside the pair.
/// `open == close` for quotes.
fn tighten_pairs(s: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(open) {
        let after = &rest[i + open.len_utf8()..];
        match after.find(close) {
            Some(j) => {
                out.push_str(&rest[..i]);
                out.push(open);
                out.push_str(after[..j].trim_matches(py_space));
                out.push(close);
                rest = &after[j + close.len_utf8()..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// Python's `\s` for `str` patterns.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// The harness's `wikitext_detokenizer` (lm_eval/tasks/wikitext): undoes
/// the dataset's tokenization (` @-@ `, spaced punctuation, brackets).
fn wikitext_detokenize(page: &str) -> String {
    let mut s = page.replace("s '", "s'");
    // The harness's `re.sub(r"/' [0-9]/", r"/'[0-9]/", s)`: a literal
    // replacement of "/' d/" by the text "/'[0-9]/".
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(i) = rest.find("/' ") {
        let tail = &rest[i + 3..];
        let mut chars = tail.chars();
        if matches!((chars.next(), chars.next()), (Some(d), Some('/')) if d.is_ascii_digit()) {
            out.push_str(&rest[..i]);
            out.push_str("/'[0-9]/");
            rest = &tail[2..];
        } else {
            out.push_str(&rest[..i + 3]);
            rest = tail;
        }
    }
    out.push_str(rest);
    s = out;
    for (from, to) in [
        (" @-@ ", "-"),
        (" @,@ ", ","),
        (" @.@ ", "."),
        (" : ", ": "),
        (" ; ", "; "),
        (" . ", ". "),
        (" ! ", "! "),
        (" ? ", "? "),
        (" , ", ", "),
    ] {
        s = s.replace(from, to);
    }
    for (open, close) in [('(', ')'), ('[', ']'), ('{', '}'), ('"', '"'), ('\'', '\'')] {
        s = tighten_pairs(&s, open, close);
    }
    for (from, to) in [
        ("= = = =", "===="),
        ("= = =", "==="),
        ("= =", "=="),
        (" \u{b0} ", "\u{b0}"),
        (" \n", "\n"),
        ("\n ", "\n"),
        (" N ", " 1 "),
        (" 's", "'s"),
    ] {
        s = s.replace(from, to);
    }
    s
}

/// The harness's `count_words`: `len(re.split(r"\s+", doc))`.
fn count_words(doc: &str) -> usize {
    let mut n = 1;
    let mut in_space = false;
    for c in doc.chars() {
        let space = py_space(c);
        if space && !in_space {
            n += 1;
        }
        in_space = space;
    }
    n
}

/// Sum of `log p(token | previous tokens)` over every token of each
/// document but the first, as `MLXLM.loglikelihood_rolling`.
pub fn loglikelihood_rolling(
    model: &Model,
    tok: &Tokenizer,
    docs: &[String],
    on_progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(docs.len());
    for (d, doc) in docs.iter().enumerate() {
        let tokens = tok.encode(doc)?;
        model.check_token_ids(&tokens)?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        if ids.is_empty() {
            bail!("document {} has no tokens", d + 1);
        }
        let (inputs, targets) = (&ids[..ids.len() - 1], &ids[1..]);
        let mut caches = model.make_caches();
        let mut total = 0.0f64;
        for (start, chunk) in (0..).step_by(STEP).zip(inputs.chunks(STEP)) {
            let n = chunk.len() as i32;
            let x = Array::from_slice(chunk, &[1, n]);
            let logits = model
                .forward(&x, &mut caches)?
                .index(0)
                .as_dtype(Dtype::Float32)?;
            let lp = &logits - &logits.logsumexp_axis(-1, true)?;
            let t = Array::from_slice(&targets[start..start + chunk.len()], &[n, 1]);
            let picked = lp.take_along_axis(&t, -1)?.sum(None)?;
            eval([&picked])?;
            total += picked.item_cast::<f32>() as f64;
        }
        out.push(total);
        on_progress(d + 1, docs.len());
    }
    Ok(out)
}

/// Scores of one rolling task.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RollingResult {
    /// The task's name (such as `wikitext`).
    pub task: String,
    /// Documents scored.
    pub docs: usize,
    /// `exp(-Σ loglikelihood / Σ words)`.
    pub word_perplexity: f64,
    /// `exp(-Σ loglikelihood / Σ bytes)`.
    pub byte_perplexity: f64,
    /// `-Σ loglikelihood / Σ bytes / ln 2`.
    pub bits_per_byte: f64,
    /// Each document's log-likelihood, words and UTF-8 bytes.
    pub loglikelihoods: Vec<f64>,
    /// Each document's words.
    pub words: Vec<usize>,
    /// Each document's UTF-8 bytes.
    pub bytes: Vec<usize>,
}

/// The harness's aggregation of per-document `(loglikelihood, weight)`.
pub fn aggregate(task: &str, docs: &[String], lls: &[f64]) -> RollingResult {
    let words: Vec<usize> = docs.iter().map(|d| count_words(d)).collect();
    let bytes: Vec<usize> = docs.iter().map(|d| d.len()).collect();
    let ll: f64 = lls.iter().sum();
    let per_word = ll / words.iter().sum::<usize>() as f64;
    let per_byte = ll / bytes.iter().sum::<usize>() as f64;
    RollingResult {
        task: task.to_string(),
        docs: docs.len(),
        word_perplexity: (-per_word).exp(),
        byte_perplexity: (-per_byte).exp(),
        bits_per_byte: -per_byte / std::f64::consts::LN_2,
        loglikelihoods: lls.to_vec(),
        words,
        bytes,
    }
}

/// Scores `docs` with `model`.
pub fn evaluate(
    task: &str,
    model: &Model,
    tok: &Tokenizer,
    docs: &[String],
    on_progress: &mut dyn FnMut(usize, usize),
) -> Result<RollingResult> {
    let lls = loglikelihood_rolling(model, tok, docs, on_progress)?;
    Ok(aggregate(task, docs, &lls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detokenizer_undoes_wikitext_spacing() {
        let page = " = Valkyria Chronicles = \n The game 's 1 @,@ 000 units ( in Japan ) sold , \" well \" . \n = = Plot = = \n";
        assert_eq!(
            wikitext_detokenize(page),
            " = Valkyria Chronicles =\nThe game's 1,000 units (in Japan) sold, \"well\".\n== Plot ==\n"
        );
    }

    #[test]
    fn words_split_on_whitespace_runs_as_python() {
        assert_eq!(count_words("a b  c"), 3);
        assert_eq!(count_words(" a\n"), 3);
        assert_eq!(count_words(""), 1);
    }

    #[test]
    fn metrics_weight_by_words_and_bytes() {
        let docs = ["ab cd".to_string(), "é".to_string()];
        let r = aggregate("wikitext", &docs, &[-3.0, -1.0]);
        assert!((r.word_perplexity - (4.0f64 / 3.0).exp()).abs() < 1e-12);
        assert!((r.byte_perplexity - (4.0f64 / 7.0).exp()).abs() < 1e-12);
        assert!((r.bits_per_byte - 4.0 / 7.0 / 2f64.ln()).abs() < 1e-12);
    }
}
