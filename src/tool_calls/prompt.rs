//! Tools for chat templates that do not know about tools (SmolLM2's, for
//! one): the tool list goes into the system message with instructions to
//! answer in the Hermes `<tool_call>` format, earlier calls are written back
//! in that format, and tool results become user turns in `<tool_response>`.
//! A template that refuses the system role (Gemma's) gets that system text in
//! its first user turn, as any system message (see `ChatTemplate::render_with`).

use serde_json::Value;

use crate::chat_template::Message;

/// Whether a template renders the `tools` it is given.
pub(crate) fn template_supports_tools(source: &str) -> bool {
    source.contains("tools")
}

fn tool_lines(tools: &[Value]) -> String {
    tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t).to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `messages` with the tools described in a system message (merged into the
/// first one if there is one) and tool turns spelled out as text.
pub(crate) fn with_tools_in_prompt(messages: &[Message], tools: &[Value]) -> Vec<Message> {
    let instructions = format!(
        "You may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n\
         <tools>\n{}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        tool_lines(tools)
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(m) if m.role == "system" => {
            out.push(Message::new(
                "system",
                &format!("{}\n\n{instructions}", m.content),
            ));
        }
        _ => out.push(Message::new("system", &instructions)),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        match m.role.as_str() {
            "assistant" if m.tool_calls.is_some() => {
                let mut text = m.content.clone();
                for call in m.tool_calls.iter().flatten() {
                    let f = call.get("function").unwrap_or(call);
                    let body = serde_json::json!({
                        "name": f.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": f.get("arguments").cloned().unwrap_or(Value::Null),
                    });
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{body}\n</tool_call>"));
                }
                out.push(Message::new("assistant", &text));
            }
            "tool" => out.push(Message::new(
                "user",
                &format!("<tool_response>\n{}\n</tool_response>", m.content),
            )),
            _ => out.push(m.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_and_turns_become_text() {
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(vec![json!({"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}})]);
        let mut result = Message::new("tool", "{\"temp\": 21}");
        result.tool_call_id = Some("c1".into());
        let messages = vec![Message::new("user", "Weather in Paris?"), call, result];
        let tools = [json!({"type": "function", "function": {"name": "get_weather"}})];
        let out = with_tools_in_prompt(&messages, &tools);
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains("{\"name\":\"get_weather\"}"));
        assert!(out[2].content.starts_with("<tool_call>\n{"));
        assert!(out[2].content.contains("\"name\":\"get_weather\""));
        assert!(out[2]
            .content
            .contains("\"arguments\":{\"city\":\"Paris\"}"));
        assert_eq!(out[3].role, "user");
        assert!(out[3].content.starts_with("<tool_response>"));
        assert!(!template_supports_tools("{{ messages }}"));
    }

    #[test]
    fn tools_reach_a_template_without_a_system_role() {
        let template = crate::chat_template::ChatTemplate::new(
            include_str!("../../tests/data/chat_templates/google-gemma-2-2b-it.jinja").into(),
            Some("<bos>".into()),
            Some("<eos>".into()),
        )
        .unwrap();
        assert!(!template_supports_tools(template.source()));
        let messages = [
            Message::new("system", "Be brief."),
            Message::new("user", "Weather in Paris?"),
        ];
        let tools = [json!({"type": "function", "function": {"name": "get_weather"}})];
        let text = template
            .render(&with_tools_in_prompt(&messages, &tools), true)
            .unwrap();
        assert!(
            text.starts_with("<bos><start_of_turn>user\nBe brief.\n\nYou may call"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "</tool_call>\n\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n"
            ),
            "{text}"
        );
    }
}
