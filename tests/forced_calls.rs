//! Forced tool calls end: with `tool_choice` naming a function or
//! `"required"`, the answer is one call whose arguments hold exactly the
//! schema's fields and that finishes with `tool_calls`, not at `max_tokens`,
//! for every seed. (`"required"` with parallel calls allowed may make
//! several; each must be whole.)

mod common;

use common::server::Server;
use reqwest::blocking::Client;
use serde_json::{json, Value};

const MAX_TOKENS: u64 = 400;

fn flight_tool() -> Value {
    flight_tool_with(None)
}

/// The flight tool; `max_length` bounds its string fields.
fn flight_tool_with(max_length: Option<u64>) -> Value {
    let mut tool = json!({"type": "function", "function": {
        "name": "book_flight",
        "description": "Book a flight for a passenger.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "IATA code of the departure airport"},
                "destination": {"type": "string", "description": "IATA code of the arrival airport"},
                "date": {"type": "string", "description": "Departure date, YYYY-MM-DD"},
                "passengers": {"type": "integer"},
                "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
                "traveller": {"type": "object", "properties": {
                    "first_name": {"type": "string"}, "last_name": {"type": "string"}
                }, "required": ["first_name", "last_name"]}
            },
            "required": ["origin", "destination", "date", "passengers", "cabin", "traveller"]
        }
    }});
    if let Some(n) = max_length {
        let params = &mut tool["function"]["parameters"]["properties"];
        for key in ["origin", "destination", "date"] {
            params[key]["maxLength"] = json!(n);
        }
        for key in ["first_name", "last_name"] {
            params["traveller"]["properties"][key]["maxLength"] = json!(n);
        }
    }
    tool
}

fn ask(client: &Client, server: &Server, choice: &Value, seed: u64) -> Value {
    ask_with(client, server, choice, seed, 0.8, flight_tool())
}

fn ask_with(
    client: &Client,
    server: &Server,
    choice: &Value,
    seed: u64,
    temperature: f64,
    tool: Value,
) -> Value {
    let body = json!({
        "messages": [{"role": "user", "content":
            "Book me, Ada Lovelace, one economy seat from London Heathrow to Paris on 2027-03-14."}],
        "tools": [tool],
        "tool_choice": choice,
        "temperature": temperature,
        "seed": seed,
        "max_tokens": MAX_TOKENS,
    });
    let response = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .expect("request");
    assert_eq!(response.status(), 200, "{}", server.log_text());
    response.json().expect("JSON body")
}

#[test]
fn forced_calls_finish_within_their_schema_on_every_seed() {
    let server = Server::start(&common::model_dir(), &[]);
    let client = Client::new();
    let named = json!({"type": "function", "function": {"name": "book_flight"}});
    let required = json!("required");
    let mut failures = Vec::new();
    for seed in 0..10 {
        let choice = if seed % 2 == 0 { &named } else { &required };
        let answer = ask(&client, &server, choice, seed);
        let choice0 = &answer["choices"][0];
        let finish = choice0["finish_reason"].as_str().unwrap_or_default();
        let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap();
        let calls = choice0["message"]["tool_calls"].as_array();
        let verdict = (|| {
            if finish != "tool_calls" {
                return Err(format!("finish {finish:?} after {tokens} tokens"));
            }
            let calls = calls.ok_or("no tool_calls")?;
            if calls.is_empty() || (choice == &named && calls.len() != 1) {
                return Err(format!("{} calls", calls.len()));
            }
            calls.iter().try_for_each(check_call)?;
            Ok(tokens)
        })();
        eprintln!("seed {seed}: {verdict:?}");
        if let Err(why) = verdict {
            failures.push(format!("seed {seed}: {why}: {}", choice0["message"]));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One call to `book_flight` whose arguments hold exactly the schema's fields.
fn check_call(call: &Value) -> Result<(), String> {
    let function = &call["function"];
    if function["name"] != "book_flight" {
        return Err(format!("called {}", function["name"]));
    }
    let args: Value = serde_json::from_str(function["arguments"].as_str().unwrap())
        .map_err(|e| format!("arguments are not JSON: {e}"))?;
    let mut keys: Vec<&String> = args.as_object().ok_or("not an object")?.keys().collect();
    keys.sort();
    let want = [
        "cabin",
        "date",
        "destination",
        "origin",
        "passengers",
        "traveller",
    ];
    if keys != want {
        return Err(format!("argument keys {keys:?}"));
    }
    let mut inner: Vec<&String> = args["traveller"].as_object().unwrap().keys().collect();
    inner.sort();
    if inner != ["first_name", "last_name"] {
        return Err(format!("traveller keys {inner:?}"));
    }
    Ok(())
}

/// The formats whose arguments are not one JSON object force calls too:
/// Qwen3-Coder's parameter blocks (strings as free text, other values as
/// JSON of their schema) and Kimi K2's call section. The parser reads back
/// exactly the schema's fields, with their types. (Free text ends at the
/// schema's `maxLength`: without one, a model that does not know the format,
/// as this one, may write text until `max_tokens`.)
#[test]
fn forced_calls_in_qwen3_coder_and_kimi_k2_formats_parse_back() {
    for parser in ["qwen3_coder", "kimi_k2"] {
        let server = Server::start(&common::model_dir(), &["--tool-call-parser", parser]);
        let client = Client::new();
        let named = json!({"type": "function", "function": {"name": "book_flight"}});
        for seed in 0..3 {
            let answer = ask_with(
                &client,
                &server,
                &named,
                seed,
                if seed == 0 { 0.0 } else { 0.8 },
                flight_tool_with(Some(24)),
            );
            let choice = &answer["choices"][0];
            assert_eq!(
                choice["finish_reason"], "tool_calls",
                "{parser} seed {seed}: {answer}"
            );
            let calls = choice["message"]["tool_calls"]
                .as_array()
                .expect("tool_calls");
            assert_eq!(calls.len(), 1, "{parser}: {answer}");
            check_call(&calls[0]).unwrap_or_else(|e| panic!("{parser} seed {seed}: {e}: {answer}"));
            let args: Value =
                serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(args["passengers"].is_i64(), "{parser}: {args}");
            assert!(args["traveller"].is_object(), "{parser}: {args}");
            assert!(
                ["economy", "business", "first"].contains(&args["cabin"].as_str().unwrap()),
                "{parser}: {args}"
            );
        }
    }
}
