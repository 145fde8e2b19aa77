//! Rebuilds a Hugging Face tokenizer (`tokenizer.json`, `tokenizer_config.json`,
//! `special_tokens_map.json`) from the `tokenizer.*` metadata of a GGUF file.

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::gguf::GgufHeader;

/// ggml token types.
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// The files of the tokenizer and the special ids the model config repeats.
pub struct TokenizerFiles {
    /// The contents of `tokenizer.json`.
    pub tokenizer_json: Value,
    /// The contents of `tokenizer_config.json`.
    pub tokenizer_config: Value,
    /// The contents of `special_tokens_map.json`.
    pub special_tokens_map: Value,
    /// Beginning-of-sequence token id (`tokenizer.ggml.bos_token_id`).
    pub bos_id: Option<i64>,
    /// End-of-sequence token id (`tokenizer.ggml.eos_token_id`).
    pub eos_id: Option<i64>,
    /// Padding token id (`tokenizer.ggml.padding_token_id`).
    pub pad_id: Option<i64>,
    /// Number of tokens in the vocabulary.
    pub vocab_size: usize,
}

/// The pre-tokenizer that llama.cpp names `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: &str) -> Result<Value> {
    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": true,
        "use_regex": true
    });
    Ok(match pre {
        "smollm" => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level
            ]
        }),
        "gpt-2" | "default" => byte_level,
        other => {
            bail!("unsupported GGUF pre-tokenizer {other:?} (supported: smollm, gpt-2, default)")
        }
    })
}

fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": special
    })
}

/// `[a, b]` pairs from GGUF's `"a b"` merge strings.
fn merge_pairs(merges: &[&str]) -> Result<Vec<Value>> {
    merges
        .iter()
        .map(|m| {
            let (a, b) = m
                .split_once(' ')
                .with_context(|| format!("malformed BPE merge {m:?} in the GGUF metadata"))?;
            Ok(json!([a, b]))
        })
        .collect()
}

fn post_processor(add_bos: bool, bos: Option<&str>, bos_id: Option<i64>) -> Value {
    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": true,
        "trim_offsets": false,
        "use_regex": true
    });
    match (add_bos, bos, bos_id) {
        (true, Some(bos), Some(id)) => json!({
            "type": "Sequence",
            "processors": [
                byte_level,
                {
                    "type": "TemplateProcessing",
                    "single": [
                        {"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}
                    ],
                    "pair": [
                        {"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": bos, "type_id": 1}},
                        {"Sequence": {"id": "B", "type_id": 1}}
                    ],
                    "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}}
                }
            ]
        }),
        _ => byte_level,
    }
}

/// Builds the tokenizer files from the GGUF metadata (BPE `gpt2` tokenizers).
pub fn build(h: &GgufHeader) -> Result<TokenizerFiles> {
    let model = h
        .string("tokenizer.ggml.model")
        .context("the GGUF file has no tokenizer (tokenizer.ggml.model is missing)")?;
    if model != "gpt2" {
        bail!("unsupported GGUF tokenizer model {model:?} (supported: gpt2, i.e. byte-level BPE)");
    }
    let pre = h.string("tokenizer.ggml.pre").unwrap_or("default");
    let pre_tokenizer = pre_tokenizer(pre)?;
    let tokens = h
        .strings("tokenizer.ggml.tokens")?
        .context("the GGUF metadata lacks tokenizer.ggml.tokens")?;
    let merges = h.strings("tokenizer.ggml.merges")?.unwrap_or_default();
    let types = h
        .ints("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![1; tokens.len()]);
    if types.len() != tokens.len() {
        bail!(
            "the GGUF metadata has {} tokens but {} token types",
            tokens.len(),
            types.len()
        );
    }

    let mut vocab = Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(token.to_string(), json!(id));
        match kind {
            TOKEN_CONTROL => added.push(added_token(id, token, true)),
            TOKEN_USER_DEFINED => added.push(added_token(id, token, false)),
            _ => {}
        }
    }

    let special_id = |key: &str| -> Result<Option<i64>> {
        let Some(id) = h.int(&format!("tokenizer.ggml.{key}_token_id")) else {
            return Ok(None);
        };
        if id < 0 || id as usize >= tokens.len() {
            bail!("tokenizer.ggml.{key}_token_id = {id} is outside the vocabulary");
        }
        Ok(Some(id))
    };
    let bos_id = special_id("bos")?;
    let eos_id = special_id("eos")?;
    let pad_id = special_id("padding")?;
    let unk_id = special_id("unknown")?;
    let text = |id: Option<i64>| id.map(|i| tokens[i as usize].to_string());
    let (bos, eos, pad, unk) = (text(bos_id), text(eos_id), text(pad_id), text(unk_id));
    let add_bos = h
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);

    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(add_bos, bos.as_deref(), bos_id),
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": true,
            "trim_offsets": true,
            "use_regex": true
        },
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merge_pairs(&merges)?
        }
    });

    let mut named = Map::new();
    for (key, value) in [
        ("bos_token", &bos),
        ("eos_token", &eos),
        ("pad_token", &pad),
        ("unk_token", &unk),
    ] {
        if let Some(v) = value {
            named.insert(key.into(), json!(v));
        }
    }
    let mut additional: Vec<String> = Vec::new();
    for t in [&bos, &eos, &pad].into_iter().flatten() {
        if !additional.contains(t) {
            additional.push(t.clone());
        }
    }
    if !additional.is_empty() {
        named.insert("additional_special_tokens".into(), json!(additional));
    }
    let special_tokens_map = Value::Object(named.clone());

    let mut config = Map::new();
    config.insert("add_prefix_space".into(), json!(false));
    if add_bos {
        config.insert("add_bos_token".into(), json!(true));
    }
    config.extend(named);
    if let Some(template) = h.string("tokenizer.chat_template") {
        config.insert("chat_template".into(), json!(template));
    }
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(ctx) = context_length(h) {
        config.insert("model_max_length".into(), json!(ctx));
    }
    config.insert("tokenizer_class".into(), json!("GPT2Tokenizer"));
    config.insert("vocab_size".into(), json!(tokens.len()));

    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config: Value::Object(config),
        special_tokens_map,
        bos_id,
        eos_id,
        pad_id,
        vocab_size: tokens.len(),
    })
}

fn context_length(h: &GgufHeader) -> Option<i64> {
    let arch = h.string("general.architecture")?;
    h.int(&format!("{arch}.context_length"))
}
