//! Models per request, end to end: a real `mlx-bun serve` with the default
//! model and an `--allowed-models` folder holding the float32 copy, under a
//! model-memory budget too small for both.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::server::Server;
use reqwest::blocking::Client;
use serde_json::{json, Value};

const F32_ID: &str = "smol-f32";

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

fn chat(s: &Server, model: &str, max_tokens: usize) -> (u16, Value) {
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Hi"}],
        }))
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap())
}

fn get(s: &Server, path: &str) -> Value {
    client().get(s.url(path)).send().unwrap().json().unwrap()
}

fn loaded(s: &Server) -> Vec<String> {
    serde_json::from_value(get(s, "/stats")["loaded_models"].clone()).unwrap()
}

/// Polls until the loaded models are `want` (the budget sweep runs each second).
fn wait_loaded(s: &Server, want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = loaded(s);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "loaded models stayed {now:?}, expected {want:?}: {}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn models_load_on_demand_and_evict_lru_but_never_in_flight() {
    let f32_dir = common::float32_model();
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&f32_dir, root.path().join(F32_ID)).unwrap();
    // A folder without config.json is not a model and is not listed.
    std::fs::create_dir(root.path().join("notes")).unwrap();
    // `--model PATH` is served under that path, as mlx-lm does.
    let default_dir = common::model_dir();
    let default_id = default_dir.to_str().unwrap().to_string();
    let s = Server::start(
        &default_dir,
        &[
            "--allowed-models",
            root.path().to_str().unwrap(),
            "--model-memory",
            "0.05",
        ],
    );

    // /v1/models: the default (loaded) and the allowed folder's model.
    let models = get(&s, "/v1/models");
    let listed: Vec<(String, bool)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["loaded"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![(default_id.clone(), true), (F32_ID.to_string(), false)]
    );
    let one = get(&s, &format!("/v1/models/{F32_ID}"));
    assert_eq!(one["id"], F32_ID);

    // A model outside the allowed set is a 404 that names it.
    for name in ["nope", "../models", "/etc", "notes"] {
        let (status, body) = chat(&s, name, 1);
        assert_eq!(status, 404, "{name}: {body}");
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["code"], "model_not_found");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("{name:?}")),
            "{body}"
        );
    }

    // A long stream on the default model stays in flight while the other
    // model loads; the tiny budget must not evict the busy default.
    let stream_url = s.url("/v1/chat/completions");
    let (piece_tx, pieces) = std::sync::mpsc::channel::<String>();
    let model = default_id.clone();
    let streaming = std::thread::spawn(move || {
        let r = client()
            .post(stream_url)
            .json(&json!({
                "model": model,
                "max_tokens": 1000,
                // No end-of-turn token: the stream outlasts the other model's
                // load however fast decoding is.
                "logit_bias": {"0": -100, "2": -100},
                "stream": true,
                "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
            }))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        for line in BufReader::new(r).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap();
            assert!(chunk.get("error").is_none(), "{chunk}");
            assert_eq!(chunk["model"], model.as_str());
            if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
                // The test stops listening (and so cancels) when it has seen enough.
                if piece_tx.send(c.to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let piece = |what: &str| {
        pieces
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("the stream stopped {what}: {}", s.log_text()))
    };
    piece("before its first token");

    // Two concurrent requests for the unloaded model share one load.
    let both: Vec<_> = (0..2)
        .map(|_| {
            let base = s.base.clone();
            std::thread::spawn(move || {
                let r = client()
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&json!({"model": F32_ID, "max_tokens": 2,
                        "messages": [{"role": "user", "content": "Hi"}]}))
                    .send()
                    .unwrap();
                (r.status().as_u16(), r.json::<Value>().unwrap())
            })
        })
        .collect();
    for handle in both {
        let (status, body) = handle.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["model"], F32_ID);
        assert_eq!(body["usage"]["completion_tokens"], 2);
    }
    let loads = s.log_text().matches("loading model smol-f32").count();
    assert_eq!(loads, 1, "{}", s.log_text());
    // Both are loaded while the stream runs: over budget, but the default is busy.
    let mut now = loaded(&s);
    now.sort();
    assert_eq!(now, vec![default_id.as_str(), F32_ID]);
    // And the stream goes on after the other model loaded and answered.
    let seen = pieces.try_iter().count();
    for _ in 0..3 {
        piece("while the other model loaded");
    }
    assert!(seen + 3 < 1000);
    drop(pieces);
    streaming.join().unwrap();
    // Once idle, the least recently used model goes.
    wait_loaded(&s, &[F32_ID]);
    assert!(s
        .log_text()
        .contains(&format!("unloading model {default_id}")));

    // The default loads again on demand and the other one goes.
    let (status, body) = chat(&s, &default_id, 2);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], default_id.as_str());
    wait_loaded(&s, &[default_id.as_str()]);
    // A request without `model` gets the default.
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().unwrap()["model"], default_id.as_str());
}

#[test]
fn a_bad_draft_model_or_adapter_is_refused_by_field() {
    let s = Server::start(&common::model_dir(), &["--model-memory", "1"]);
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"max_tokens": 1, "draft_model": "/etc",
            "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.json::<Value>().unwrap()["error"]["param"], "draft_model");
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"max_tokens": 1, "adapters": "/tmp",
            "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(r.json::<Value>().unwrap()["error"]["param"], "adapters");
}

/// An adapter folder with random LoRA weights on the last 2 layers: the
/// config from a zero-step `mlx-bun train`, the weights drawn here.
fn random_adapter(model_dir: &std::path::Path, out: &std::path::Path) {
    use mlx_bun::lora::{AdapterLayout, LoraParameters};
    use mlx_rs::random;
    common::run_ok(&[
        "train",
        "--model",
        model_dir.to_str().unwrap(),
        "--data",
        common::repo_root()
            .join("tests/data/sft-parity")
            .to_str()
            .unwrap(),
        "--iters",
        "0",
        "--num-layers",
        "2",
        "--batch-size",
        "2",
        "--adapter-path",
        out.to_str().unwrap(),
        "--no-db",
    ]);
    let model = mlx_bun::model::Model::load(model_dir).unwrap();
    let layout = AdapterLayout::new(&model, 2, &LoraParameters::default()).unwrap();
    let mut key = random::key(5).unwrap();
    let params: Vec<mlx_rs::Array> = layout
        .shapes(&model)
        .iter()
        .map(|s| {
            let (next, sub) = random::split(&key, 2).unwrap();
            key = next;
            random::uniform::<_, f32>(-0.2f32, 0.2f32, &s[..], &sub).unwrap()
        })
        .collect();
    mlx_bun::adapters::save_params(&layout, &params, &out.join("adapters.safetensors")).unwrap();
}

#[test]
fn adapters_per_request_are_their_own_pool_entry() {
    let dir = common::model_dir();
    let root = tempfile::tempdir().unwrap();
    let adapter = root.path().join("my-adapter");
    random_adapter(&dir, &adapter);
    std::os::unix::fs::symlink(common::float32_model(), root.path().join(F32_ID)).unwrap();
    let s = Server::start(&dir, &["--allowed-models", root.path().to_str().unwrap()]);
    let ask = |extra: Value| {
        let mut body = json!({"max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": "Name a color."}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = client()
            .post(s.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().unwrap();
        assert_eq!(status, 200, "{v}");
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let base = ask(json!({}));
    let adapted = ask(json!({"adapters": adapter.to_str().unwrap()}));
    assert_ne!(base, adapted, "the adapter did not change the answer");
    // The same model with and without the adapter: two entries.
    let id = dir.to_str().unwrap();
    assert_eq!(loaded(&s), vec![id, id]);
    assert_eq!(ask(json!({})), base);
    // A draft model per request: speculative decoding with the float32 copy
    // as the draft gives the same greedy answer.
    assert_eq!(ask(json!({"draft_model": F32_ID})), base);
    let stats = get(&s, "/stats");
    assert!(
        stats["speculative"]["drafted_tokens"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert_eq!(loaded(&s).len(), 3);
    // An adapter outside the allowed folders is refused by field.
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("a");
    std::fs::create_dir(&copy).unwrap();
    for f in ["adapter_config.json", "adapters.safetensors"] {
        std::fs::copy(adapter.join(f), copy.join(f)).unwrap();
    }
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"max_tokens": 1, "adapters": copy.to_str().unwrap(),
            "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert_eq!(v["error"]["param"], "adapters");
    assert!(v["error"]["message"].as_str().unwrap().contains("outside"));
}
