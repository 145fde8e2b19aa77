//! Real chat templates (tests/data/chat_templates/) rendered by `ChatTemplate`
//! give transformers' text byte for byte (goldens/chat_templates.json, made by
//! scripts/oracle/make_template_corpus.py). Where transformers raises because
//! the template refuses a system message, ours renders the conversation with
//! the system text merged into the first user turn, and that must equal
//! transformers' rendering of the merged conversation. Where transformers
//! raises for another reason, ours must fail too.

mod common;

use std::path::Path;

use mlx_bun::chat_template::{ChatTemplate, Message};
use mlx_bun::prompt::{build_prompt, ChatInput, PromptInput};
use serde_json::{json, Map, Value};

/// Jinja2 escapes a plain string added to a `|safe` one (markupsafe's
/// `Markup.__add__`); minijinja concatenates. functionary-v3.1 builds its tool
/// list that way, so transformers' prompt carries HTML-escaped JSON there and
/// ours the JSON itself: those cases are compared with transformers' text
/// unescaped.
const MARKUP_CONCAT: &[&str] = &["functionary-v3.1"];

fn html_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn unix_secs(rfc3339_utc: &str) -> i64 {
    // "YYYY-MM-DDTHH:MM:SSZ"
    let n = |r: std::ops::Range<usize>| rfc3339_utc[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)
}

/// Where two texts first differ, with a little context from each.
fn first_difference(ours: &str, theirs: &str) -> String {
    let at = ours
        .char_indices()
        .zip(theirs.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(ours.len().min(theirs.len()));
    let from = ours[..at]
        .char_indices()
        .rev()
        .nth(40)
        .map_or(0, |(i, _)| i);
    let show = |s: &str| {
        s.get(from..)
            .unwrap_or("")
            .chars()
            .take(120)
            .collect::<String>()
    };
    format!(
        "at byte {at}:\n      ours: {:?}\n    theirs: {:?}",
        show(ours),
        show(theirs)
    )
}

#[test]
fn real_templates_render_as_transformers_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = root.join("tests/data/chat_templates");
    let index = read_json(&corpus.join("index.json"));
    let golden = read_json(&root.join("goldens/chat_templates.json"));
    let now = unix_secs(index["now"].as_str().unwrap());

    let mut templates = std::collections::HashMap::new();
    for entry in index["templates"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let file = corpus.join(entry["file"].as_str().unwrap());
        let source = std::fs::read_to_string(&file).unwrap();
        let token = |k: &str| entry[k].as_str().map(String::from);
        let template = ChatTemplate::new(source, token("bos_token"), token("eos_token"))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"))
            .with_now(now);
        let vars = entry["vars"].as_object().unwrap().clone();
        templates.insert(name.to_string(), (template, vars));
    }

    let (mut identical, mut merged, mut unescaped, mut refused, mut lenient) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    let cases = golden["cases"].as_array().unwrap();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let conv = case["conversation"].as_str().unwrap();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let label = format!(
            "{name} / {conv} / kwargs {} / add_generation_prompt {gen}",
            case["kwargs"]
        );
        let (template, vars) = &templates[name];
        let conversation = &golden["conversations"][conv];
        let messages: Vec<Message> =
            serde_json::from_value(conversation["messages"].clone()).unwrap();
        let tools = conversation["tools"]
            .as_bool()
            .unwrap()
            .then(|| golden["tools"].as_array().unwrap().clone());
        let mut kwargs: Map<String, Value> = vars.clone();
        kwargs.extend(case["kwargs"].as_object().unwrap().clone());
        let ours = template.render_with(&messages, gen, tools.as_deref(), &kwargs);

        let expected = match (case.get("rendered"), case.get("merged")) {
            (Some(text), _) => text.as_str(),
            (None, Some(Value::String(text))) => Some(text.as_str()),
            _ => None,
        };
        match (expected, ours) {
            (Some(theirs), Ok(ours)) if ours == theirs => {
                if case.get("rendered").is_some() {
                    identical += 1;
                } else {
                    merged += 1;
                }
            }
            (Some(theirs), Ok(ours)) if MARKUP_CONCAT.contains(&name) => {
                let theirs = html_unescape(theirs);
                if ours == theirs {
                    unescaped += 1;
                } else {
                    let diff = first_difference(&ours, &theirs);
                    failures.push(format!("{label}: differs (unescaped) {diff}"));
                }
            }
            (Some(theirs), Ok(ours)) => failures.push(format!(
                "{label}: differs {}",
                first_difference(&ours, theirs)
            )),
            (Some(_), Err(e)) => failures.push(format!("{label}: ours failed: {e:#}")),
            (None, Err(_)) => refused += 1,
            // A template's own refusal (`raise_exception`) must hold; Python's
            // type errors (iterating `None`) need not.
            (None, Ok(_)) if !case["error"].as_str().unwrap().starts_with("TemplateError") => {
                lenient += 1
            }
            (None, Ok(_)) => failures.push(format!(
                "{label}: transformers raised {:?}, ours rendered",
                case["error"]
            )),
        }
    }
    eprintln!(
        "{} cases: {identical} byte-identical, {merged} with the system text merged as \
         transformers renders the merged conversation, {unescaped} equal to transformers' \
         text HTML-unescaped, {refused} refused by both, \
         {lenient} rendered where Python raised a type error",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases diverge from transformers:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Through `/v1/chat/completions` on the default model: Llama 3.1's template
/// with tools (`tojson(indent=4)`) and Gemma 2's with a system message give
/// the prompt the library renders.
#[test]
fn real_templates_render_through_the_server() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
    let model = common::model_dir();
    let golden =
        read_json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("goldens/chat_templates.json"));
    let tools = golden["tools"].as_array().unwrap().clone();
    let system_user = golden["conversations"]["system_user"]["messages"].clone();
    for (file, tools) in [
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", tools),
        ("google-gemma-2-2b-it.jinja", Vec::new()),
    ] {
        let path = corpus.join(file);
        let server =
            common::server::Server::start(&model, &["--chat-template", path.to_str().unwrap()]);
        let mut body = json!({"messages": system_user, "max_tokens": 1});
        if !tools.is_empty() {
            body["tools"] = json!(tools);
        }
        let response = reqwest::blocking::Client::new()
            .post(server.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .unwrap();
        let status = response.status();
        let answer: Value = response.json().unwrap();
        assert!(status.is_success(), "{file}: {status} {answer}");

        let mut tok = mlx_bun::tokenizer::Tokenizer::load(&model).unwrap();
        let source = std::fs::read_to_string(&path).unwrap();
        tok.chat_template =
            Some(ChatTemplate::new(source, tok.bos_token.clone(), tok.eos_token.clone()).unwrap());
        let chat = ChatInput {
            messages: serde_json::from_value(system_user.clone()).unwrap(),
            tools,
            kwargs: Map::new(),
        };
        let (_, ids) = build_prompt(&tok, &PromptInput::Chat(chat)).unwrap();
        assert_eq!(
            answer["usage"]["prompt_tokens"],
            ids.len(),
            "{file}: {answer}"
        );
    }
}
