//! Turning user input (raw text or chat messages) into prompt token ids, as
//! mlx-lm does: chat input goes through the template, raw text is encoded as is.

use anyhow::{bail, Result};

use crate::chat_template::{validate_messages, Message};
use crate::tokenizer::Tokenizer;

pub enum PromptInput {
    /// Plain text; wrapped as one user message when a chat template is used.
    Text {
        text: String,
        system: Option<String>,
        use_chat_template: bool,
    },
    /// A whole conversation.
    Messages(Vec<Message>),
    /// Token ids given directly.
    Tokens(Vec<u32>),
}

/// The rendered prompt text (when a template or text is involved) and its ids.
pub fn build_prompt(tok: &Tokenizer, input: &PromptInput) -> Result<(Option<String>, Vec<u32>)> {
    let text = match input {
        PromptInput::Tokens(ids) => {
            if ids.is_empty() {
                bail!("the prompt is empty");
            }
            return Ok((None, ids.clone()));
        }
        PromptInput::Text {
            text,
            system,
            use_chat_template,
        } => {
            if text.is_empty() {
                bail!("the prompt is empty");
            }
            match (&tok.chat_template, use_chat_template) {
                (Some(template), true) => {
                    let mut messages = Vec::new();
                    if let Some(s) = system {
                        messages.push(Message::new("system", s));
                    }
                    messages.push(Message::new("user", text));
                    template.render(&messages, true)?
                }
                _ => text.clone(),
            }
        }
        PromptInput::Messages(messages) => {
            validate_messages(messages)?;
            match &tok.chat_template {
                Some(template) => template.render(messages, true)?,
                None => bail!("the model has no chat template; send a plain prompt instead"),
            }
        }
    };
    let ids = tok.encode(&text)?;
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    Ok((Some(text), ids))
}
