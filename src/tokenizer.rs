//! The tokenizer of a model directory: `tokenizer.json` through the
//! `tokenizers` crate, special tokens and chat template from
//! `tokenizer_config.json`, end-of-sequence ids from every place mlx-lm reads.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{anyhow, Context, Result};

use crate::chat_template::ChatTemplate;

/// A model's tokenizer: encoding and decoding, end-of-sequence ids, special tokens
/// and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Token ids that end generation: the `eos_token` and the config's `eos_token_id`s.
    pub eos_ids: BTreeSet<u32>,
    /// `bos_token` from `tokenizer_config.json`.
    pub bos_token: Option<String>,
    /// `eos_token` from `tokenizer_config.json`.
    pub eos_token: Option<String>,
    /// The chat template, from `chat_template.jinja` or `tokenizer_config.json`.
    pub chat_template: Option<ChatTemplate>,
    /// `tool_parser_type` from `tokenizer_config.json`: the tool-call
    /// format the model names for itself, before any inference.
    pub tool_parser_type: Option<String>,
    /// The raw `tokenizer.json`, for consumers that build their own views
    /// of the vocabulary (the grammar engine).
    pub json: String,
}

fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
    ))
}

impl Tokenizer {
    /// Reads the tokenizer of model folder `dir`: `tokenizer.json` (required),
    /// `tokenizer_config.json` and `chat_template.jinja`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let json = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (the model needs a tokenizer.json)",
                path.display()
            )
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| anyhow!("invalid {}: {e}", path.display()))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
        let bos_token = config.get("bos_token").and_then(token_text);
        let eos_token = config.get("eos_token").and_then(token_text);
        let tool_parser_type = config
            .get("tool_parser_type")
            .and_then(|v| v.as_str())
            .map(String::from);
        if let Some(Err(e)) = tool_parser_type
            .as_deref()
            .map(crate::tool_calls::ToolFormat::from_name)
        {
            tracing::warn!("tokenizer_config.json tool_parser_type ignored: {e:#}");
        }

        let mut eos_ids = BTreeSet::new();
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.insert(id);
        }
        // mlx-lm: the config's ids (generation_config.json's when it has
        // them) and the tokenizer's eos token.
        eos_ids.extend(crate::model::config::eos_token_ids(dir)?);

        let template_file = dir.join("chat_template.jinja");
        let template_path = if template_file.is_file() {
            template_file.clone()
        } else {
            dir.join("tokenizer_config.json")
        };
        let template_src = if template_file.is_file() {
            Some(
                std::fs::read_to_string(&template_file)
                    .with_context(|| format!("reading {}", template_file.display()))?,
            )
        } else {
            match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|t| t.get("template").and_then(|s| s.as_str()).map(String::from)),
                _ => None,
            }
        };
        let chat_template = template_src
            .map(|src| ChatTemplate::new(src, bos_token.clone(), eos_token.clone()))
            .transpose()
            .with_context(|| format!("in {}", template_path.display()))?;
        Ok(Self {
            inner,
            eos_ids,
            bos_token,
            eos_token,
            chat_template,
            tool_parser_type,
            json,
        })
    }

    /// Token ids of `text`, without added special tokens (templates carry their own).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("detokenizing: {e}"))
    }

    /// The id of `token`, when the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub(crate) fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub(crate) fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Turns a stream of token ids into text pieces that never split a UTF-8
/// character: text is held back while the decoded tail is incomplete.
pub(crate) struct StreamingDetokenizer {
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl Default for StreamingDetokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamingDetokenizer {
    pub fn new() -> Self {
        Self {
            tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds a token; returns the text that became final.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.tokens.push(id);
        let prefix = tok.decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.tokens[self.prefix_offset..])?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still held back (possibly with replacement characters).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let prefix = tok.decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.tokens[self.prefix_offset..])?;
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            Ok(full[prefix.len()..].to_string())
        } else {
            Ok(String::new())
        }
    }
}
