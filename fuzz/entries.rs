//! The fuzzed entry points: raw bytes into the parsers that read untrusted
//! input. Shared by the libFuzzer targets (`fuzz_targets/`) and by
//! `tests/fuzz_regressions.rs`, which replays every saved crash through the
//! same functions in a normal `cargo test`. Errors are fine; panics, hangs
//! and unbounded allocations are the bugs.
#![allow(dead_code)]

use std::sync::OnceLock;

use mlx_bun::chat_template::{ChatTemplate, Message};
use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::server::request::{parse, Endpoint};

/// The default model's vocabulary size, the bound request parsing checks ids against.
const VOCAB: usize = 49152;

/// The names of the targets, as folders under `fuzz/corpus` and `fuzz/regressions`.
pub const TARGETS: [&str; 5] = [
    "gguf",
    "safetensors_header",
    "chat_template",
    "request_json",
    "json_schema",
];

/// Runs the entry of `target` on `data`.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "gguf" => gguf(data),
        "safetensors_header" => safetensors_header(data),
        "chat_template" => chat_template(data),
        "request_json" => request_json(data),
        "json_schema" => json_schema(data),
        other => panic!("unknown fuzz target {other:?}"),
    }
}

/// A whole GGUF file: header, tensor ranges, then what convert derives from
/// the metadata (heads, tokenizer, config, tensor names).
pub fn gguf(data: &[u8]) {
    use mlx_bun::convert::{gguf::GgufHeader, gguf_llama, gguf_tokenizer};
    let Ok(h) = GgufHeader::from_bytes(data) else {
        return;
    };
    for t in &h.tensors {
        let _ = gguf_llama::hf_name(&t.name);
    }
    let Ok(tok) = gguf_tokenizer::build(&h) else {
        return;
    };
    if gguf_llama::Heads::read(&h).is_ok() {
        let _ = gguf_llama::config(&h, &tok, true, false, "float32");
    }
}

/// A safetensors file (8-byte header length, JSON header, data).
pub fn safetensors_header(data: &[u8]) {
    let _ = mlx_bun::model::weights::check_safetensors_bytes(data);
}

/// A chat template, then after a NUL byte the messages as JSON.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (source, messages) = text.split_once('\0').unwrap_or((&text, ""));
    let messages: Vec<Message> = serde_json::from_str(messages).unwrap_or_else(|_| {
        vec![
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello"),
            Message::new("user", "Bye"),
        ]
    });
    let Ok(t) = ChatTemplate::new(source.to_string(), Some("<s>".into()), Some("</s>".into()))
    else {
        return;
    };
    let _ = t.render(&messages, true);
}

/// An OpenAI request body, read as both endpoints read it.
pub fn request_json(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = parse(Endpoint::Chat, &body, VOCAB);
    let _ = parse(Endpoint::Completions, &body, VOCAB);
}

/// The default model's grammar engine, built once per process.
fn engine() -> &'static GrammarEngine {
    static ENGINE: OnceLock<GrammarEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let dir = mlx_bun::default_model::dir();
        let tok = mlx_bun::tokenizer::Tokenizer::load(&dir).unwrap_or_else(|e| {
            panic!(
                "the json_schema target needs the default model in {} \
                 (run `mlx-bun generate --prompt Hi --max-tokens 1` once): {e:#}",
                dir.display()
            )
        });
        GrammarEngine::new(&tok).expect("building the token environment")
    })
}

/// A JSON schema: compiled to a grammar, then the first token mask.
pub fn json_schema(data: &[u8]) {
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let spec = ConstraintSpec::JsonSchema(schema);
    if let Ok(mut m) = engine().matcher(&spec) {
        let _ = m.allowed_tokens();
    }
}
