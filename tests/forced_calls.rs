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
    json!({"type": "function", "function": {
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
    }})
}

fn ask(client: &Client, server: &Server, choice: &Value, seed: u64) -> Value {
    let body = json!({
        "messages": [{"role": "user", "content":
            "Book me, Ada Lovelace, one economy seat from London Heathrow to Paris on 2027-03-14."}],
        "tools": [flight_tool()],
        "tool_choice": choice,
        "temperature": 0.8,
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
