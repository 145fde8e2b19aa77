//! OpenAI's Responses API (`/v1/responses`) and Anthropic's token counting
//! (`/v1/messages/count_tokens`) against `mlx-bun serve` on the default
//! model: the pinned official clients (set up by `scripts/clients-setup.sh`)
//! drive a tool conversation, streamed and not, continued with the whole
//! input and with `previous_response_id`, and compare counted tokens with
//! the Messages API's usage; raw HTTP checks the stored responses, reasoning
//! items, structured output and the error bodies. Calls are forced with a
//! named `tool_choice`: a 135M model cannot choose tools, the protocol is
//! what is tested.

mod common;

use common::server::Server;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

/// Runs `scripts/clients/SCRIPT ARGS…`; returns its JSON report.
fn client_script(python: &Path, script: &str, args: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(common::repo_root().join("scripts/clients").join(script))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

fn server(extra: &[&str]) -> Server {
    Server::start(
        &common::model_dir(),
        &[&["--max-tokens-default", "64"], extra].concat(),
    )
}

#[test]
fn tool_conversation_with_the_openai_client() {
    let Some(python) = common::clients_python() else {
        return;
    };
    let server = server(&[]);
    let plain = client_script(
        &python,
        "responses_conversation.py",
        &[&server.base, "plain"],
    );
    let streamed = client_script(
        &python,
        "responses_conversation.py",
        &[&server.base, "stream"],
    );
    for r in [&plain, &streamed] {
        // The default model reads the city from the question.
        assert_eq!(r.pointer("/arguments/city"), Some(&json!("Paris")), "{r}");
    }
    // The same greedy answer whichever way it was asked.
    assert_eq!(plain["answer"], streamed["answer"]);
    assert_eq!(plain["arguments"], streamed["arguments"]);
}

#[test]
fn count_tokens_equals_the_messages_usage() {
    let Some(python) = common::clients_python() else {
        return;
    };
    let server = server(&[]);
    let pairs = client_script(&python, "count_tokens.py", &[&server.base]);
    let pairs = pairs.as_array().unwrap();
    assert_eq!(pairs.len(), 3);
    for pair in pairs {
        assert!(pair[0].as_u64().unwrap() > 0, "{pair}");
        assert_eq!(pair[0], pair[1], "counted vs reported: {pairs:?}");
    }
    // Tools and a system prompt are part of the count.
    assert!(pairs[1][0].as_u64() > pairs[0][0].as_u64());

    let bad = reqwest::blocking::Client::new()
        .post(server.url("/v1/messages/count_tokens"))
        .json(&json!({"model": "m", "messages": "hi"}))
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages"),
        "{body}"
    );
}

fn post(client: &reqwest::blocking::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client.post(url).json(body).send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap())
}

/// The `data:` objects of an SSE body, with their event names.
fn events(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            out.push((name.clone(), serde_json::from_str(data).unwrap()));
        }
    }
    out
}

#[test]
fn stored_responses_reasoning_formats_and_errors() {
    let server = server(&["--reasoning-parser", "think"]);
    let client = reqwest::blocking::Client::new();
    let url = server.url("/v1/responses");

    // Reasoning comes back as its own item, then the message.
    let think = json!({
        "input": "Weather?", "max_output_tokens": 40, "store": false,
        "guided_grammar": "start: \"<think>\\nI check.\\n</think>\\n\\nSunny.\"",
    });
    let (status, r) = post(&client, &url, &think);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"][0]["type"], "reasoning", "{r}");
    assert_eq!(r["output"][0]["content"][0]["text"], "I check.", "{r}");
    assert_eq!(r["output"][1]["content"][0]["text"], "Sunny.", "{r}");
    assert!(r["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64() > Some(0));
    // Not stored: it cannot be fetched or continued.
    let id = r["id"].as_str().unwrap();
    let get = client.get(server.url(&format!("/v1/responses/{id}")));
    assert_eq!(get.send().unwrap().status(), 404);

    // Streamed: the reasoning events, then the text, numbered in order.
    let mut streamed = think.clone();
    streamed["stream"] = json!(true);
    let text = client.post(&url).json(&streamed).send().unwrap();
    let evs = events(&text.text().unwrap());
    for (i, (name, data)) in evs.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i);
    }
    let delta = |kind: &str| -> String {
        evs.iter()
            .filter(|(n, _)| n == kind)
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect()
    };
    assert_eq!(delta("response.reasoning_text.delta").trim(), "I check.");
    assert_eq!(delta("response.output_text.delta"), "Sunny.");
    let (last, done) = evs.last().unwrap();
    assert_eq!(last, "response.completed");
    assert_eq!(
        done["response"]["output"][1]["content"][0]["text"],
        "Sunny."
    );

    // text.format json_schema constrains the answer; the paths without /v1 work.
    let schema = json!({"type": "object", "properties": {"sky": {"type": "string", "enum": ["sunny", "rainy"]}},
        "required": ["sky"], "additionalProperties": false});
    let (status, r) = post(
        &client,
        &server.url("/responses"),
        &json!({"input": "Weather in Paris as JSON.", "max_output_tokens": 30,
            "text": {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": true}}}),
    );
    assert_eq!(status, 200, "{r}");
    let answer: Value =
        serde_json::from_str(r["output"][0]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert!(["sunny", "rainy"].contains(&answer["sky"].as_str().unwrap()));
    assert_eq!(r["text"]["format"]["name"], "weather");

    // A stored response: fetched, continued, deleted.
    let (_, first) = post(
        &client,
        &url,
        &json!({"input": "Hi", "max_output_tokens": 3, "metadata": {"k": "v"}}),
    );
    assert_eq!(first["status"], "incomplete", "{first}");
    assert_eq!(
        first["incomplete_details"]["reason"], "max_output_tokens",
        "{first}"
    );
    assert_eq!(first["metadata"], json!({"k": "v"}));
    let id = first["id"].as_str().unwrap();
    let at = server.url(&format!("/v1/responses/{id}"));
    let fetched: Value = client.get(&at).send().unwrap().json().unwrap();
    assert_eq!(fetched, first);
    let (status, next) = post(
        &client,
        &url,
        &json!({"previous_response_id": id, "input": "Again", "max_output_tokens": 3}),
    );
    assert_eq!(status, 200, "{next}");
    assert!(next["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64());
    let deleted: Value = client.delete(&at).send().unwrap().json().unwrap();
    assert_eq!(deleted["deleted"], true);
    assert_eq!(client.get(&at).send().unwrap().status(), 404);

    // Errors in OpenAI's shape, naming the field.
    let (status, e) = post(
        &client,
        &url,
        &json!({"previous_response_id": id, "input": "x"}),
    );
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["param"], "previous_response_id");
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    for (body, param) in [
        (json!({"model": "m"}), "input"),
        (json!({"input": 5}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
            "text.format",
        ),
        (json!({"input": "x", "temperature": 9}), "temperature"),
    ] {
        let (status, e) = post(&client, &url, &body);
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
    }
}
