//! `mlx-bun evaluate`: task rendering as lm-evaluation-harness defines it,
//! and log-likelihoods equal to `mlx_lm.evaluate.MLXLM.loglikelihood` on the
//! same items (scripts/oracle/evaluate_reference.py).

mod common;

use std::process::Command;

use common::{bin, model_dir, oracle_python, repo_root, run_ok};
use mlx_bun::eval::tasks::load_task;

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
