//! Evaluation data from the Hub and few-shot selection:
//! - `perplexity --data-path ORG/NAME` over a loopback server speaking the
//!   Hub's download protocol, serving parquet datasets this test writes:
//!   the same perplexity as the same text read from a local file, the
//!   `train` split only, and clear errors for a missing repo, an unknown
//!   format or a chat column that holds no message list;
//! - Python's `random.Random` (src/eval/pyrandom.rs) against the oracle's
//!   Python, and `evaluate --num-shots` picking the examples
//!   lm-evaluation-harness picks (scripts/oracle/fewshot_reference.py).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{bin, hub, oracle_python, repo_root};
use mlx_bun::eval::pyrandom::{NumpyRandomState, PyRandom};
use mlx_bun::eval::tasks::load_task_seeded;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use serde_json::{json, Value};

/// A parquet file with an optional UTF-8 column `column` holding `docs`
/// and an `id` column, snappy-compressed, two rows per row group (as
/// pyarrow writes datasets' files: nullable columns, several groups).
fn parquet_bytes(column: &str, docs: &[String]) -> Vec<u8> {
    let schema = parse_message_type(&format!(
        "message schema {{ REQUIRED INT64 id; OPTIONAL BYTE_ARRAY {column} (UTF8); }}"
    ))
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut out = Vec::new();
    let mut w = SerializedFileWriter::new(&mut out, Arc::new(schema), Arc::new(props)).unwrap();
    for (g, chunk) in docs.chunks(2).enumerate() {
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let ids: Vec<i64> = (0..chunk.len() as i64).map(|i| g as i64 * 2 + i).collect();
        col.typed::<Int64Type>()
            .write_batch(&ids, None, None)
            .unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = chunk.iter().map(|d| ByteArray::from(d.as_str())).collect();
        let defs = vec![1i16; chunk.len()];
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
    out
}

/// The sentences of the perplexity test text, one document each.
fn sentences() -> Vec<String> {
    std::fs::read_to_string(repo_root().join("tests/data/eval/ppl.txt"))
        .unwrap()
        .split_inclusive(". ")
        .map(str::to_string)
        .collect()
}

/// `mlx-bun perplexity` on `data` against the hub at `base`, with a fresh
/// Hub cache under `home`.
fn perplexity(data: &str, base: &str, home: &Path) -> std::process::Output {
    bin()
        .args([
            "perplexity",
            "--data-path",
            data,
            "--sequence-length",
            "32",
            "--num-samples",
            "4",
            "--json",
            "--no-db",
        ])
        .env("HF_ENDPOINT", base)
        .env("HF_HOME", home)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap()
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn files(list: &[(&str, Vec<u8>)]) -> HashMap<String, Vec<u8>> {
    list.iter()
        .map(|(n, b)| (n.to_string(), b.clone()))
        .collect()
}

#[test]
fn perplexity_of_a_hub_parquet_dataset_equals_the_local_text() {
    common::model_dir();
    let (served, log, base) = hub::start();
    let tmp = tempfile::tempdir().unwrap();
    let docs = sentences();
    assert!(docs.len() >= 4);
    let other: Vec<String> = vec!["Held-out text that the train split does not hold.".into(); 8];
    {
        let mut s = served.lock().unwrap();
        // Split by file name, as `datasets` infers it; a card without configs.
        s.insert(
            hub::dataset_key("org/ppl-parquet"),
            files(&[
                (".gitattributes", b"*.parquet filter=lfs\n".to_vec()),
                (
                    "README.md",
                    b"---\nlicense: mit\nlanguage:\n- en\n---\n# Text\n".to_vec(),
                ),
                (
                    "data/train-00000-of-00001.parquet",
                    parquet_bytes("text", &docs),
                ),
                (
                    "data/test-00000-of-00001.parquet",
                    parquet_bytes("text", &other),
                ),
            ]),
        );
        // Split declared by the card's default config.
        let card = "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    \
                    path: corpus/part-*.parquet\n  - split: validation\n    path: held/*.parquet\n\
                    ---\n";
        s.insert(
            hub::dataset_key("org/ppl-card"),
            files(&[
                ("README.md", card.as_bytes().to_vec()),
                ("corpus/part-0.parquet", parquet_bytes("text", &docs[..2])),
                ("corpus/part-1.parquet", parquet_bytes("text", &docs[2..])),
                ("held/x.parquet", parquet_bytes("text", &other)),
            ]),
        );
        // Split by folder name; a `training` file name; JSONL.
        s.insert(
            hub::dataset_key("org/ppl-dirs"),
            files(&[
                ("train/a.parquet", parquet_bytes("text", &docs[..3])),
                ("train/b.parquet", parquet_bytes("text", &docs[3..])),
                ("validation/c.parquet", parquet_bytes("text", &other)),
            ]),
        );
        let lines: Vec<String> = docs
            .iter()
            .map(|d| json!({ "text": d }).to_string())
            .collect();
        s.insert(
            hub::dataset_key("org/ppl-jsonl"),
            files(&[
                ("my_training_set.jsonl", lines.join("\n").into_bytes()),
                ("eval.jsonl", b"{\"text\": \"held out\"}\n".to_vec()),
            ]),
        );
    }
    let local = tmp.path().join("docs.jsonl");
    let lines: Vec<String> = docs
        .iter()
        .map(|d| json!({ "text": d }).to_string())
        .collect();
    std::fs::write(&local, lines.join("\n")).unwrap();

    let home = tmp.path().join("hf-home");
    let want = json_of(&perplexity(local.to_str().unwrap(), &base, &home));
    for repo in [
        "org/ppl-parquet",
        "org/ppl-card",
        "org/ppl-dirs",
        "org/ppl-jsonl",
    ] {
        let got = json_of(&perplexity(repo, &base, &home));
        eprintln!(
            "{repo}: perplexity {} (local file {}), rows {}",
            got["perplexity"], want["perplexity"], got["rows"]
        );
        assert_eq!(got["rows"], 4);
        for key in ["perplexity", "standard_error", "mean_loss", "tokens"] {
            assert_eq!(got[key], want[key], "{repo}: {key}");
        }
    }
    // A chat dataset on the Hub gives what the same local file gives.
    let chat = repo_root().join("tests/data/eval/ppl_chat.jsonl");
    served.lock().unwrap().insert(
        hub::dataset_key("org/ppl-chat"),
        files(&[("data/train.jsonl", std::fs::read(&chat).unwrap())]),
    );
    let want = json_of(&perplexity(chat.to_str().unwrap(), &base, &home));
    let got = json_of(&perplexity("org/ppl-chat", &base, &home));
    eprintln!(
        "org/ppl-chat: perplexity {} (local file {})",
        got["perplexity"], want["perplexity"]
    );
    assert_eq!(got["rows"], 4);
    for key in ["perplexity", "standard_error", "mean_loss", "tokens"] {
        assert_eq!(got[key], want[key], "org/ppl-chat: {key}");
    }
    let log = log.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|l| l.ends_with("ppl-parquet/data/train-00000-of-00001.parquet")),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|l| l.ends_with("ppl-card/corpus/part-1.parquet")),
        "{log:?}"
    );
    assert!(
        !log.iter()
            .any(|l| ["/data/test-", "/held/", "/validation/", "/eval.jsonl"]
                .iter()
                .any(|x| l.contains(x))),
        "a file outside the train split was fetched: {log:?}"
    );
}

#[test]
fn hub_dataset_errors_are_clear() {
    let (served, _log, base) = hub::start();
    let tmp = tempfile::tempdir().unwrap();
    let chat = vec![r#"[{"role": "user", "content": "Hi"}]"#.to_string(); 2];
    {
        let mut s = served.lock().unwrap();
        s.insert(
            hub::dataset_key("org/csv-only"),
            files(&[("train.csv", b"text\nhello\n".to_vec())]),
        );
        s.insert(
            hub::dataset_key("org/chat"),
            files(&[("train.parquet", parquet_bytes("messages", &chat))]),
        );
        s.insert(
            hub::dataset_key("org/test-only"),
            files(&[("test.parquet", parquet_bytes("text", &chat))]),
        );
        s.insert(
            hub::dataset_key("org/broken"),
            files(&[("train.parquet", b"PAR1 this is not parquet".to_vec())]),
        );
    }
    let home = tmp.path().join("hf-home");
    let cases = [
        (
            "org/missing",
            "\"org/missing\" is neither a local path nor reachable on the Hub",
        ),
        (
            "org/csv-only",
            "no parquet, JSONL or text files in its train split (train.csv)",
        ),
        (
            "org/chat",
            "train.parquet row 1: no field \"messages\" holding a list",
        ),
        (
            "org/test-only",
            "dataset org/test-only has no train split (files: test.parquet)",
        ),
        ("org/broken", "train.parquet: not a parquet file"),
    ];
    for (repo, want) in cases {
        let out = perplexity(repo, &base, &home);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{repo} was accepted");
        assert!(err.contains(want), "{repo}: {err}");
        assert!(!err.contains("panicked"), "{repo}: {err}");
    }
}

#[test]
fn numpy_permutation_equals_numpy() {
    let cases = json!([
        [123, 10],
        [0, 1],
        [0, 7],
        [1, 2],
        [42, 1000],
        [123, 100000],
        [4294967295u64, 33],
        [7, 65537]
    ]);
    let want = python("numpy_permutation_reference.py", &[&cases.to_string()]);
    for (case, want) in cases
        .as_array()
        .unwrap()
        .iter()
        .zip(want.as_array().unwrap())
    {
        let (seed, n) = (case[0].as_u64().unwrap(), case[1].as_u64().unwrap());
        let got = NumpyRandomState::new(seed as u32).permutation(n as usize);
        let want: Vec<usize> = serde_json::from_value(want.clone()).unwrap();
        assert_eq!(got, want, "seed {seed}, n {n}");
    }
}

/// Runs the oracle's Python on a committed script; its stdout as JSON.
fn python(script: &str, args: &[&str]) -> Value {
    let py = oracle_python().expect("the oracle's Python is required");
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn pyrandom_sample_equals_python() {
    // (n, k): n <= 21 and k <= 5 takes sample's pool branch, n > 21 its set
    // branch; k > 5 widens the pool branch's bound (85 at k = 6, 277 at
    // k = 30); n of 10^12 draws 40-bit numbers.
    let draws: Vec<(usize, usize)> = vec![
        (1, 1),
        (3, 3),
        (10, 0),
        (21, 3),
        (22, 3),
        (1000, 5),
        (85, 6),
        (86, 6),
        (277, 30),
        (278, 30),
        (5000, 200),
        (1_000_000_000_000, 4),
        (12, 3),
        (12, 3),
    ];
    let seeds: [u64; 5] = [1234, 123, 0, 42, (1 << 32) + 5];
    let cases: Vec<Value> = seeds
        .iter()
        .map(|s| json!({"seed": s, "draws": draws}))
        .collect();
    let theirs = python(
        "pyrandom_reference.py",
        &[&serde_json::to_string(&cases).unwrap()],
    );
    for (seed, want) in seeds.iter().zip(theirs.as_array().unwrap()) {
        let mut r = PyRandom::new(*seed);
        for (i, &(n, k)) in draws.iter().enumerate() {
            let got = r.sample(n, k).unwrap();
            let want: Vec<usize> = serde_json::from_value(want["samples"][i].clone()).unwrap();
            assert_eq!(got, want, "seed {seed}, sample({n}, {k})");
        }
        let bits = [r.getrandbits(40), r.getrandbits(64)];
        let want: Vec<u64> = serde_json::from_value(want["bits"].clone()).unwrap();
        assert_eq!(bits.to_vec(), want, "seed {seed}, getrandbits");
    }
    assert!(PyRandom::new(1).sample(3, 4).is_err());
}

/// An ARC-format task file of `n` short questions.
fn arc_file(path: &Path, n: usize) {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            json!({
                "id": format!("q{i}"),
                "question": format!("What is {i} plus one?"),
                "choices": {"text": [format!("{}", i + 1), format!("{}", i + 2)],
                            "label": ["A", "B"]},
                "answerKey": "A",
            })
            .to_string()
        })
        .collect();
    std::fs::write(path, rows.join("\n")).unwrap();
}

fn oracle_shots(
    task: &str,
    file: &Path,
    k: usize,
    seed: u64,
    limit: usize,
) -> (Vec<Vec<usize>>, u64) {
    let r = python(
        "fewshot_reference.py",
        &[
            "--task",
            task,
            "--file",
            file.to_str().unwrap(),
            "--num-shots",
            &k.to_string(),
            "--seed",
            &seed.to_string(),
            "--limit",
            &limit.to_string(),
        ],
    );
    (
        serde_json::from_value(r["shots"].clone()).unwrap(),
        r["dropped_self"].as_u64().unwrap(),
    )
}

#[test]
fn evaluate_num_shots_picks_the_harness_examples() {
    let tmp = tempfile::tempdir().unwrap();
    let arc = tmp.path().join("arc.jsonl");
    arc_file(&arc, 12);
    let limit = 6;
    let out = common::run_ok(&[
        "evaluate",
        "--tasks",
        &format!("arc_easy={}", arc.display()),
        "--num-shots",
        "2",
        "--limit",
        &limit.to_string(),
        "--json",
        "--no-db",
    ]);
    let ours: Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<Vec<usize>> = serde_json::from_value(ours["fewshot"]["arc_easy"].clone()).unwrap();
    // mlx_lm.evaluate's default seed (123) reaches the harness's sampler.
    let (want, dropped) = oracle_shots("arc_easy", &arc, 2, 123, limit);
    eprintln!("shots {got:?}; draws holding the evaluated item: {dropped}");
    assert_eq!(got, want);
    assert!(dropped > 0, "no draw exercised dropping the evaluated item");
    assert_eq!(ours["results"][0]["items"], limit);

    // The contexts hold those examples, in order, solved.
    let items = load_task_seeded("arc_easy", &arc, 2, 123, Some(limit)).unwrap();
    for (i, item) in items.iter().enumerate() {
        let [a, b] = [want[i][0], want[i][1]];
        assert_eq!(
            item.context,
            format!(
                "Question: What is {a} plus one?\nAnswer: {}\n\n\
                 Question: What is {b} plus one?\nAnswer: {}\n\n\
                 Question: What is {i} plus one?\nAnswer:",
                a + 1,
                b + 1
            )
        );
    }

    // Other tasks, seeds and shot counts, in the library (no model run).
    let mmlu = tmp.path().join("mmlu.jsonl");
    let mmlu_rows: Vec<String> = (0..7)
        .map(|i| {
            json!({"question": format!("Q{i}?"), "choices": ["a", "b", "c", "d"],
                   "answer": i % 4, "subject": if i % 2 == 0 { "anatomy" } else { "virology" }})
            .to_string()
        })
        .collect();
    std::fs::write(&mmlu, mmlu_rows.join("\n")).unwrap();
    let data = repo_root().join("tests/data/tasks");
    let cases: Vec<(&str, std::path::PathBuf, usize, u64)> = vec![
        ("arc_easy", arc.clone(), 3, 1234),
        ("arc_easy", arc.clone(), 11, 0),
        ("hellaswag", data.join("hellaswag.jsonl"), 1, 1234),
        ("piqa", data.join("piqa.jsonl"), 1, 7),
        ("mmlu", mmlu.clone(), 2, 1234),
    ];
    for (task, file, k, seed) in cases {
        let items = load_task_seeded(task, &file, k, seed, None).unwrap();
        let got: Vec<Vec<usize>> = items.iter().map(|i| i.shots.clone()).collect();
        let (want, _) = oracle_shots(task, &file, k, seed, items.len());
        assert_eq!(got, want, "{task}, {k} shots, seed {seed}");
    }
    // Too few items for the shots asked: a clear error, not a panic.
    let err = load_task_seeded("arc_easy", &arc, 12, 123, None).unwrap_err();
    assert!(
        format!("{err:#}").contains("12 shots need at least 13 items"),
        "{err:#}"
    );
}
