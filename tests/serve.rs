//! `mlx-bun serve` end to end: the real binary on a free loopback port, the
//! real model, real HTTP. One server is shared by the tests of this binary
//! (loading and warming up costs seconds); the tests that need other flags
//! start a second, small instance.

mod common;

use common::server::Server;

use std::io::Read;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

/// The model under test: `MLX_BUN_TEST_MODEL`, else the default model, else
/// the reference conversion.
fn model_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MLX_BUN_TEST_MODEL") {
        return PathBuf::from(dir);
    }
    mlx_bun::default_model::ensure().unwrap_or_else(|_| PathBuf::from("/tmp/smol-ref"))
}

/// A server of the model under test with `extra` flags.
fn start(extra: &[&str]) -> Server {
    Server::start(&model_dir(), extra)
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| start(&[]))
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

fn post(path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .post(server().url(path))
        .json(body)
        .send()
        .expect("request failed");
    let status = r.status().as_u16();
    (status, r.json().expect("the answer is JSON"))
}

fn post_ok(path: &str, body: &Value) -> Value {
    let (status, v) = post(path, body);
    assert_eq!(status, 200, "{path} failed: {v}");
    v
}

fn get(path: &str) -> (u16, String) {
    let r = client().get(server().url(path)).send().unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn stats() -> Value {
    let (status, text) = get("/stats");
    assert_eq!(status, 200);
    serde_json::from_str(&text).unwrap()
}

/// The `data:` payloads of an SSE body.
fn sse_payloads(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// Posts a streaming request; returns the JSON chunks, checking `[DONE]` ends it.
fn stream(path: &str, body: &Value) -> Vec<Value> {
    let r = client().post(server().url(path)).json(body).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let payloads = sse_payloads(&r.text().unwrap());
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).expect("chunk is JSON"))
        .collect()
}

/// A `logit_bias` that bans end-of-sequence, so a generation runs to its
/// `max_tokens` (tests that count tokens or need a long stream use it).
fn no_eos() -> Value {
    let tokenizer = mlx_bun::tokenizer::Tokenizer::load(&model_dir()).unwrap();
    let bias: serde_json::Map<String, Value> = tokenizer
        .eos_ids
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    Value::Object(bias)
}

fn chat_body(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": "default_model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": no_eos(),
    })
}

fn check_usage(usage: &Value) {
    let p = usage["prompt_tokens"].as_u64().unwrap();
    let c = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), p + c);
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            < p
    );
}

#[test]
fn chat_non_streaming() {
    let v = post_ok("/v1/chat/completions", &chat_body("Say hello.", 4));
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert!(v["system_fingerprint"].as_str().unwrap().starts_with("fp_"));
    let (_, models) = get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(v["model"], models["data"][0]["id"]);
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(!choice["message"]["content"].as_str().unwrap().is_empty());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    check_usage(&v["usage"]);
}

#[test]
fn chat_streaming_matches_non_streaming() {
    let mut body = chat_body("What is the capital of France?", 6);
    let whole = post_ok("/v1/chat/completions", &body);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = stream("/v1/chat/completions", &body);
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(chunks
        .iter()
        .all(|c| c["id"] == id && c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, whole["choices"][0]["message"]["content"]);
    let closing = &chunks[chunks.len() - 2];
    assert_eq!(closing["choices"][0]["finish_reason"], "length");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 6);
    check_usage(&usage_chunk["usage"]);
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null()));
}

#[test]
fn completions_plain_streamed_and_token_ids() {
    let body =
        json!({"prompt": "The three primary colors are", "max_tokens": 5, "logit_bias": no_eos()});
    let v = post_ok("/v1/completions", &body);
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    check_usage(&v["usage"]);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream("/v1/completions", &streamed);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // The same prompt as token ids, as a list and as a list of one list.
    let mut ids_body = body.clone();
    ids_body["return_token_ids"] = json!(true);
    let with_ids = post_ok("/v1/completions", &ids_body);
    let prompt_ids = with_ids["choices"][0]["prompt_token_ids"].clone();
    for prompt in [prompt_ids.clone(), json!([prompt_ids])] {
        let v = post_ok(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 5, "logit_bias": no_eos()}),
        );
        assert_eq!(v["choices"][0]["text"], text.as_str());
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let body = |seed: u64| {
        json!({
            "prompt": "My favourite animal is",
            "max_tokens": 8,
            "temperature": 1.5,
            "top_p": 0.95,
            "top_k": 50,
            "min_p": 0.01,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.5,
            "repetition_penalty": 1.1,
            "seed": seed,
            "user": "tester",
            "logit_bias": no_eos(),
        })
    };
    let text = |seed| post_ok("/v1/completions", &body(seed))["choices"][0]["text"].clone();
    let first = text(7);
    assert_eq!(first, text(7));
    // Another seed gives another continuation (8 tokens at temperature 1.5).
    let others: Vec<Value> = (8..11).map(text).collect();
    assert!(others.iter().any(|t| *t != first), "{first} {others:?}");
}

#[test]
fn stop_strings_end_generation() {
    let body = json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 12, "logit_bias": no_eos()});
    let free = post_ok("/v1/completions", &body);
    let text = free["choices"][0]["text"].as_str().unwrap();
    // Stop on a piece of the free-running text, past its first character.
    let stop: String = text.trim_start().chars().skip(1).take(2).collect();
    assert!(!stop.trim().is_empty(), "unexpected continuation {text:?}");
    let mut stopped_body = body.clone();
    stopped_body["stop"] = json!([stop, "never-appears"]);
    let stopped = post_ok("/v1/completions", &stopped_body);
    let stopped_text = stopped["choices"][0]["text"].as_str().unwrap();
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert!(!stopped_text.contains(&stop));
    assert!(text.starts_with(stopped_text));
}

#[test]
fn logprobs_in_both_shapes() {
    let mut body = chat_body("Hi", 3);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v = post_ok("/v1/chat/completions", &body);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for entry in content {
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"]);
        assert!(entry["bytes"].is_array());
    }

    let v = post_ok(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 3, "logprobs": 3, "logit_bias": no_eos()}),
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(lp["text_offset"][0], 0);
    assert!(lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.as_object().unwrap().len() <= 3));
}

fn expect_error(path: &str, body: &str, status: u16, param: Option<&str>) -> Value {
    let r = client()
        .post(server().url(path))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), status, "{body}");
    let v: Value = r.json().expect("error answers are JSON");
    let err = &v["error"];
    assert!(!err["message"].as_str().unwrap().is_empty(), "{body}: {v}");
    if status == 400 {
        assert_eq!(err["type"], "invalid_request_error", "{body}: {v}");
    }
    if let Some(p) = param {
        assert_eq!(err["param"], p, "{body}: {v}");
    }
    v
}

#[test]
fn bad_input_gets_clear_errors() {
    let chat = "/v1/chat/completions";
    let msgs = r#""messages": [{"role": "user", "content": "hi"}]"#;
    expect_error(chat, r#"{"messages": [}"#, 400, None);
    expect_error(chat, "", 400, None);
    expect_error(chat, "[1, 2]", 400, None);
    expect_error(chat, r#"{"messages": "hi"}"#, 400, Some("messages"));
    expect_error(chat, r#"{"messages": []}"#, 400, Some("messages"));
    expect_error(
        chat,
        r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#,
        400,
        Some("messages"),
    );
    expect_error(
        chat,
        r#"{"messages": [{"content": "no role"}]}"#,
        400,
        Some("messages"),
    );
    for (field, value) in [
        ("max_tokens", r#""ten""#),
        ("max_tokens", "-5"),
        ("max_tokens", "0"),
        ("max_tokens", "2.5"),
        ("max_tokens", "1000000000000"),
        ("max_completion_tokens", "-1"),
        ("temperature", r#""hot""#),
        ("temperature", "-1"),
        ("top_p", "1.5"),
        ("stream", r#""yes""#),
        ("stop", "5"),
        ("n", "0"),
        ("n", "99"),
        ("logit_bias", r#"{"not-a-token": 1}"#),
        ("logit_bias", r#"{"1": 500}"#),
        ("top_logprobs", "2"),
        ("seed", r#""x""#),
    ] {
        let body = format!(r#"{{{msgs}, "{field}": {value}}}"#);
        expect_error(chat, &body, 400, Some(field));
    }
    // Beyond the context: an absurd max_tokens, and a prompt plus max_tokens.
    let v = expect_error(
        chat,
        &format!(r#"{{{msgs}, "max_tokens": 1000000000}}"#),
        400,
        Some("max_tokens"),
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    expect_error(
        chat,
        &format!(r#"{{{msgs}, "max_tokens": 8180}}"#),
        400,
        Some("max_tokens"),
    );
    let long_prompt = "hello ".repeat(9000);
    let v = expect_error(
        "/v1/completions",
        &json!({"prompt": long_prompt, "max_tokens": 1}).to_string(),
        400,
        Some("prompt"),
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");

    let comp = "/v1/completions";
    expect_error(comp, r#"{"max_tokens": 3}"#, 400, Some("prompt"));
    expect_error(comp, r#"{"prompt": ""}"#, 400, Some("prompt"));
    expect_error(comp, r#"{"prompt": []}"#, 400, Some("prompt"));
    expect_error(comp, r#"{"prompt": ["a", 5]}"#, 400, Some("prompt"));
    expect_error(comp, r#"{"prompt": [1, 99999999]}"#, 400, Some("prompt"));
    expect_error(comp, r#"{"prompt": [1, -3]}"#, 400, Some("prompt"));
    expect_error(comp, r#"{"prompt": {"text": "x"}}"#, 400, Some("prompt"));
    expect_error(
        comp,
        r#"{"prompt": "x", "logprobs": 50}"#,
        400,
        Some("logprobs"),
    );

    // Unknown routes and methods answer JSON too.
    let r = client().get(server().url("/v1/nope")).send().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = r.json().unwrap();
    assert_eq!(v["error"]["type"], "not_found_error");
    let r = client().get(server().url(chat)).send().unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert!(r.json::<Value>().unwrap()["error"]["message"].is_string());

    // Over the default 10 MB body limit.
    let huge = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(10_500_000));
    let v = expect_error(comp, &huge, 413, None);
    assert_eq!(v["error"]["code"], "request_too_large");

    // None of that hurt the server.
    let v = post_ok(chat, &chat_body("Still there?", 2));
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[test]
fn structured_output_through_the_server() {
    let ask = |content: &str, extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 16,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let v = post_ok(
        "/v1/chat/completions",
        &ask("Is the sky blue?", json!({"guided_choice": ["yes", "no"]})),
    );
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer == "yes" || answer == "no", "{answer:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let schema = json!({
        "type": "object",
        "properties": {"blue": {"type": "boolean"}},
        "required": ["blue"],
        "additionalProperties": false,
    });
    let mut body = ask(
        "Is the sky blue? Answer in JSON.",
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}}),
    );
    body["stream"] = json!(true);
    let chunks = stream("/v1/chat/completions", &body);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let parsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("constrained output {text:?} is not JSON: {e}"));
    assert!(parsed["blue"].is_boolean(), "{text}");
    assert_eq!(parsed.as_object().unwrap().len(), 1, "{text}");

    // A constraint that does not compile is the client's error, streaming or not.
    for stream in [false, true] {
        let body = ask("x", json!({"guided_regex": "(", "stream": stream}));
        let v = expect_error(
            "/v1/chat/completions",
            &body.to_string(),
            400,
            Some("guided_regex"),
        );
        assert!(v["error"]["message"].as_str().unwrap().contains("regex"));
    }
    expect_error(
        "/v1/chat/completions",
        &ask("x", json!({"response_format": {"type": "nope"}})).to_string(),
        400,
        Some("response_format"),
    );
}

#[test]
fn sixteen_concurrent_clients() {
    // Its own instance, so that the memory check at the end sees only these.
    let s = start(&["--decode-concurrency", "8"]);
    let url = s.url("/v1/chat/completions");
    let stats_url = s.url("/stats");
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                        "required": ["color"], "additionalProperties": false});
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let watching = watching.clone();
        let stats_url = stats_url.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(r) = client().get(&stats_url).send() {
                    let v: Value = r.json().unwrap();
                    most = most.max(v["batch"]["active_rows"].as_u64().unwrap_or(0));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        })
    };
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let url = url.clone();
            let schema = schema.clone();
            std::thread::spawn(move || {
                let mut body = json!({
                    "messages": [{"role": "user", "content": format!("Client {i}: pick a color.")}],
                    "max_tokens": 6,
                    "stream": true,
                });
                match i % 4 {
                    1 => {
                        body["temperature"] = json!(0.8);
                        body["seed"] = json!(i);
                    }
                    2 => {
                        body["max_tokens"] = json!(24);
                        body["response_format"] = json!({"type": "json_schema",
                            "json_schema": {"name": "c", "schema": schema}});
                    }
                    _ => {}
                }
                let mut r = client().post(url).json(&body).send().unwrap();
                assert_eq!(r.status().as_u16(), 200);
                if i % 4 == 3 {
                    // Disconnect after the first chunk.
                    let mut buf = [0u8; 1024];
                    let _ = r.read(&mut buf).unwrap();
                    return (i, None);
                }
                (i, Some(r.text().unwrap()))
            })
        })
        .collect();
    for h in handles {
        let (i, text) = h.join().unwrap();
        let Some(text) = text else { continue };
        let payloads = sse_payloads(&text);
        assert_eq!(payloads.last().unwrap(), "[DONE]", "client {i}: {text}");
        let chunks: Vec<Value> = payloads[..payloads.len() - 1]
            .iter()
            .map(|p| serde_json::from_str(p).unwrap())
            .collect();
        let finish = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .next();
        assert!(
            matches!(finish, Some("stop" | "length")),
            "client {i} has no finish reason: {text}"
        );
        if i % 4 == 2 {
            let content: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            let value: Value = serde_json::from_str(&content)
                .unwrap_or_else(|e| panic!("client {i}: not JSON ({e}): {content}"));
            assert!(
                jsonschema::is_valid(&schema, &value),
                "client {i}: {content}"
            );
        }
    }
    // Every row leaves: nothing waits, nothing decodes, no KV memory held.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v: Value = client().get(&stats_url).send().unwrap().json().unwrap();
        let idle = v["queue"]["depth"] == 0
            && v["queue"]["active"] == 0
            && v["batch"]["active_rows"] == 0
            && v["batch"]["prefilling_rows"] == 0
            && v["batch"]["kv_bytes"] == 0;
        if idle {
            assert!(v["requests"]["generations_completed"].as_u64().unwrap() >= 12);
            break;
        }
        assert!(Instant::now() < deadline, "rows are wedged: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert!(
        most >= 2,
        "requests never decoded together (at most {most} rows)"
    );
}

/// `n` and several prompts run as rows of one batch; choices are indexed
/// prompt-major as OpenAI does, usage sums the completions and counts each
/// prompt once.
#[test]
fn several_prompts_and_n_choices() {
    let v = post_ok(
        "/v1/completions",
        &json!({"prompt": ["The sky is", "Grass is"], "n": 2, "max_tokens": 3,
                "logit_bias": no_eos()}),
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    // Greedy: the choices of one prompt agree, the prompts differ.
    assert_eq!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(choices[2]["text"], choices[3]["text"]);
    assert_ne!(choices[0]["text"], choices[2]["text"]);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let one = post_ok(
        "/v1/completions",
        &json!({"prompt": "The sky is", "max_tokens": 3, "logit_bias": no_eos()}),
    );
    assert_eq!(one["choices"][0]["text"], choices[0]["text"]);
    let two = post_ok(
        "/v1/completions",
        &json!({"prompt": "Grass is", "max_tokens": 3, "logit_bias": no_eos()}),
    );
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        one["usage"]["prompt_tokens"].as_u64().unwrap()
            + two["usage"]["prompt_tokens"].as_u64().unwrap()
    );

    // Streaming with n = 2: chunks of both choices, each closed, then [DONE].
    let mut body = chat_body("Say hi.", 3);
    body["n"] = json!(2);
    body["stream"] = json!(true);
    body["temperature"] = json!(0.9);
    body["seed"] = json!(5);
    let text = client()
        .post(server().url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let payloads = sse_payloads(&text);
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let mut closed = [false; 2];
    for p in &payloads[..payloads.len() - 1] {
        let c: Value = serde_json::from_str(p).unwrap();
        let choice = &c["choices"][0];
        let index = choice["index"].as_u64().unwrap() as usize;
        if choice["finish_reason"].is_string() {
            closed[index] = true;
        }
    }
    assert_eq!(closed, [true, true], "{text}");
}

/// A request whose KV cache could never fit the budget is refused with the
/// numbers; one that fits runs.
#[test]
fn kv_budget_refuses_what_cannot_fit() {
    let s = start(&["--kv-budget", "0.001"]);
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 5}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 500}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("KV budget"),
        "{v}"
    );
    let stats: Value = client()
        .get(s.url("/stats"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(stats["batch"]["kv_budget_bytes"], 1073741);
}

#[test]
fn client_disconnect_stops_generation() {
    let before = stats()["requests"]["generations_cancelled"]
        .as_u64()
        .unwrap();
    {
        let c = client();
        let mut r: Response = c
            .post(server().url("/v1/completions"))
            .json(&json!({
                "prompt": "Write a long story about a dragon.",
                "max_tokens": 400,
                "stream": true,
                "logit_bias": no_eos(),
            }))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        while sse_payloads(&seen).len() < 2 {
            let n = r.read(&mut buf).unwrap();
            assert!(n > 0, "stream ended early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        // Dropping the response and its client closes the connection.
    }
    // The generation must stop long before its 400 tokens (~45 s here).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = stats();
        let cancelled = s["requests"]["generations_cancelled"].as_u64().unwrap();
        if cancelled > before {
            break;
        }
        assert!(Instant::now() < deadline, "no cancelled generation: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let v = post_ok("/v1/chat/completions", &chat_body("Are you ok?", 2));
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[test]
fn prompt_cache_serves_a_growing_conversation() {
    let mut messages = vec![
        json!({"role": "user", "content": "My name is Ada. Tell me a fun fact about octopuses."}),
    ];
    let mut cached = Vec::new();
    let mut prompt_lens = Vec::new();
    for follow_up in ["What is my name?", "Thanks! One more fact please."] {
        let v = post_ok(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 6}),
        );
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
        prompt_lens.push(v["usage"]["prompt_tokens"].as_u64().unwrap());
        messages.push(v["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": follow_up}));
    }
    let v = post_ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 6}),
    );
    cached.push(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    );
    // Each turn reuses at least the whole previous prompt.
    assert!(cached[1] >= prompt_lens[0], "{cached:?} {prompt_lens:?}");
    assert!(cached[2] >= prompt_lens[1], "{cached:?} {prompt_lens:?}");
    assert!(cached[0] < cached[1] && cached[1] < cached[2], "{cached:?}");
    let s = stats();
    assert!(s["prompt_cache"]["hits"].as_u64().unwrap() >= 2);
    assert!(s["prompt_cache"]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn greedy_output_equals_generate() {
    let dir = model_dir();
    let dir = dir.to_str().unwrap();
    for (path, extra, body) in [
        (
            "/v1/chat/completions",
            vec![],
            json!({"messages": [{"role": "user", "content": "Why is the sea salty?"}]}),
        ),
        (
            "/v1/completions",
            vec!["--ignore-chat-template"],
            json!({"prompt": "Why is the sea salty?"}),
        ),
    ] {
        let mut args = vec![
            "generate",
            "--model",
            dir,
            "--prompt",
            "Why is the sea salty?",
            "-n",
            "8",
            "--json",
        ];
        args.extend(extra);
        let out = common::run_ok(&args);
        let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut body = body;
        body["max_tokens"] = json!(8);
        body["temperature"] = json!(0);
        body["return_token_ids"] = json!(true);
        let v = post_ok(path, &body);
        assert_eq!(v["choices"][0]["token_ids"], cli["token_ids"], "{path}");
        assert_eq!(v["usage"]["prompt_tokens"], cli["prompt_tokens"], "{path}");
    }
}

#[test]
fn health_stats_metrics_models() {
    let (status, body) = get("/health");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ok"
    );
    post_ok("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));

    let s = stats();
    assert_eq!(s["ready"], true);
    for key in ["hits", "misses", "bytes", "entries", "max_bytes"] {
        assert!(s["prompt_cache"][key].is_u64(), "{key}: {s}");
    }
    assert_eq!(s["prompt_cache"]["max_bytes"], 2u64 << 30);
    assert!(s["tokens"]["prompt"].as_u64().unwrap() > 0);
    assert!(s["tokens"]["completion"].as_u64().unwrap() > 0);
    assert!(s["latency"]["ttft_s"]["p50"].as_f64().unwrap() > 0.0);
    assert!(
        s["latency"]["ttft_s"]["p95"].as_f64().unwrap()
            >= s["latency"]["ttft_s"]["p50"].as_f64().unwrap()
    );
    assert!(s["latency"]["decode_tok_s"]["p50"].is_number());
    assert!(s["queue"]["depth"].is_u64());
    assert!(
        s["requests"]["by_route"]["/v1/completions"]
            .as_u64()
            .unwrap()
            >= 1
    );

    let (status, text) = get("/metrics");
    assert_eq!(status, 200);
    for name in [
        "mlx_bun_completion_tokens_total",
        "mlx_bun_queue_depth",
        "mlx_bun_prompt_cache_hits_total",
        "mlx_bun_time_to_first_token_seconds{quantile=\"0.95\"}",
        "mlx_bun_http_responses_total{route=\"/v1/completions\",status=\"200\"}",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    assert!(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .all(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().is_ok()));

    let (status, text) = get("/v1/models");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["object"], "model");
    let id = v["data"][0]["id"].as_str().unwrap();
    let (status, _) = get(&format!("/v1/models/{id}"));
    assert_eq!(status, 200);
    let (status, _) = get("/v1/models/not-this-one");
    assert_eq!(status, 404);
}

#[test]
fn curl_streams_a_chat() {
    if !common::require_tool("curl") {
        return;
    }
    let out = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "120", "-H", "Content-Type: application/json", "-d"])
        .arg(
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true})
                .to_string(),
        )
        .arg(server().url("/v1/chat/completions"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let payloads = sse_payloads(&text);
    assert_eq!(payloads.last().unwrap(), "[DONE]", "{text}");
    let first: Value = serde_json::from_str(&payloads[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
}

#[test]
fn official_openai_client() {
    if !common::require_tool("python3") {
        return;
    }
    let script = common::repo_root().join("scripts/test-openai-client.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(&server().base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A second instance: API key, a queue of one, a small body limit, and
/// graceful shutdown at the end.
#[test]
fn api_key_queue_limit_and_graceful_shutdown() {
    // One request at a time (the serial lane) so that a queue forms.
    let mut s = start(&[
        "--decode-concurrency",
        "1",
        "--api-key",
        "sekrit",
        "--max-queue",
        "1",
        "--max-body-bytes",
        "4096",
        "--prompt-cache",
        "0",
    ]);
    let c = client();
    let auth = |rb: reqwest::blocking::RequestBuilder| rb.bearer_auth("sekrit");

    // Authentication.
    let r = c.get(s.url("/v1/models")).send().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    assert_eq!(
        r.json::<Value>().unwrap()["error"]["type"],
        "authentication_error"
    );
    let r = c
        .get(s.url("/v1/models"))
        .bearer_auth("wrong")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "x"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        auth(c.get(s.url("/v1/models")))
            .send()
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        c.get(s.url("/health")).send().unwrap().status().as_u16(),
        200
    );

    // Body limit.
    let r = auth(c.post(s.url("/v1/completions")))
        .header("content-type", "application/json")
        .body(format!(r#"{{"prompt": "{}"}}"#, "a".repeat(8000)))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    assert_eq!(
        r.json::<Value>().unwrap()["error"]["code"],
        "request_too_large"
    );

    // A full queue: one running, one waiting, the third is refused.
    let stats_of =
        |s: &Server| -> Value { auth(c.get(s.url("/stats"))).send().unwrap().json().unwrap() };
    let mut running = auth(c.post(s.url("/v1/completions")))
        .json(&json!({
            "prompt": "Tell me a story.",
            "max_tokens": 200,
            "stream": true,
            "logit_bias": no_eos(),
        }))
        .send()
        .unwrap();
    let mut buf = [0u8; 4096];
    let mut seen = String::new();
    while sse_payloads(&seen).is_empty() {
        let n = running.read(&mut buf).unwrap();
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let waiting_url = s.url("/v1/completions");
    let waiting = std::thread::spawn(move || {
        client()
            .post(waiting_url)
            .bearer_auth("sekrit")
            .json(&json!({"prompt": "Queued", "max_tokens": 2, "logit_bias": no_eos()}))
            .send()
            .unwrap()
            .status()
            .as_u16()
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats_of(&s)["queue"]["depth"] != 1 {
        assert!(Instant::now() < deadline, "the second request never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = auth(c.post(s.url("/v1/completions")))
        .json(&json!({"prompt": "Refused", "max_tokens": 2}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(r.json::<Value>().unwrap()["error"]["code"], "queue_full");
    drop(running);
    assert_eq!(waiting.join().unwrap(), 200);

    // A client that gives up during a long prefill frees the worker soon:
    // this prompt alone would take a minute or more to prefill here.
    let cancelled = |s: &Server| {
        stats_of(s)["requests"]["generations_cancelled"]
            .as_u64()
            .unwrap()
    };
    let before = cancelled(&s);
    let long_prompt = (0..400)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let gave_up = Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .post(s.url("/v1/completions"))
        .bearer_auth("sekrit")
        .json(&json!({"prompt": long_prompt, "max_tokens": 2}))
        .send();
    assert!(gave_up.is_err(), "the long prompt answered within 2 s");
    let deadline = Instant::now() + Duration::from_secs(40);
    while cancelled(&s) == before || stats_of(&s)["queue"]["active"] != 0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned prefill kept running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Graceful shutdown: a stream in flight finishes, then the process exits 0.
    let mut inflight = auth(c.post(s.url("/v1/completions")))
        .json(&json!({
            "prompt": "Count to ten:",
            "max_tokens": 12,
            "stream": true,
            "logit_bias": no_eos(),
        }))
        .send()
        .unwrap();
    let mut seen = String::new();
    while sse_payloads(&seen).is_empty() {
        let n = inflight.read(&mut buf).unwrap();
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    s.request_stop();
    let mut rest = String::new();
    inflight.read_to_string(&mut rest).unwrap();
    seen.push_str(&rest);
    let payloads = sse_payloads(&seen);
    assert_eq!(payloads.last().unwrap(), "[DONE]", "{seen}");
    let closing: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(closing["choices"][0]["finish_reason"], "length");
    let status = s.stop(Duration::from_secs(60));
    assert!(status.success(), "exit status {status}");
    assert!(c.get(s.url("/health")).send().is_err());
}

/// A third instance with a draft model: requests take the speculative lane,
/// give the same greedy tokens, and the draft's work shows in /stats.
#[test]
fn speculative_lane_with_a_draft_model() {
    let model = model_dir();
    let s = start(&[
        "--draft-model",
        model.to_str().unwrap(),
        "--num-draft-tokens",
        "3",
    ]);
    let prompt = "Why is the sky blue?";
    let out = common::run_ok(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        prompt,
        "-n",
        "6",
        "--json",
    ]);
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    let v: Value = client()
        .post(s.url("/v1/chat/completions"))
        .json(&json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6,
            "return_token_ids": true,
        }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["choices"][0]["token_ids"], cli["token_ids"], "{v}");
    let spec = &v["usage"]["speculation"];
    assert!(spec["target_calls"].as_u64().unwrap() >= 1, "{v}");
    assert!(
        spec["drafted"].as_u64().unwrap() >= spec["accepted"].as_u64().unwrap(),
        "{v}"
    );
    // Log-probabilities are the serial lane's: such a request still gets them.
    let v: Value = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": 2, "logprobs": 1, "logit_bias": no_eos()}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "{v}"
    );
    let stats: Value = client()
        .get(s.url("/stats"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(
        stats["speculative"]["drafted_tokens"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert!(
        stats["speculative"]["accepted_tokens"].as_u64().unwrap() > 0,
        "{stats}"
    );
}

/// Browsers on loopback pages may call the API (CORS, preflight before
/// authentication); other origins get no CORS headers. The paths without
/// `/v1` work too.
#[test]
fn cors_and_path_aliases() {
    let c = client();
    let preflight = |origin: &str| {
        c.request(
            reqwest::Method::OPTIONS,
            server().url("/v1/chat/completions"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .send()
        .unwrap()
    };
    let ok = preflight("http://localhost:5173");
    assert_eq!(ok.status().as_u16(), 204);
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    assert!(ok.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    let evil = preflight("http://evil.example");
    assert!(!evil.headers().contains_key("access-control-allow-origin"));

    let r = c
        .post(server().url("/chat/completions"))
        .header("origin", "http://127.0.0.1:8000")
        .json(&chat_body("Hi", 2))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://127.0.0.1:8000"
    );
    let v: Value = r.json().unwrap();
    assert_eq!(v["object"], "chat.completion");
    let (status, _) = get("/models");
    assert_eq!(status, 200);
}
