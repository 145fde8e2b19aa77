//! Rows of mlx-lm's JSONL datasets, tokenized as mlx-lm does.
//!
//! SFT rows: `{"messages": [...]}` (chat template), `{"prompt", "completion"}`
//! (a user turn and an assistant turn) or `{"text"}` (raw text + EOS).
//! Preference rows: `{"prompt", "chosen", "rejected"}`, each a string or a
//! message list. Training reads its split files through them (`train::data`);
//! perplexity on chat and completions data scores SFT rows (`eval::perplexity`).

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::chat_template::{validate_messages, Message};
use crate::tokenizer::Tokenizer;

/// One supervised sequence; positions before `offset` are not supervised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SftExample {
    /// The prompt and completion tokens.
    pub tokens: Vec<u32>,
    /// Number of leading tokens (the prompt) excluded from the loss.
    pub offset: usize,
}

/// One preference pair sharing a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreferenceExample {
    /// The tokens of the shared prompt.
    pub prompt: Vec<u32>,
    /// The tokens of the preferred completion.
    pub chosen: Vec<u32>,
    /// The tokens of the rejected completion.
    pub rejected: Vec<u32>,
}

impl PreferenceExample {
    /// Tokens of the prompt and the longer response.
    pub(crate) fn longest(&self) -> usize {
        self.prompt.len() + self.chosen.len().max(self.rejected.len())
    }

    /// The pair cut to at most `max_len` tokens of prompt + longer response:
    /// the prompt loses its oldest tokens (down to half the budget), then the
    /// responses lose their last ones.
    pub fn fit(&self, max_len: usize) -> Self {
        let max_len = max_len.max(2);
        if self.longest() <= max_len {
            return self.clone();
        }
        let reply = self.chosen.len().max(self.rejected.len());
        let keep_prompt = self
            .prompt
            .len()
            .min(max_len.saturating_sub(reply).max(max_len / 2))
            .max(1);
        let prompt = self.prompt[self.prompt.len() - keep_prompt..].to_vec();
        let room = (max_len - keep_prompt).max(1);
        let cut = |r: &Vec<u32>| r[..r.len().min(room)].to_vec();
        Self {
            prompt,
            chosen: cut(&self.chosen),
            rejected: cut(&self.rejected),
        }
    }
}

/// One SFT row tokenized as mlx-lm's datasets do (`tools`, when given,
/// are passed to the chat template).
pub(crate) fn sft_row(row: &Value, tok: &Tokenizer, mask_prompt: bool) -> Result<SftExample> {
    let tools = match row.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) => Some(t.as_slice()),
        Some(_) => bail!("\"tools\" must be a list of tool definitions"),
    };
    let render = |messages: &[Message], add_generation_prompt: bool| {
        render_tools(tok, messages, add_generation_prompt, tools)
    };
    if let (Some(prompt), Some(completion)) = (row.get("prompt"), row.get("completion")) {
        let messages = vec![
            Message::new("user", string_field(prompt, "prompt")?),
            Message::new("assistant", string_field(completion, "completion")?),
        ];
        let tokens = render(&messages, false)?;
        let offset = if mask_prompt {
            render(&messages[..1], true)?.len()
        } else {
            0
        };
        return finish_sft(tokens, offset);
    }
    if let Some(messages) = row.get("messages") {
        let messages = parse_messages(messages, "messages")?;
        let tokens = render(&messages, false)?;
        let offset = if mask_prompt {
            let last_is_assistant = messages.last().is_some_and(|m| m.role == "assistant");
            if messages.len() < 2 {
                bail!("--mask-prompt needs at least two messages (a prompt and a reply)");
            }
            render(&messages[..messages.len() - 1], last_is_assistant)?.len()
        } else {
            0
        };
        return finish_sft(tokens, offset);
    }
    if let Some(text) = row.get("text") {
        if mask_prompt {
            bail!("--mask-prompt is not supported for {{\"text\"}} rows");
        }
        let text = string_field(text, "text")?;
        let mut tokens = tok
            .inner()
            .encode(text, true)
            .map_err(|e| anyhow!("tokenizing: {e}"))?
            .get_ids()
            .to_vec();
        if let Some(eos) = eos_id(tok) {
            if tokens.last() != Some(&eos) {
                tokens.push(eos);
            }
        }
        return finish_sft(tokens, 0);
    }
    if row.get("chosen").is_some() || row.get("rejected").is_some() {
        bail!(
            "this is a preference row ({{prompt, chosen, rejected}}); train it with --method orpo"
        );
    }
    bail!(
        "unsupported row: expected {{\"messages\"}}, {{\"prompt\", \"completion\"}} or {{\"text\"}}"
    )
}

fn finish_sft(tokens: Vec<u32>, offset: usize) -> Result<SftExample> {
    if tokens.len() < 2 {
        bail!("the row tokenizes to fewer than two tokens");
    }
    if offset >= tokens.len() {
        bail!("the prompt covers the whole row: nothing left to train on");
    }
    Ok(SftExample { tokens, offset })
}

pub(crate) fn preference_row(row: &Value, tok: &Tokenizer) -> Result<PreferenceExample> {
    let field = |name: &str| -> Result<&Value> {
        row.get(name).filter(|v| !v.is_null()).ok_or_else(|| {
            anyhow!("missing \"{name}\" (preference rows need prompt, chosen and rejected)")
        })
    };
    let (prompt, chosen, rejected) = (field("prompt")?, field("chosen")?, field("rejected")?);
    let (prompt_ids, chosen_ids, rejected_ids) = match &tok.chat_template {
        Some(_) => {
            let prompt_msgs = match prompt {
                Value::String(s) => vec![Message::new("user", s)],
                v => parse_messages(v, "prompt")?,
            };
            let prompt_text = render_text(tok, &prompt_msgs, true)?;
            let reply = |v: &Value, name: &str| -> Result<Vec<u32>> {
                let mut msgs = prompt_msgs.clone();
                match v {
                    Value::String(s) => msgs.push(Message::new("assistant", s)),
                    v => {
                        let mut reply = parse_messages(v, name)?;
                        // Conversational rows may repeat the prompt in each reply.
                        if reply.len() > prompt_msgs.len()
                            && reply[..prompt_msgs.len()] == prompt_msgs[..]
                        {
                            reply.drain(..prompt_msgs.len());
                        }
                        msgs.extend(reply);
                    }
                }
                let full = render_text(tok, &msgs, false)?;
                let Some(rest) = full.strip_prefix(prompt_text.as_str()) else {
                    bail!("the chat template renders \"{name}\" without the prompt as its prefix");
                };
                tok.encode(rest)
            };
            (
                tok.encode(&prompt_text)?,
                reply(chosen, "chosen")?,
                reply(rejected, "rejected")?,
            )
        }
        None => {
            let plain = |v: &Value, name: &str| -> Result<String> {
                Ok(string_field(v, name)?.to_string())
            };
            let with_eos = |text: String| -> Result<Vec<u32>> {
                let mut ids = tok.encode(&text)?;
                if let Some(eos) = eos_id(tok) {
                    ids.push(eos);
                }
                Ok(ids)
            };
            (
                tok.encode(&plain(prompt, "prompt")?)?,
                with_eos(plain(chosen, "chosen")?)?,
                with_eos(plain(rejected, "rejected")?)?,
            )
        }
    };
    if prompt_ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    if chosen_ids.is_empty() || rejected_ids.is_empty() {
        bail!("chosen and rejected must not be empty");
    }
    Ok(PreferenceExample {
        prompt: prompt_ids,
        chosen: chosen_ids,
        rejected: rejected_ids,
    })
}

fn string_field<'a>(v: &'a Value, name: &str) -> Result<&'a str> {
    v.as_str()
        .ok_or_else(|| anyhow!("\"{name}\" must be a string"))
}

fn parse_messages(v: &Value, name: &str) -> Result<Vec<Message>> {
    if !v.is_array() {
        bail!("\"{name}\" must be a string or a list of messages");
    }
    let msgs: Vec<Message> = serde_json::from_value(v.clone())
        .map_err(|e| anyhow!("\"{name}\" is not a valid message list: {e}"))?;
    validate_messages(&msgs).map_err(|e| anyhow!("\"{name}\": {e}"))?;
    Ok(msgs)
}

fn render_text(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<String> {
    let Some(template) = &tok.chat_template else {
        bail!("the model has no chat template; use {{\"text\"}} rows");
    };
    template.render(messages, add_generation_prompt)
}

fn render_tools(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
    tools: Option<&[Value]>,
) -> Result<Vec<u32>> {
    let Some(template) = &tok.chat_template else {
        bail!("the model has no chat template; use {{\"text\"}} rows");
    };
    let text = template.render_with(messages, add_generation_prompt, tools, &Default::default())?;
    tok.encode(&text)
}

fn eos_id(tok: &Tokenizer) -> Option<u32> {
    tok.eos_token
        .as_deref()
        .and_then(|t| tok.token_to_id(t))
        .or_else(|| tok.eos_ids.iter().next().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_pairs_are_cut_to_the_budget() {
        let pair = PreferenceExample {
            prompt: (0..10).collect(),
            chosen: (100..106).collect(),
            rejected: (200..203).collect(),
        };
        assert_eq!(pair.fit(16), pair);
        let cut = pair.fit(12);
        assert_eq!(cut.prompt, (4..10).collect::<Vec<u32>>());
        assert_eq!(cut.chosen, (100..106).collect::<Vec<u32>>());
        let tight = pair.fit(8);
        assert_eq!(tight.prompt, (6..10).collect::<Vec<u32>>());
        assert_eq!(tight.chosen, (100..104).collect::<Vec<u32>>());
        assert_eq!(tight.rejected, (200..203).collect::<Vec<u32>>());
        assert!(tight.longest() <= 8);
    }
}
