//! A real `mlx-bun serve` child on a free loopback port, for the tests that
//! drive the server over HTTP.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A server process. It runs under a small shell that sends it SIGTERM when
/// its standard input closes, so it also ends when the test process ends.
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    pub base: String,
    pub log: PathBuf,
}

impl Server {
    /// Starts `mlx-bun serve --port 0 --model MODEL EXTRA…` and waits for its
    /// ready line.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        Self::start_under(&[], model, extra)
    }

    /// As [`Server::start`], with `before` ahead of `serve` (e.g. `launch -n
    /// 2 --`: the server runs sharded across ranks).
    pub fn start_under(before: &[&str], model: &Path, extra: &[&str]) -> Server {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!(
            "mlx-bun-serve-{}-{}-{n}.log",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        let stderr = std::fs::File::create(&log).expect("creating the server log");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#""$@" & pid=$!; read _; kill -TERM $pid; wait $pid"#)
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_mlx-bun"))
            .args(before)
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starting mlx-bun serve");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(300);
        let base = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find("http://") {
                        let url = line[at..].split_whitespace().next().unwrap();
                        break url.to_string();
                    }
                }
                Err(_) => panic!(
                    "server did not become ready: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        };
        Server {
            child,
            stdin,
            base,
            log,
        }
    }

    /// The process id of the wrapper shell; the server is its child.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends SIGTERM (through the wrapper) without waiting.
    pub fn request_stop(&mut self) {
        drop(self.stdin.take());
    }

    /// Sends SIGTERM (through the wrapper) and waits for the exit status.
    pub fn stop(&mut self, within: Duration) -> std::process::ExitStatus {
        self.request_stop();
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("server did not stop in time: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the server has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Server {
    /// The body of `GET /` (the chat page).
    pub fn get_page(&self) -> String {
        reqwest::blocking::get(self.url("/"))
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.text())
            .expect("GET /")
    }
}
