//! Turning user input (raw text or chat messages) into prompt token ids, as
//! mlx-lm does: chat input goes through the template, raw text is encoded as is.

use anyhow::{bail, Result};

use crate::chat_template::{validate_messages, Message};
use crate::tokenizer::Tokenizer;

/// A prompt as the user gives it: text, messages, a chat with tools, or token ids.
pub enum PromptInput {
    /// Plain text; wrapped as one user message when a chat template is used.
    Text {
        /// The text.
        text: String,
        /// A system message put before it when the chat template is used.
        system: Option<String>,
        /// Whether to render it through the model's chat template (else it is
        /// encoded as is).
        use_chat_template: bool,
    },
    /// A whole conversation.
    Messages(Vec<Message>),
    /// A conversation with tools and extra template variables.
    Chat(ChatInput),
    /// Token ids given directly.
    Tokens(Vec<u32>),
}

/// A conversation as an agent sends it: the tools it offers (OpenAI
/// objects) and variables for the template (`enable_thinking`, …).
#[derive(Clone, Debug, Default)]
pub struct ChatInput {
    /// The conversation.
    pub messages: Vec<Message>,
    /// OpenAI tool objects offered to the model.
    pub tools: Vec<serde_json::Value>,
    /// Extra template variables (`chat_template_kwargs`).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// Renders a conversation with tools: templates that know tools get them;
/// for the others they are described in the system message (see
/// [`crate::tool_calls::with_tools_in_prompt`]).
fn render_chat(template: &crate::chat_template::ChatTemplate, chat: &ChatInput) -> Result<String> {
    let native = crate::tool_calls::template_supports_tools(template.source());
    let uses_tools = !chat.tools.is_empty()
        || chat
            .messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.role == "tool");
    if uses_tools && !native {
        let messages = crate::tool_calls::with_tools_in_prompt(&chat.messages, &chat.tools);
        return template.render_with(&messages, true, None, &chat.kwargs);
    }
    let tools = (!chat.tools.is_empty()).then_some(chat.tools.as_slice());
    template.render_with(&chat.messages, true, tools, &chat.kwargs)
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
        PromptInput::Chat(chat) => {
            validate_messages(&chat.messages)?;
            match &tok.chat_template {
                Some(template) => render_chat(template, chat)?,
                None => bail!("the model has no chat template; send a plain prompt instead"),
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
