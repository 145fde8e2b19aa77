//! Faults with real processes: `kill -9` in the middle of a checkpoint write,
//! SIGTERM while a request streams, and a cache folder that cannot be written.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{bin, model_dir, repo_root};
use mlx_bun::train::trainer::partial_path;

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".safetensors") && !name.starts_with('.')
        })
        .collect();
    files.sort();
    files
}

fn has_partial(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(|e| e.ok()).any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with('.') && name.ends_with(".partial.safetensors")
        })
    })
}

fn train_args<'a>(model: &'a str, adapters: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "--model",
        model,
        "--adapter-path",
        adapters,
        "--num-layers",
        "4",
        "--lora-rank",
        "64",
        "--batch-size",
        "1",
        "--max-seq-length",
        "64",
        "--steps-per-eval",
        "100000",
        "--val-batches",
        "1",
        "--no-db",
        "--json",
    ]
}

#[test]
fn kill_9_during_a_checkpoint_write_loses_nothing_committed() {
    let model = model_dir();
    let data = repo_root().join("tests/data/sft");
    let work = tempfile::tempdir().unwrap();
    let adapters = work.path().join("adapters");
    let (model_s, adapters_s) = (model.to_str().unwrap(), adapters.to_str().unwrap());
    let mut args = train_args(model_s, adapters_s);
    args.extend([
        "--data",
        data.to_str().unwrap(),
        "--iters",
        "40",
        "--save-every",
        "1",
    ]);
    let mut child = bin()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A step event for iteration k+1 means checkpoint k was written (the
    // save ends iteration k): those are committed.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Kill the moment a checkpoint is being written (its temporary file
    // exists), after at least two complete ones.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut saved: Vec<PathBuf> = Vec::new();
    let mut killed_mid_write = false;
    loop {
        while let Ok(line) = rx.try_recv() {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if v["event"] == "step" {
                    let it = v["iter"].as_u64().unwrap();
                    if it > 1 {
                        saved.push(adapters.join(format!("{:07}_adapters.safetensors", it - 1)));
                    }
                }
            }
        }
        if saved.len() >= 2 && has_partial(&adapters) {
            child.kill().unwrap();
            killed_mid_write = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "training did not reach a checkpoint"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    child.wait().unwrap();
    // Without the temporary file (writes straight to the final name) the
    // kill never lands and this fails: the test is about that window.
    assert!(killed_mid_write, "never caught a checkpoint being written");
    assert!(saved.len() >= 2, "the trainer reported no checkpoints");

    // Every checkpoint reported as saved is there, and every file under a
    // final name is complete.
    let on_disk = checkpoints(&adapters);
    for s in &saved {
        assert!(
            on_disk.contains(s),
            "{} was reported saved but is gone",
            s.display()
        );
    }
    for file in &on_disk {
        mlx_bun::model::weights::check_safetensors_file(file).unwrap();
        let tensors = mlx_rs::Array::load_safetensors(file).unwrap();
        assert!(!tensors.is_empty(), "{}", file.display());
    }
    let latest = adapters.join("adapters.safetensors");
    assert!(latest.is_file());
    assert_ne!(partial_path(&latest), latest);

    // Resume from the surviving checkpoint.
    let resumed = work.path().join("resumed");
    let mut args = train_args(model_s, resumed.to_str().unwrap());
    args.extend([
        "--data",
        data.to_str().unwrap(),
        "--iters",
        "1",
        "--resume-adapter-file",
        latest.to_str().unwrap(),
    ]);
    let out = bin().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(resumed.join("adapters.safetensors").is_file());
}

#[test]
fn sigterm_with_a_request_in_flight_finishes_it_and_exits_0() {
    let model = model_dir();
    let mut child = bin()
        .args([
            "serve",
            "--port",
            "0",
            "--model",
            model.to_str().unwrap(),
            "--log-level",
            "warn",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    let base = ready[ready.find("http://").expect(&ready)..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "max_tokens": 16, "stream": true,
    });
    let mut response = reqwest::blocking::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut first = [0u8; 16];
    response.read_exact(&mut first).unwrap();
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let mut rest = String::new();
    response.read_to_string(&mut rest).unwrap();
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_unwritable_cache_folder_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Permissions do not bind root: then a regular file blocks the path instead.
    let cache = if std::fs::write(cache.join("probe"), b"").is_ok() {
        let blocker = tmp.path().join("blocker");
        std::fs::write(&blocker, b"").unwrap();
        blocker.join("cache")
    } else {
        cache
    };
    let out = bin()
        .args(["generate", "--prompt", "Hi", "--max-tokens", "1"])
        .env("MLX_BUN_CACHE", &cache)
        .env(
            "MLX_BUN_DEFAULT_GGUF",
            mlx_bun::default_model::ensure_gguf().unwrap(),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") || stderr.contains("\nerror: "),
        "{stderr}"
    );
    assert!(stderr.contains(&*cache.to_string_lossy()), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
