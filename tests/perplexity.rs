//! `mlx-bun perplexity` against mlx-lm's scoring (`mlx_lm.perplexity.eval_ppl`)
//! on the same token rows, and its data handling and errors.

mod common;

use std::process::Command;

use common::{bin, model_dir, oracle_python, repo_root, run_ok};
use mlx_bun::eval::perplexity::{token_rows, RowOptions};
use mlx_bun::tokenizer::Tokenizer;

fn ppl_json(args: &[&str]) -> serde_json::Value {
    let out = run_ok(args);
    serde_json::from_slice(&out.stdout).expect("--json prints one object")
}

#[test]
fn perplexity_matches_mlx_lm_on_the_same_rows() {
    let py = oracle_python().expect("the oracle's Python is required");
    let dir = model_dir();
    let data = repo_root().join("tests/data/eval/ppl.txt");
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/perplexity_reference.py"))
        .arg("--model")
        .arg(&dir)
        .arg("--data-file")
        .arg(&data)
        .args([
            "--sequence-length",
            "32",
            "--num-samples",
            "4",
            "--batch-size",
            "2",
        ])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perplexity_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // The same rows, token for token.
    let tok = Tokenizer::load(&dir).unwrap();
    let records = mlx_bun::eval::data::load_records(data.to_str().unwrap()).unwrap();
    let rows = token_rows(
        &tok,
        &records,
        &RowOptions {
            sequence_length: 32,
            num_samples: Some(4),
            seed: 123,
        },
    )
    .unwrap();
    let their_rows: Vec<Vec<i32>> = serde_json::from_value(theirs["rows"].clone()).unwrap();
    assert_eq!(rows, their_rows);

    // The same perplexity and standard error, to 1e-3 relative.
    let ours = ppl_json(&[
        "perplexity",
        "--model",
        dir.to_str().unwrap(),
        "--data-path",
        data.to_str().unwrap(),
        "--sequence-length",
        "32",
        "--num-samples",
        "4",
        "--batch-size",
        "2",
        "--json",
        "--no-db",
    ]);
    for key in ["perplexity", "standard_error"] {
        let (a, b) = (ours[key].as_f64().unwrap(), theirs[key].as_f64().unwrap());
        eprintln!("{key}: ours {a}, mlx-lm {b}");
        assert!(
            (a - b).abs() <= 1e-3 * b.abs(),
            "{key}: ours {a} vs mlx-lm {b}"
        );
    }
    assert_eq!(ours["rows"], 4);
    assert_eq!(ours["tokens"], 4 * 31);
}

/// Chat (`messages`, one row with `tools`, one with a system turn),
/// prompt/completion and text JSONL datasets: the rows mlx-lm's own
/// `load_data` builds (its dataset classes, its numpy-seeded document
/// order; scripts/oracle/perplexity_data_reference.py) token for token, and
/// its `eval_ppl` perplexity to 1e-3 relative.
#[test]
fn dataset_rows_and_perplexity_match_mlx_lm_load_data() {
    let py = oracle_python().expect("the oracle's Python is required");
    let dir = model_dir();
    let files: Vec<String> = ["ppl_chat.jsonl", "ppl_completions.jsonl", "ppl_text.jsonl"]
        .iter()
        .map(|f| {
            repo_root()
                .join("tests/data/eval")
                .join(f)
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let (seq, n, batch) = ("48", "3", "3");
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/perplexity_data_reference.py"))
        .arg("--model")
        .arg(&dir)
        .args([
            "--sequence-length",
            seq,
            "--num-samples",
            n,
            "--batch-size",
            batch,
            "--seed",
            "123",
        ])
        .args(&files)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perplexity_data_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let mut seen = Vec::new();
    for file in &files {
        let want = &theirs[file.as_str()];
        let records = mlx_bun::eval::data::load_records(file).unwrap();
        let rows = token_rows(
            &tok,
            &records,
            &RowOptions {
                sequence_length: 48,
                num_samples: Some(3),
                seed: 123,
            },
        )
        .unwrap();
        let their_rows: Vec<Vec<i32>> = serde_json::from_value(want["rows"].clone()).unwrap();
        assert_eq!(rows, their_rows, "{file}: rows");
        seen.push(rows);
        let ours = ppl_json(&[
            "perplexity",
            "--model",
            dir.to_str().unwrap(),
            "--data-path",
            file,
            "--sequence-length",
            seq,
            "--num-samples",
            n,
            "--batch-size",
            batch,
            "--json",
            "--no-db",
        ]);
        for key in ["perplexity", "standard_error"] {
            let (a, b) = (ours[key].as_f64().unwrap(), want[key].as_f64().unwrap());
            eprintln!("{file}: {key}: ours {a}, mlx-lm {b}");
            assert!(
                (a - b).abs() <= 1e-3 * b.abs(),
                "{file}: {key}: ours {a} vs mlx-lm {b}"
            );
        }
    }
    // The three datasets give three different row sets (the order and the
    // row kinds matter).
    assert_ne!(seen[0], seen[1]);
    assert_ne!(seen[0], seen[2]);
}

#[test]
fn all_rows_jsonl_and_the_data_alias() {
    let work = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_root().join("tests/data/eval/ppl.txt")).unwrap();
    let tok = Tokenizer::load(&model_dir()).unwrap();
    // The whole file is one document: every complete row is scored with -1.
    let n_tokens = tok.encode(&text).unwrap().len() + 1;
    let all = ppl_json(&[
        "perplexity",
        "--data",
        repo_root()
            .join("tests/data/eval/ppl.txt")
            .to_str()
            .unwrap(),
        "--sequence-length",
        "64",
        "--num-samples",
        "-1",
        "--batch-size",
        "4",
        "--json",
        "--no-db",
    ]);
    assert_eq!(all["rows"].as_u64().unwrap() as usize, n_tokens / 64);
    let ppl = all["perplexity"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{all}");

    // A folder of JSONL documents (one per paragraph).
    let jsonl = work.path().join("docs.jsonl");
    let lines: Vec<String> = text
        .split("\n\n")
        .map(|p| serde_json::json!({ "text": p }).to_string())
        .collect();
    std::fs::write(&jsonl, lines.join("\n")).unwrap();
    let folder = ppl_json(&[
        "perplexity",
        "--data-path",
        work.path().to_str().unwrap(),
        "--sequence-length",
        "32",
        "--num-samples",
        "2",
        "--json",
        "--no-db",
    ]);
    assert_eq!(folder["rows"], 2);
}

#[test]
fn bad_data_gets_a_clear_error() {
    let work = tempfile::tempdir().unwrap();
    let bad = work.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\n{\"prompt\": \"no text\"}\n").unwrap();
    let ppl = repo_root().join("tests/data/eval/ppl.txt");
    let cases: [(&str, &str); 3] = [
        (bad.to_str().unwrap(), "line 2: no string field \"text\""),
        ("/no/such/file.txt", "neither a local file or folder"),
        (ppl.to_str().unwrap(), "fewer than one row"),
    ];
    for (i, (path, want)) in cases.iter().enumerate() {
        let seq = if i == 2 { "100000" } else { "32" };
        let out = bin()
            .args([
                "perplexity",
                "--data-path",
                path,
                "--sequence-length",
                seq,
                "--no-db",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path} was accepted");
        assert!(err.contains(want), "{path}: {err}");
    }
}
