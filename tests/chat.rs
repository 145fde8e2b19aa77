//! `mlx-bun chat` driven as a real child process through its stdin: the KV
//! cache carries across turns (the second turn processes only the new
//! tokens), `r` resets, `q` quits, and SIGINT stops a reply but not the
//! session.

mod common;

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{bin, model_dir};

fn spawn(args: &[&str]) -> Child {
    bin()
        .arg("chat")
        .arg("--model")
        .arg(model_dir())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting mlx-bun chat")
}

/// (processed, reused) of every turn's stats line on stderr.
fn turns(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt: "))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .take(2)
                .map(|s| s.parse().unwrap())
                .collect();
            (nums[0], nums[1])
        })
        .collect()
}

#[test]
fn turns_reuse_the_cache_and_reset_forgets_it() {
    let mut child = spawn(&["-n", "12"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"What is the capital of France?\nAnd of Germany?\nh\nr\nWhat is the capital of France?\nq\n")
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chat failed: {stderr}");
    let t = turns(&stderr);
    assert_eq!(t.len(), 3, "{stderr}");
    // Turn 1 starts empty; turn 2 reuses turn 1 (prompt and reply) and
    // processes only its own few tokens.
    assert_eq!(t[0].1, 0);
    assert!(t[1].1 > t[0].0, "turn 2 reused {} of {}", t[1].1, t[0].0);
    assert!(t[1].0 < 20, "turn 2 processed {} tokens", t[1].0);
    // After `r` the same first question is processed from scratch again.
    assert_eq!(t[2], t[0], "{stderr}");
    let replies: Vec<&str> = stdout.lines().collect();
    assert!(replies[0].contains("Paris"), "{stdout}");
    assert!(replies[1].contains("Berlin"), "{stdout}");
    assert_eq!(
        replies[0], replies[2],
        "the reset conversation answers the same"
    );
    assert!(stderr.contains("q: quit") && stderr.contains("[conversation reset]"));
    assert!(stderr.trim_end().ends_with("bye"));
}

#[test]
fn interrupt_stops_the_reply_not_the_session() {
    let mut child = spawn(&["-n", "60"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    stdin
        .write_all(b"Write a very long story about a dragon and a knight.\n")
        .unwrap();
    stdin.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let chunk = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the reply never started");
        seen.extend(chunk);
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    stdin.write_all(b"Say hello.\nq\n").unwrap();
    drop(stdin);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let exit = child.wait().unwrap();
    reader.join().unwrap();
    assert!(exit.success(), "chat died: {stderr}");
    let t = turns(&stderr);
    assert_eq!(t.len(), 2, "{stderr}");
    let first = stderr.lines().find(|l| l.starts_with("[prompt:")).unwrap();
    assert!(first.contains("stopped"), "{first}");
    let generated: usize = first
        .split("reply: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(generated < 60, "the reply was not cut: {generated}");
    assert!(t[1].1 > 0, "the second turn reused nothing: {stderr}");
}
