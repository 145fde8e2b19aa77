//! Agents against `mlx-bun serve`: the official `openai` and `anthropic`
//! Python clients (pinned, set up by `scripts/clients-setup.sh`) drive a
//! multi-turn tool-calling conversation, streamed and not, on the default
//! model (whose template knows no tools) and on a tiny random-weight Qwen3
//! model served with a Qwen3 chat template (`<tool_call>`, `<think>`). The
//! calls are forced with a named `tool_choice`, so the grammar makes them
//! valid even from random weights. Also: the reasoning split end to end,
//! and that every format's forcing grammar compiles on a real vocabulary.

mod common;

use common::server::Server;

use std::path::{Path, PathBuf};
use std::process::Command;

use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::tool_calls::{call_grammar, Function, ReasoningPrefix, ToolChoice, ToolFormat};
use mlx_rs::Array;
use serde_json::{json, Value};

/// A server of `model` with `extra` flags and short default answers.
fn start_server(model: &Path, extra: &[&str]) -> Server {
    Server::start(model, &[&["--max-tokens-default", "64"], extra].concat())
}

/// Runs the driver for each client, streamed and not; returns their reports.
fn conversations(python: &Path, base: &str, extra: &[&str]) -> Vec<Value> {
    let script = common::repo_root().join("scripts/clients/tool_conversation.py");
    let mut reports = Vec::new();
    for client in ["openai", "anthropic"] {
        for mode in ["plain", "stream"] {
            let out = Command::new(python)
                .arg(&script)
                .args([base, client, mode])
                .args(extra)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{client} {mode}: {}\n{stdout}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: Value = serde_json::from_str(stdout.trim()).unwrap();
            reports.push(report);
        }
    }
    reports
}

#[test]
fn default_model_tool_conversation_with_both_clients() {
    let Some(python) = common::clients_python() else {
        return;
    };
    let server = start_server(&common::model_dir(), &[]);
    let reports = conversations(&python, &server.base, &[]);
    for r in &reports {
        // The default model reads the city from the question.
        let city = r
            .pointer("/arguments/city")
            .or_else(|| r.pointer("/tool_use/input/city"));
        assert_eq!(city, Some(&json!("Paris")), "{r}");
    }
    // The answer is the same greedy text whichever client or mode asked.
    assert_eq!(reports[0]["answer"], reports[1]["answer"]);
    assert_eq!(reports[2]["answer"], reports[3]["answer"]);
}

/// A Qwen3 model with random weights, SmolLM2's tokenizer (no Qwen
/// tokenizer can be fetched here) and a Qwen3 chat template given with
/// `--chat-template`.
fn tiny_qwen3() -> PathBuf {
    let dir = mlx_bun::hub::cache_dir().join("test-models/qwen3-tiny-smoltok");
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let golden = common::repo_root().join("goldens/arch/qwen3");
    let smol = common::model_dir();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(golden.join("config.json")).unwrap())
            .unwrap();
    config["vocab_size"] = json!(49152);
    config["max_position_embeddings"] = json!(2048);
    config["eos_token_id"] = json!(2);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut weights = Array::load_safetensors(golden.join("model.safetensors")).unwrap();
    let key = mlx_rs::random::key(7).unwrap();
    let embed = mlx_rs::random::normal::<f32>(&[49152, 64], None, Some(0.02), Some(&key)).unwrap();
    weights.insert("model.embed_tokens.weight".into(), embed);
    Array::save_safetensors(weights.iter(), None, dir.join("model.safetensors")).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::copy(smol.join(f), dir.join(f)).unwrap();
    }
    dir
}

fn qwen_template() -> String {
    common::repo_root()
        .join("tests/data/qwen3_chat_template.jinja")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn qwen_template_model_tool_conversation_and_reasoning() {
    let Some(python) = common::clients_python() else {
        return;
    };
    let template = qwen_template();
    let server = start_server(&tiny_qwen3(), &["--chat-template", &template]);
    let reports = conversations(&python, &server.base, &["--no-thinking"]);
    assert_eq!(reports.len(), 4);

    // Thinking on: the reasoning comes back apart from the answer.
    let client = reqwest::blocking::Client::new();
    let body = json!({
        "messages": [{"role": "user", "content": "Weather?"}],
        "max_tokens": 40,
        "guided_grammar": "start: \"<think>\\nI check.\\n</think>\\n\\nSunny.\"",
    });
    let r: Value = client
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let msg = &r["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], "I check.", "{r}");
    assert_eq!(msg["reasoning"], "I check.", "{r}");
    assert_eq!(msg["content"], "Sunny.", "{r}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = client
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&streamed)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let (mut reasoning, mut content) = (String::new(), String::new());
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(chunk) = serde_json::from_str::<Value>(line) {
            let delta = &chunk["choices"][0]["delta"];
            reasoning += delta["reasoning_content"].as_str().unwrap_or("");
            content += delta["content"].as_str().unwrap_or("");
        }
    }
    assert_eq!(reasoning.trim(), "I check.", "{text}");
    assert_eq!(content, "Sunny.", "{text}");

    // Anthropic's shape: a thinking block, then the text.
    let body = json!({
        "model": "m", "max_tokens": 40,
        "messages": [{"role": "user", "content": "Weather?"}],
        "guided_grammar": "start: \"<think>\\nI check.\\n</think>\\n\\nSunny.\"",
    });
    let r = client
        .post(format!("{}/v1/messages", server.base))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r: Value = r.json().unwrap();
    assert_eq!(r["content"][0]["type"], "thinking", "{r}");
    assert_eq!(
        r["content"][1],
        json!({"type": "text", "text": "Sunny."}),
        "{r}"
    );

    // Bad tool fields name themselves.
    let bad = client
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        }))
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().unwrap();
    assert_eq!(err["error"]["param"], "tool_choice", "{err}");
}

#[test]
fn forcing_grammars_compile_on_a_real_vocabulary() {
    let tokenizer = mlx_bun::tokenizer::Tokenizer::load(&common::model_dir()).unwrap();
    let engine = GrammarEngine::new(&tokenizer).unwrap();
    let functions = vec![
        Function {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
        Function {
            name: "get_time".into(),
            parameters: json!({}),
        },
    ];
    let think = ReasoningPrefix {
        start: "<think>".into(),
        end: "</think>".into(),
        open: false,
    };
    let lookup = |t: &str| tokenizer.token_to_id(t);
    for format in [
        ToolFormat::JsonTools,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Phi,
        ToolFormat::Harmony,
    ] {
        for choice in [
            ToolChoice::Required,
            ToolChoice::Function("get_time".into()),
        ] {
            for reasoning in [None, Some(&think)] {
                for parallel in [true, false] {
                    let g = call_grammar(format, &functions, &choice, parallel, reasoning, &lookup)
                        .unwrap();
                    engine
                        .constraint(&ConstraintSpec::Lark(g.clone()))
                        .unwrap_or_else(|e| panic!("{format:?}: {e:#}\n{g}"));
                }
            }
        }
    }
    let err = call_grammar(
        ToolFormat::FunctionGemma,
        &functions,
        &ToolChoice::Required,
        true,
        None,
        &lookup,
    )
    .unwrap_err();
    assert!(err.to_string().contains("function_gemma"));
}

#[test]
fn parser_flag_and_anthropic_key_header() {
    let server = start_server(
        &common::model_dir(),
        &["--tool-call-parser", "mistral", "--api-key", "k1"],
    );
    let client = reqwest::blocking::Client::new();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}]);
    let r: Value = client
        .post(format!("{}/v1/chat/completions", server.base))
        .bearer_auth("k1")
        .json(&json!({
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
            "max_tokens": 40, "return_token_ids": true,
        }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{r}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{r}");
    // The forced text was Mistral's.
    let tokenizer = mlx_bun::tokenizer::Tokenizer::load(&common::model_dir()).unwrap();
    let ids: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
    let text = tokenizer.decode(&ids).unwrap();
    assert!(
        text.starts_with("[TOOL_CALLS][{\"name\": \"get_weather\""),
        "{text}"
    );

    // Anthropic's key header.
    let body =
        json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]});
    let ok = client
        .post(format!("{}/v1/messages", server.base))
        .header("x-api-key", "k1")
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(ok.status(), 200);
    let m: Value = ok.json().unwrap();
    assert_eq!(m["type"], "message");
    assert_eq!(m["stop_reason"], "max_tokens", "{m}");
    let denied = client
        .post(format!("{}/v1/messages", server.base))
        .header("x-api-key", "nope")
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(denied.status(), 401);
}

#[test]
fn bad_agent_flags_are_clear_errors() {
    let model = common::model_dir();
    let model = model.to_str().unwrap();
    for (flags, expected) in [
        (
            vec!["--tool-call-parser", "nope"],
            "unknown tool-call parser",
        ),
        (
            vec!["--reasoning-parser", "nope"],
            "unknown reasoning parser",
        ),
        (vec!["--chat-template-args", "[1]"], "must be a JSON object"),
        (
            vec!["--chat-template", "/nonexistent.jinja"],
            "--chat-template",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mlx-bun"))
            .args(["serve", "--port", "0", "--model", model])
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} should fail");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

#[test]
fn anthropic_stream_sends_tool_input_in_pieces() {
    let server = start_server(&common::model_dir(), &[]);
    let client = reqwest::blocking::Client::new();
    let mut body = json!({
        "model": "m", "max_tokens": 60,
        "messages": [{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
        "tools": [{"name": "get_weather", "description": "The weather in a city",
            "input_schema": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"]}}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    });
    let whole: Value = client
        .post(format!("{}/v1/messages", server.base))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(whole["stop_reason"], "tool_use", "{whole}");
    let call = whole["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{whole}"));

    body["stream"] = json!(true);
    let text = client
        .post(format!("{}/v1/messages", server.base))
        .json(&body)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let start = events
        .iter()
        .find(|e| e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{text}"));
    let index = &start["index"];
    assert_eq!(start["content_block"]["name"], "get_weather", "{text}");
    assert_eq!(start["content_block"]["input"], json!({}), "{text}");
    let pieces: Vec<&str> = events
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .map(|e| {
            assert_eq!(&e["index"], index, "{text}");
            e["delta"]["partial_json"].as_str().unwrap()
        })
        .collect();
    assert!(pieces.len() > 1, "{text}");
    let input: Value = serde_json::from_str(&pieces.concat()).unwrap();
    assert_eq!(input, call["input"], "{text}");
    // Every block that starts stops, in order, before the message ends.
    let opened: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| &e["index"])
        .collect();
    let closed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_stop")
        .map(|e| &e["index"])
        .collect();
    assert_eq!(opened, closed, "{text}");
    let stop = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(stop["delta"]["stop_reason"], "tool_use", "{text}");
}
