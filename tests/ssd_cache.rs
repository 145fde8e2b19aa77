//! The prompt cache's SSD tier (`serve --ssd-cache`) end to end: real
//! `mlx-bun serve` child processes on loopback, restarted between requests
//! and killed with SIGKILL mid-write; and `serve --kv-bits/--max-kv-size`
//! against `generate` with the same flags.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::blocking::Client;
use serde_json::{json, Value};

fn model() -> PathBuf {
    common::float32_model()
}

/// A server process, killed (SIGKILL) when dropped.
struct Server {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Server {
    fn start(extra: &[&str], env: &[(&str, &str)]) -> Server {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("mlx-bun-ssd-test-{}-{n}.log", std::process::id()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-bun"))
            .args(["serve", "--port", "0", "--log-level", "info", "--model"])
            .arg(model())
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting mlx-bun serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let base = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find("http://") {
                        break line[at..].split_whitespace().next().unwrap().to_string();
                    }
                }
                Err(_) => panic!(
                    "server did not become ready: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        };
        Server { child, base, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A greedy chat completion: its text and cached prompt tokens.
    fn chat(&self, content: &str) -> (String, u64) {
        let (text, cached, _) = self.chat_usage(content);
        (text, cached)
    }

    /// `chat`, with the prompt's length in tokens.
    fn chat_usage(&self, content: &str) -> (String, u64, u64) {
        let body = json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, "temperature": 0,
        });
        let r = client()
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&body)
            .send()
            .expect("request failed");
        assert_eq!(r.status(), 200, "{}", self.log());
        let v: Value = r.json().unwrap();
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        (text, cached, v["usage"]["prompt_tokens"].as_u64().unwrap())
    }

    fn ssd_stats(&self) -> Value {
        let v: Value = client()
            .get(format!("{}/stats", self.base))
            .send()
            .unwrap()
            .json()
            .unwrap();
        v["ssd_cache"].clone()
    }

    /// Waits until the tier has committed `n` files.
    fn wait_writes(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.ssd_stats()["writes"].as_u64().unwrap() < n {
            assert!(Instant::now() < deadline, "no write: {}", self.ssd_stats());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and the exit status.
    fn stop(mut self) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{}", self.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

const STORY: &str = "Here is a short story. A lighthouse keeper on a rocky island kept a \
    logbook of every ship that passed, the weather of each morning, and the birds that \
    rested on the railing. One winter a storm cut the island off for three weeks. \
    Summarize the story in one sentence.";

#[test]
fn a_restart_restores_from_disk_token_identical_to_uncached_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let ssd_flags = ["--ssd-cache", ssd.to_str().unwrap(), "--prompt-cache", "0"];
    let follow_up = format!("{STORY} Then name the keeper.");
    // References without any cache.
    let plain = Server::start(&["--prompt-cache", "0"], &[]);
    let (want, cached) = plain.chat(STORY);
    assert_eq!(cached, 0);
    let (want_follow_up, _) = plain.chat(&follow_up);
    assert!(!want.is_empty());
    drop(plain);

    let first = Server::start(&ssd_flags, &[]);
    let (got, cached) = first.chat(STORY);
    assert_eq!((got.as_str(), cached), (want.as_str(), 0));
    first.wait_writes(1);
    assert_eq!(first.ssd_stats()["misses"], 1);
    first.stop();
    assert_eq!(files(&ssd).len(), 1, "{:?}", files(&ssd));

    // A new process: the prefix comes from disk, trimmed to what the prompt
    // shares with the entry (which also holds the generated tokens).
    let second = Server::start(&ssd_flags, &[]);
    let (got, cached, prompt) = second.chat_usage(STORY);
    assert_eq!(cached, prompt - 1, "all but the last prompt token restored");
    assert_eq!(
        got, want,
        "restored continuation differs from the uncached one"
    );
    // A longer prompt sharing the prefix: restore, trim, prefill the rest.
    let (got, cached_follow_up, prompt_follow_up) = second.chat_usage(&follow_up);
    assert!(cached_follow_up + 10 > cached && cached_follow_up + 5 < prompt_follow_up);
    assert_eq!(got, want_follow_up);
    let s = second.ssd_stats();
    assert_eq!(s["hits"], 2, "{s}");
    assert!(s["restore_s"]["last"].as_f64().unwrap() > 0.0, "{s}");
    let metrics = client()
        .get(format!("{}/metrics", second.base))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("mlx_bun_ssd_cache_hits_total 2"),
        "{metrics}"
    );
    second.stop();
}

/// Copies `from` to `to` with `edit` applied, dated `ahead` in the future so
/// it is the most recently used entry.
fn plant(from: &Path, to: &Path, ahead: u64, edit: impl Fn(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(from).unwrap();
    edit(&mut bytes);
    std::fs::write(to, &bytes).unwrap();
    let f = std::fs::File::options().write(true).open(to).unwrap();
    f.set_modified(SystemTime::now() + Duration::from_secs(ahead))
        .unwrap();
}

#[test]
fn kill_9_during_writes_then_restart_reads_no_corrupt_entry() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let ssd_flags = ["--ssd-cache", ssd.to_str().unwrap(), "--prompt-cache", "0"];
    // Each write pauses between its fsync and its rename.
    let slow = [("MLX_BUN_SSD_WRITE_DELAY_MS", "3000")];
    let mut first = Server::start(&ssd_flags, &slow);
    let (want, _) = first.chat(STORY);
    first.wait_writes(1);
    let committed = files(&ssd);
    assert_eq!(committed.len(), 1);
    first.chat("What is the capital of France? Answer in one word.");
    // The second entry is being written: kill the process mid-write.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !files(&ssd).iter().any(|f| f.ends_with(".tmp")) {
        assert!(Instant::now() < deadline, "no write in flight");
        std::thread::sleep(Duration::from_millis(20));
    }
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert!(files(&ssd).iter().any(|f| f.ends_with(".tmp")));

    // Entries with the same tokens as the committed one, but corrupt; they
    // are the most recently used, so they are tried first.
    let good = ssd.join(&committed[0]);
    plant(
        &good,
        &ssd.join("00000000000000aa-1.safetensors"),
        60,
        |b| {
            let n = b.len();
            b[n - 3] ^= 0x40;
        },
    );
    plant(
        &good,
        &ssd.join("00000000000000bb-1.safetensors"),
        30,
        |b| {
            b.truncate(b.len() - 64);
        },
    );
    plant(&good, &ssd.join("00000000000000cc-1.safetensors"), 0, |b| {
        b.truncate(16);
    });

    let second = Server::start(&ssd_flags, &[]);
    assert!(
        !files(&ssd).iter().any(|f| f.ends_with(".tmp")),
        "leftover temporary files are removed at start: {:?}",
        files(&ssd)
    );
    let (got, cached, prompt) = second.chat_usage(STORY);
    assert_eq!(
        cached,
        prompt - 1,
        "the committed entry survives: {}",
        second.log()
    );
    assert_eq!(got, want);
    let s = second.ssd_stats();
    assert_eq!(s["quarantined"], 3, "{s}");
    assert_eq!(s["hits"], 1, "{s}");
    let quarantined = files(&ssd.join("quarantine"));
    assert_eq!(quarantined.len(), 3, "{quarantined:?}");
    assert!(second.log().contains("quarantine"), "{}", second.log());
    // The entry that was being written when the process died is not there
    // (at most the chat template's opening is shared with the other entry).
    let (_, cached, prompt) =
        second.chat_usage("What is the capital of France? Answer in one word.");
    assert!(cached + 8 < prompt, "{cached} of {prompt}");
    second.stop();
}

/// A folder the server cannot write to: a read-only folder when the tests
/// do not run as root, else procfs (read-only for everyone).
fn read_only_folder(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(ro.join("probe"), b"x").is_err() {
        return ro;
    }
    PathBuf::from("/proc/self/fdinfo")
}

#[test]
fn a_read_only_folder_drops_writes_logs_once_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let ro = read_only_folder(dir.path());
    let server = Server::start(
        &["--ssd-cache", ro.to_str().unwrap(), "--prompt-cache", "0"],
        &[],
    );
    let (a, _) = server.chat(STORY);
    let (b, _) = server.chat("What is the capital of France? Answer in one word.");
    assert!(!a.is_empty() && !b.is_empty());
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.ssd_stats()["write_errors"].as_u64().unwrap() < 2 {
        assert!(Instant::now() < deadline, "{}", server.ssd_stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.ssd_stats()["writes"], 0);
    let log = server.log();
    assert_eq!(
        log.matches("writes that fail are dropped").count(),
        1,
        "{log}"
    );
    let (again, _) = server.chat(STORY);
    assert_eq!(again, a);
    server.stop();
}

/// `generate` with `flags`: its text.
fn generate(content: &str, flags: &[&str]) -> String {
    let out = common::bin()
        .args(["generate", "--max-tokens", "8", "--model"])
        .arg(model())
        .args(["--prompt", content])
        .args(flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

#[test]
fn serve_quantized_and_bounded_caches_match_generate_and_restore_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let q = [
        "--kv-bits",
        "8",
        "--kv-group-size",
        "32",
        "--quantized-kv-start",
        "0",
    ];
    let want = generate(STORY, &q);
    let mut flags = vec!["--ssd-cache", ssd.to_str().unwrap(), "--prompt-cache", "0"];
    flags.extend(q);
    let first = Server::start(&flags, &[]);
    let (got, _) = first.chat(STORY);
    assert_eq!(got, want, "serve --kv-bits 8 differs from generate");
    first.wait_writes(1);
    first.stop();
    let second = Server::start(&flags, &[]);
    let (got, cached, prompt) = second.chat_usage(STORY);
    assert_eq!(
        cached,
        prompt - 1,
        "a quantized entry restores: {}",
        second.log()
    );
    assert_eq!(got, want);
    second.stop();
    // Other KV settings cannot use that entry: it is set aside.
    let dense = Server::start(&flags[..4], &[]);
    let (_, cached) = dense.chat(STORY);
    assert_eq!(cached, 0);
    assert_eq!(dense.ssd_stats()["quarantined"], 1);
    drop(dense);

    let bounded = ["--max-kv-size", "24"];
    let want = generate(STORY, &bounded);
    let server = Server::start(&bounded, &[]);
    let (got, _) = server.chat(STORY);
    assert_eq!(got, want, "serve --max-kv-size differs from generate");
    server.stop();
}
