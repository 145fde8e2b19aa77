//! `mlx-bun evaluate`: task rendering as lm-evaluation-harness defines it,
//! and log-likelihoods and generations equal to `mlx_lm.evaluate.MLXLM`'s
//! (`loglikelihood`, `loglikelihood_rolling`, `generate_until`) on the same
//! requests (scripts/oracle/evaluate_reference.py, evaluate_tasks_reference.py).

mod common;

use std::process::Command;

use common::{bin, model_dir, oracle_python, repo_root, run_ok};
use mlx_bun::eval::generate_until::{load_items, GSM8K_UNTIL};
use mlx_bun::eval::rolling::load_docs;
use mlx_bun::eval::tasks::{load_task, FEWSHOT_SEED};

const TASKS: [&str; 4] = ["arc_easy", "hellaswag", "piqa", "mmlu"];

fn task_file(name: &str) -> std::path::PathBuf {
    repo_root().join(format!("tests/data/tasks/{name}.jsonl"))
}

#[test]
fn tasks_render_as_the_harness_defines_them() {
    let arc = load_task("arc_easy", &task_file("arc_easy"), 1, Some(2)).unwrap();
    assert_eq!(
        arc[1].context,
        "Question: Which of these is a source of light?\nAnswer: the Sun\n\n\
         Question: What do plants need to make food?\nAnswer:"
    );
    assert_eq!(arc[1].gold, 0);
    let hs = load_task("hellaswag", &task_file("hellaswag"), 0, None).unwrap();
    // ctx_b capitalized; " [title]" becomes ". ", other [tags] are dropped.
    assert_eq!(
        hs[0].context,
        "Making tea: A woman fills a kettle with water. She"
    );
    assert_eq!(
        hs[0].choices[1],
        "throws the kettle out of the window. quickly."
    );
    assert_eq!(hs[0].choices[3], "reads a book about kettles.");
    let mmlu = load_task("mmlu", &task_file("mmlu"), 0, Some(1)).unwrap();
    assert_eq!(
        mmlu[0].context,
        "The following are multiple choice questions (with answers) about elementary \
         mathematics.\n\nWhat is 2 + 3?\nA. 4\nB. 5\nC. 6\nD. 7\nAnswer:"
    );
    assert_eq!(mmlu[0].choices, ["A", "B", "C", "D"]);
    let piqa = load_task("piqa", &task_file("piqa"), 0, None).unwrap();
    assert_eq!(piqa[1].gold, 1);
}

#[test]
fn loglikelihoods_match_mlx_lm() {
    let Some(py) = oracle_python() else {
        return;
    };
    let dir = model_dir();
    let work = tempfile::tempdir().unwrap();
    let out = run_ok(&[
        "evaluate",
        "--model",
        dir.to_str().unwrap(),
        "--tasks",
        &TASKS.join(","),
        "--task-dir",
        repo_root().join("tests/data/tasks").to_str().unwrap(),
        "--num-shots",
        "1",
        "--limit",
        "2",
        "--json",
        "--no-db",
    ]);
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = ours["results"].as_array().unwrap();
    assert_eq!(results.len(), TASKS.len());

    let mut items = Vec::new();
    for t in TASKS {
        items.extend(load_task(t, &task_file(t), 1, Some(2)).unwrap());
    }
    let items_file = work.path().join("items.json");
    std::fs::write(&items_file, serde_json::to_string(&items).unwrap()).unwrap();
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/evaluate_reference.py"))
        .arg("--model")
        .arg(&dir)
        .arg("--items")
        .arg(&items_file)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "evaluate_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let their_lls = theirs["loglikelihoods"].as_array().unwrap();
    let our_lls: Vec<&serde_json::Value> = results
        .iter()
        .flat_map(|r| r["loglikelihoods"].as_array().unwrap())
        .collect();
    assert_eq!(our_lls.len(), their_lls.len());
    for (a, b) in our_lls.iter().zip(their_lls) {
        for (x, y) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-3 * y.abs().max(1.0),
                "ours {x} vs mlx-lm {y}"
            );
        }
    }
    // The same accuracy over all items.
    let n = items.len() as f64;
    let mean = |key: &str| {
        results
            .iter()
            .map(|r| r[key].as_f64().unwrap() * r["items"].as_f64().unwrap())
            .sum::<f64>()
            / n
    };
    assert!((mean("acc") - theirs["acc"].as_f64().unwrap()).abs() < 1e-9);
    assert!((mean("acc_norm") - theirs["acc_norm"].as_f64().unwrap()).abs() < 1e-9);
    for r in results {
        assert!(r["acc_stderr"].as_f64().unwrap() >= 0.0, "{r}");
    }
}

#[test]
fn bad_task_input_gets_a_clear_error() {
    let work = tempfile::tempdir().unwrap();
    let bad = work.path().join("arc_easy.jsonl");
    std::fs::write(
        &bad,
        "{\"question\": \"q\", \"choices\": {\"text\": [\"a\"], \"label\": [\"A\"]}, \"answerKey\": \"Z\"}\n",
    )
    .unwrap();
    for (tasks, want) in [
        ("arc_easy", "answerKey \"Z\" is not among"),
        ("nonsense", "unknown task \"nonsense\""),
        ("piqa", "reading task file"),
    ] {
        let out = bin()
            .args([
                "evaluate",
                "--tasks",
                tasks,
                "--task-dir",
                work.path().to_str().unwrap(),
                "--no-db",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{tasks}: {err}"
        );
    }
}

/// wikitext-style rolling log-likelihoods and gsm8k-style generations equal
/// mlx-lm's `MLXLM.loglikelihood_rolling` and `MLXLM.generate_until` on the
/// same documents and prompts (scripts/oracle/evaluate_tasks_reference.py),
/// and the run is recorded in the eval database with the harness's metrics.
#[test]
fn rolling_and_generation_match_mlx_lm() {
    let py = oracle_python().expect("the oracle (mlx-lm) is required for this test");
    let dir = model_dir();
    let work = tempfile::tempdir().unwrap();
    let db_file = work.path().join("evals.db");
    let out = run_ok(&[
        "evaluate",
        "--model",
        dir.to_str().unwrap(),
        "--tasks",
        "wikitext,gsm8k",
        "--task-dir",
        repo_root().join("tests/data/tasks").to_str().unwrap(),
        "--limit",
        "2",
        "--num-shots",
        "1",
        "--max-tokens",
        "32",
        "--json",
        "--db",
        db_file.to_str().unwrap(),
    ]);
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (rolling, generated) = (&ours["results"][0], &ours["results"][1]);

    let docs = load_docs("wikitext", &task_file("wikitext"), Some(2)).unwrap();
    // One shot: the model then ends its first answer with a blank line and
    // "Question:" within the limit, so the `until` cut is exercised.
    let items = load_items("gsm8k", &task_file("gsm8k"), 1, FEWSHOT_SEED, Some(2)).unwrap();
    let requests = serde_json::json!({
        "rolling": docs,
        "generate": items.iter().map(|it| serde_json::json!({
            "context": it.context, "until": GSM8K_UNTIL, "max_gen_toks": 32,
        })).collect::<Vec<_>>(),
    });
    let req_file = work.path().join("requests.json");
    std::fs::write(&req_file, requests.to_string()).unwrap();
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/evaluate_tasks_reference.py"))
        .arg("--model")
        .arg(&dir)
        .arg("--requests")
        .arg(&req_file)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "evaluate_tasks_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let lls = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let (ours_ll, theirs_ll) = (
        lls(&rolling["loglikelihoods"]),
        lls(&theirs["loglikelihoods"]),
    );
    assert_eq!(ours_ll.len(), 2);
    assert_eq!(ours_ll.len(), theirs_ll.len());
    for (x, y) in ours_ll.iter().zip(&theirs_ll) {
        assert!((x - y).abs() <= 1e-3 * y.abs(), "ours {x} vs mlx-lm {y}");
    }
    // The harness's word perplexity from mlx-lm's log-likelihoods.
    let words: f64 = rolling["words"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_f64().unwrap())
        .sum();
    let want = (-theirs_ll.iter().sum::<f64>() / words).exp();
    let got = rolling["word_perplexity"].as_f64().unwrap();
    assert!((got - want).abs() <= 1e-3 * want, "{got} vs {want}");

    assert_eq!(generated["generations"], theirs["generations"]);
    assert_eq!(generated["generations"].as_array().unwrap().len(), 2);

    let db = mlx_bun::evaldb::EvalDb::open(&db_file).unwrap();
    let runs = db.list(Some("evaluate"), 10).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, "done");
    let names: Vec<String> = db
        .metrics(runs[0].id)
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    for want in [
        "wikitext/word_perplexity",
        "wikitext/byte_perplexity",
        "wikitext/bits_per_byte",
        "gsm8k/exact_match,strict-match",
        "gsm8k/exact_match,flexible-extract",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
}

#[test]
fn new_tasks_render_as_the_harness_defines_them() {
    let docs = load_docs("wikitext", &task_file("wikitext"), None).unwrap();
    assert_eq!(
        docs[1],
        " == History ==\nThe mill was built in 1820 and closed in 1961; its wheel, \
         \"the largest in the county\", still turns.\n"
    );
    let items = load_items("gsm8k", &task_file("gsm8k"), 1, FEWSHOT_SEED, Some(2)).unwrap();
    assert_eq!(
        items[1].context,
        "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\n\
         Answer: Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7\n\n\
         Question: Sara reads 10 pages a day. How many pages does she read in 3 days?\nAnswer:"
    );
    let work = tempfile::tempdir().unwrap();
    let bad = work.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"title\": \"x\"}\n").unwrap();
    let err = format!("{:#}", load_docs("wikitext", &bad, None).unwrap_err());
    assert!(err.contains("line 1: no field \"page\""), "{err}");
    let err = format!(
        "{:#}",
        load_items("gsm8k", &bad, 0, FEWSHOT_SEED, None).unwrap_err()
    );
    assert!(err.contains("line 1: no field \"question\""), "{err}");
}
