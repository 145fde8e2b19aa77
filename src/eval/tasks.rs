//! Multiple-choice tasks scored by log-likelihood, as lm-evaluation-harness
//! defines them (ARC, HellaSwag, PIQA, MMLU), read from local JSONL files in
//! the harness's dataset formats. The model side is `mlx_lm.evaluate`'s
//! `MLXLM.loglikelihood`: requests grouped by context, the context prefilled
//! once, every continuation scored on a copy of its KV cache.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::indexing::{argmax, argmax_axis, IndexOp};
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// The task families this module knows.
pub const TASKS: [&str; 5] = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "mmlu"];

/// One multiple-choice item: the context (few-shot examples included), the
/// choices as written (without the delimiter), and the gold index.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Item {
    /// The prompt, few-shot examples included.
    pub context: String,
    /// The choices as written, without the target delimiter.
    pub choices: Vec<String>,
    /// Index of the correct choice.
    pub gold: usize,
    /// The few-shot examples in `context`: their 0-based rows in the file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shots: Vec<usize>,
}

/// A question as the task renders it, before few-shot context is added.
struct Doc {
    text: String,
    choices: Vec<String>,
    gold: usize,
}

fn field<'a>(row: &'a serde_json::Value, key: &str, at: &str) -> Result<&'a serde_json::Value> {
    row.get(key)
        .with_context(|| format!("{at}: no field {key:?}"))
}

fn str_field<'a>(row: &'a serde_json::Value, key: &str, at: &str) -> Result<&'a str> {
    field(row, key, at)?
        .as_str()
        .with_context(|| format!("{at}: field {key:?} is not a string"))
}

fn strings(v: &serde_json::Value, what: &str, at: &str) -> Result<Vec<String>> {
    v.as_array()
        .with_context(|| format!("{at}: {what} is not a list"))?
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .with_context(|| format!("{at}: {what} holds a non-string"))
        })
        .collect()
}

/// An integer label given as a number or a numeric string.
fn index_field(row: &serde_json::Value, key: &str, at: &str) -> Result<usize> {
    let v = field(row, key, at)?;
    v.as_u64()
        .map(|n| n as usize)
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .with_context(|| format!("{at}: field {key:?} is not an index"))
}

/// HellaSwag's `preprocess` in the harness.
fn hellaswag_clean(text: &str) -> String {
    let mut t = text.trim().replace(" [title]", ". ");
    // Drop bracketed tags (`[header]`, `[step]`), non-greedy like `\[.*?\]`.
    let mut out = String::with_capacity(t.len());
    let mut rest = t.as_str();
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    t = out.replace("  ", " ");
    t
}

/// Python's `str.capitalize`: first character upper case, the rest lower.
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

fn render(task: &str, row: &serde_json::Value, at: &str) -> Result<Doc> {
    Ok(match task {
        "arc_easy" | "arc_challenge" => {
            let choices = field(row, "choices", at)?;
            let texts = strings(field(choices, "text", at)?, "choices.text", at)?;
            let labels = strings(field(choices, "label", at)?, "choices.label", at)?;
            let key = str_field(row, "answerKey", at)?;
            let gold = labels
                .iter()
                .position(|l| l == key)
                .with_context(|| format!("{at}: answerKey {key:?} is not among {labels:?}"))?;
            Doc {
                text: format!("Question: {}\nAnswer:", str_field(row, "question", at)?),
                choices: texts,
                gold,
            }
        }
        "hellaswag" => {
            let ctx = format!(
                "{} {}",
                str_field(row, "ctx_a", at)?,
                capitalize(str_field(row, "ctx_b", at)?)
            );
            let query = format!("{}: {ctx}", str_field(row, "activity_label", at)?);
            let endings = strings(field(row, "endings", at)?, "endings", at)?;
            Doc {
                text: hellaswag_clean(&query),
                choices: endings.iter().map(|e| hellaswag_clean(e)).collect(),
                gold: index_field(row, "label", at)?,
            }
        }
        "piqa" => Doc {
            text: format!("Question: {}\nAnswer:", str_field(row, "goal", at)?),
            choices: vec![
                str_field(row, "sol1", at)?.to_string(),
                str_field(row, "sol2", at)?.to_string(),
            ],
            gold: index_field(row, "label", at)?,
        },
        "mmlu" => {
            let choices = strings(field(row, "choices", at)?, "choices", at)?;
            if choices.len() != 4 {
                bail!(
                    "{at}: MMLU items have 4 choices, this one {}",
                    choices.len()
                );
            }
            Doc {
                text: format!(
                    "{}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:",
                    str_field(row, "question", at)?.trim(),
                    choices[0],
                    choices[1],
                    choices[2],
                    choices[3]
                ),
                choices: ["A", "B", "C", "D"].map(String::from).to_vec(),
                gold: index_field(row, "answer", at)?,
            }
        }
        other => bail!("unknown task {other:?} (known: {})", TASKS.join(", ")),
    })
}

/// The seed `mlx_lm.evaluate` hands the harness's few-shot sampler
/// (its `--seed` default; the harness's own CLI default is 1234).
pub const FEWSHOT_SEED: u64 = 123;

/// The items of `task` from the JSONL file `path`: at most `limit`, each
/// preceded by `num_shots` solved examples drawn as lm-evaluation-harness
/// draws them (see `fewshot_rows`) with [`FEWSHOT_SEED`] and, for MMLU, the
/// subject's description.
pub fn load_task(
    task: &str,
    path: &Path,
    num_shots: usize,
    limit: Option<usize>,
) -> Result<Vec<Item>> {
    load_task_seeded(task, path, num_shots, FEWSHOT_SEED, limit)
}

/// [`load_task`] with the few-shot sampler's seed.
pub fn load_task_seeded(
    task: &str,
    path: &Path,
    num_shots: usize,
    seed: u64,
    limit: Option<usize>,
) -> Result<Vec<Item>> {
    if !TASKS.contains(&task) {
        bail!("unknown task {task:?} (known: {})", TASKS.join(", "));
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading task file {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{} line {}", path.display(), i + 1);
        let row: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{at}: not JSON"))?;
        let doc = render(task, &row, &at)?;
        if doc.gold >= doc.choices.len() {
            bail!("{at}: the answer index {} is out of range", doc.gold);
        }
        rows.push((doc, row));
    }
    if rows.is_empty() {
        bail!("task file {} has no items", path.display());
    }
    let raw: Vec<&serde_json::Value> = rows.iter().map(|(_, r)| r).collect();
    let shots = fewshot_rows(task, &raw, num_shots, seed, limit)
        .with_context(|| format!("few-shot examples from {}", path.display()))?;
    let mut items = Vec::with_capacity(shots.len());
    for (i, picked) in shots.iter().enumerate() {
        let (doc, row) = &rows[i];
        let subject = row.get("subject").and_then(|s| s.as_str());
        let mut context = match (task, subject) {
            ("mmlu", Some(s)) => format!(
                "The following are multiple choice questions (with answers) about {}.\n\n",
                s.replace('_', " ")
            ),
            _ => String::new(),
        };
        for &j in picked {
            let shot = &rows[j].0;
            context.push_str(&format!("{} {}\n\n", shot.text, shot.choices[shot.gold]));
        }
        context.push_str(&doc.text);
        items.push(Item {
            context,
            choices: doc.choices.clone(),
            gold: doc.gold,
            shots: picked.clone(),
        });
    }
    Ok(items)
}

/// The few-shot example rows of each evaluated row (the first `limit`
/// rows, in order), as lm-evaluation-harness picks them when the few-shot
/// pool is the evaluated split itself: one `random.Random(seed)` per task,
/// its state carried from row to row, `sample(pool, k + 1)` per row with
/// every row equal to the evaluated one dropped and the first `k` kept.
/// MMLU uses the harness's `first_n` sampler instead: the first `k` other
/// rows of the same subject, in file order.
pub(crate) fn fewshot_rows(
    task: &str,
    rows: &[&serde_json::Value],
    k: usize,
    seed: u64,
    limit: Option<usize>,
) -> Result<Vec<Vec<usize>>> {
    let n = limit.map_or(rows.len(), |l| l.min(rows.len()));
    if k == 0 {
        return Ok(vec![Vec::new(); n]);
    }
    let subject = |r: &serde_json::Value| r.get("subject").cloned();
    let mut rng = super::pyrandom::PyRandom::new(seed);
    let mut out = Vec::with_capacity(n);
    for (i, &row) in rows.iter().enumerate().take(n) {
        let picked: Vec<usize> = if task == "mmlu" {
            (0..rows.len())
                .filter(|&j| rows[j] != row && subject(rows[j]) == subject(row))
                .take(k)
                .collect()
        } else {
            if k + 1 > rows.len() {
                bail!(
                    "{k} shots need at least {} items (the evaluated one is drawn too), \
                     the file has {}",
                    k + 1,
                    rows.len()
                );
            }
            rng.sample(rows.len(), k + 1)?
                .into_iter()
                .filter(|&j| rows[j] != row)
                .take(k)
                .collect()
        };
        if picked.len() < k {
            bail!(
                "item {}: only {} other items to draw {k} shots from",
                i + 1,
                picked.len()
            );
        }
        out.push(picked);
    }
    Ok(out)
}

/// `log p(continuation | context)` and whether greedy decoding would
/// produce the continuation, per request, as `MLXLM.loglikelihood`.
pub fn loglikelihood(
    model: &Model,
    tok: &Tokenizer,
    requests: &[(String, String)],
    on_progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<(f64, bool)>> {
    // Group by context, keeping first-seen order.
    let mut order: Vec<&str> = Vec::new();
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, (ctx, _)) in requests.iter().enumerate() {
        groups
            .entry(ctx.as_str())
            .or_insert_with(|| {
                order.push(ctx.as_str());
                Vec::new()
            })
            .push(i);
    }
    let mut out = vec![(0.0f64, false); requests.len()];
    for (g, ctx) in order.iter().enumerate() {
        let prefix = tok.encode(ctx)?;
        model.check_token_ids(&prefix)?;
        if prefix.is_empty() {
            bail!("an empty context cannot be scored");
        }
        let (logprobs, caches) = prefill(model, &prefix)?;
        let best = argmax(&logprobs, None)?.item_cast::<u32>();
        for &i in &groups[ctx] {
            let full = tok.encode(&format!("{ctx}{}", requests[i].1))?;
            model.check_token_ids(&full)?;
            if full.len() <= prefix.len() {
                bail!(
                    "the continuation {:?} adds no token to its context",
                    requests[i].1
                );
            }
            let inputs: Vec<i32> = full[prefix.len()..].iter().map(|&t| t as i32).collect();
            let first = logprobs.index(inputs[0]).item_cast::<f32>() as f64;
            let mut score = first;
            let mut greedy = inputs[0] as u32 == best;
            if inputs.len() > 1 {
                let mut cont: Vec<Box<dyn KvCache>> =
                    caches.iter().map(|c| c.boxed_clone()).collect();
                let x =
                    Array::from_slice(&inputs[..inputs.len() - 1], &[1, inputs.len() as i32 - 1]);
                let logits = model
                    .forward(&x, &mut cont)?
                    .index(0)
                    .as_dtype(Dtype::Float32)?;
                let lp = &logits - &logits.logsumexp_axis(-1, true)?;
                let targets = Array::from_slice(&inputs[1..], &[inputs.len() as i32 - 1, 1]);
                let picked = lp.take_along_axis(&targets, -1)?.sum(None)?;
                let argmax = argmax_axis(&logits, -1, false)?.as_dtype(Dtype::Int32)?;
                eval([&picked, &argmax])?;
                score += picked.item_cast::<f32>() as f64;
                greedy &= argmax.as_slice::<i32>() == &inputs[1..];
            }
            out[i] = (score, greedy);
        }
        on_progress(g + 1, order.len());
    }
    Ok(out)
}

/// Prefills `prefix` (in chunks of 2048, as mlx-lm); returns the
/// log-probabilities of the next token and the caches.
fn prefill(model: &Model, prefix: &[u32]) -> Result<(Array, Vec<Box<dyn KvCache>>)> {
    let ids: Vec<i32> = prefix.iter().map(|&t| t as i32).collect();
    let mut caches = model.make_caches();
    let mut last = None;
    for chunk in ids.chunks(2048) {
        let x = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        let logits = model.forward_last(&x, &mut caches)?;
        eval([&logits])?;
        last = Some(logits);
    }
    let logits = last
        .expect("a non-empty prefix")
        .index(0)
        .as_dtype(Dtype::Float32)?;
    let lp = &logits - &logits.logsumexp_axis(-1, true)?;
    eval([&lp])?;
    Ok((lp, caches))
}

/// Scores of one task.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TaskResult {
    /// The task's name (one of [`TASKS`]).
    pub task: String,
    /// Items scored.
    pub items: usize,
    /// Accuracy: the share of items whose most likely choice is the gold one.
    pub acc: f64,
    /// Standard error of `acc`.
    pub acc_stderr: f64,
    /// Accuracy with each choice's log-likelihood divided by its length
    /// in characters (the harness's `acc_norm`).
    pub acc_norm: f64,
    /// Standard error of `acc_norm`.
    pub acc_norm_stderr: f64,
    /// Log-likelihood of every choice of every item.
    pub loglikelihoods: Vec<Vec<f64>>,
}

/// Mean and standard error (sample standard deviation over √n, as the
/// harness's `mean_stderr`).
pub(crate) fn mean_stderr(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

fn first_max(xs: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, x) in xs.enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

/// Scores `items` with `model`: every choice's log-likelihood after the
/// item's context, joined by a space (the harness's target delimiter).
pub fn evaluate(
    task: &str,
    model: &Model,
    tok: &Tokenizer,
    items: &[Item],
    on_progress: &mut dyn FnMut(usize, usize),
) -> Result<TaskResult> {
    let requests: Vec<(String, String)> = items
        .iter()
        .flat_map(|it| {
            it.choices
                .iter()
                .map(|c| (it.context.clone(), format!(" {c}")))
        })
        .collect();
    let scores = loglikelihood(model, tok, &requests, on_progress)?;
    let mut lls = Vec::with_capacity(items.len());
    let (mut acc, mut acc_norm) = (Vec::new(), Vec::new());
    let mut k = 0;
    for it in items {
        let ll: Vec<f64> = scores[k..k + it.choices.len()]
            .iter()
            .map(|s| s.0)
            .collect();
        k += it.choices.len();
        let pick = first_max(ll.iter().copied());
        let pick_norm = first_max(
            ll.iter()
                .zip(&it.choices)
                .map(|(l, c)| l / c.chars().count().max(1) as f64),
        );
        acc.push(if pick == it.gold { 1.0 } else { 0.0 });
        acc_norm.push(if pick_norm == it.gold { 1.0 } else { 0.0 });
        lls.push(ll);
    }
    let (a, ase) = mean_stderr(&acc);
    let (an, anse) = mean_stderr(&acc_norm);
    Ok(TaskResult {
        task: task.to_string(),
        items: items.len(),
        acc: a,
        acc_stderr: ase,
        acc_norm: an,
        acc_norm_stderr: anse,
        loglikelihoods: lls,
    })
}
