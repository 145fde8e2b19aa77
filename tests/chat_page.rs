//! The chat page at `/`, end to end in headless Chromium: the page is loaded
//! from a real `mlx-bun serve`, a prompt is typed and sent, the streamed
//! answer and its stats are read back from the DOM (then a JSON-schema turn
//! and a turn with another model from the picker), and a screenshot is kept
//! at `target/test-artifacts/chat-page.png`. Chromium is driven over the
//! DevTools protocol on `--remote-debugging-pipe` (no WebDriver, no
//! WebSocket): JSON messages separated by NUL bytes on file descriptors 3
//! (commands) and 4 (replies and events).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::server::Server;
use serde_json::{json, Value};

const CHROMIUM: &str = "chromium";

struct Browser {
    child: Child,
    commands: ChildStdin,
    replies: BufReader<ChildStdout>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch(log: &std::path::Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new("sh")
            .arg("-c")
            // fd 3 reads our commands, fd 4 carries the replies.
            .arg(r#"exec "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg("sh")
            .arg(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-pipe",
                "--window-size=1000,700",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("starting chromium");
        let mut child = child;
        Browser {
            commands: child.stdin.take().unwrap(),
            replies: BufReader::new(child.stdout.take().unwrap()),
            child,
            next_id: 0,
            session: None,
            _profile: profile,
        }
    }

    /// Sends one DevTools command and returns its result (events are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .expect("chromium closed its pipe");
        loop {
            let mut raw = Vec::new();
            let n = self.replies.read_until(0, &mut raw).unwrap();
            assert!(n > 0, "chromium exited while answering {method}");
            raw.pop();
            let reply: Value = serde_json::from_slice(&raw).unwrap();
            if reply["id"] != id {
                continue;
            }
            if let Some(error) = reply.get("error") {
                panic!("{method} failed: {error}");
            }
            return reply["result"].clone();
        }
    }

    /// The value of a JavaScript expression in the page (promises awaited).
    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression} threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expression` until it is true.
    fn wait_for(&mut self, expression: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.eval(expression) != json!(true) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {expression}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types `text` into the prompt box and presses Enter, as a user does.
    fn type_and_send(&mut self, text: &str) {
        self.eval("document.getElementById('prompt').focus()");
        self.call("Input.insertText", json!({"text": text}));
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": "Enter", "code": "Enter",
                       "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}),
            );
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("target"));
    target.join("test-artifacts")
}

/// Waits for the exchange to end; returns the last answer's text and stats.
fn finished_answer(b: &mut Browser) -> (String, String) {
    b.wait_for(
        "['done', 'error'].includes(document.body.dataset.state)",
        Duration::from_secs(240),
    );
    let answer = b.eval("[...document.querySelectorAll('.assistant .answer')].pop().textContent");
    assert_eq!(
        b.eval("document.body.dataset.state"),
        "done",
        "the page reports an error: {answer}"
    );
    let stats = b.eval("[...document.querySelectorAll('.assistant .stats')].pop().textContent");
    (
        answer.as_str().unwrap().to_string(),
        stats.as_str().unwrap().to_string(),
    )
}

#[test]
fn chat_page_streams_an_answer_in_chromium() {
    if !common::require_tool(CHROMIUM) {
        return;
    }
    let model = common::model_dir();
    let others = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(common::float32_model(), others.path().join("smol-f32")).unwrap();
    let server = Server::start(
        &model,
        &["--allowed-models", others.path().to_str().unwrap()],
    );
    let page = server.get_page();
    assert!(page.contains("<title>mlx-bun chat</title>"));

    let log = std::env::temp_dir().join(format!("mlx-bun-chromium-{}.log", std::process::id()));
    let mut b = Browser::launch(&log);
    let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
    let attached = b.call(
        "Target.attachToTarget",
        json!({"targetId": target["targetId"], "flatten": true}),
    );
    b.session = Some(attached["sessionId"].as_str().unwrap().to_string());
    b.call("Page.enable", json!({}));
    b.call("Page.navigate", json!({"url": server.url("/")}));

    // The model picker fills from /v1/models.
    b.wait_for(
        "document.querySelectorAll('#model option').length > 0",
        Duration::from_secs(30),
    );
    assert_eq!(
        b.eval("document.getElementById('model').value"),
        json!(model.to_str().unwrap())
    );

    // Count DOM updates to see the answer arrive in pieces, not at once.
    b.eval(
        "window.updates = 0; new MutationObserver(() => window.updates++).observe(\
         document.getElementById('messages'), {subtree: true, childList: true, characterData: true});\
         document.getElementById('max-tokens').value = '12';\
         document.getElementById('temperature').value = '0'; true",
    );
    b.type_and_send("Say hello.");
    let (answer, stats) = finished_answer(&mut b);
    assert!(!answer.trim().is_empty(), "empty answer");
    for part in [" tokens", "tok/s", "TTFT"] {
        assert!(stats.contains(part), "stats {stats:?} lack {part:?}");
    }
    let updates = b.eval("window.updates").as_u64().unwrap();
    assert!(updates > 4, "only {updates} DOM updates: not streamed");
    assert_eq!(
        b.eval("document.querySelector('.user').textContent"),
        "Say hello."
    );

    // With the JSON-schema toggle on, the answer follows the schema's grammar.
    b.eval(
        "document.getElementById('json-mode').click();\
         document.getElementById('max-tokens').value = '40'; true",
    );
    b.type_and_send("Reply in JSON.");
    let (json_answer, _) = finished_answer(&mut b);
    assert!(
        json_answer.trim_start().starts_with('{') && json_answer.contains("\"answer\""),
        "not JSON from the schema: {json_answer:?}"
    );

    // Another model from the picker answers the next turn.
    assert_eq!(
        b.eval("[...document.querySelectorAll('#model option')].map(o => o.value).join(',')"),
        json!(format!("{},smol-f32", model.display()))
    );
    b.eval(
        "document.getElementById('json-mode').click();\
         document.getElementById('model').value = 'smol-f32';\
         document.getElementById('max-tokens').value = '6'; true",
    );
    b.type_and_send("Thanks!");
    let (other, other_stats) = finished_answer(&mut b);
    assert!(!other.trim().is_empty());
    assert!(other_stats.starts_with("smol-f32 ·"), "{other_stats}");

    let shot = b.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
    let dir = artifacts_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("chat-page.png"), &png).unwrap();
}
