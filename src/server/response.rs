//! Response bodies in OpenAI's shapes: `chat.completion`,
//! `chat.completion.chunk` and `text_completion`, with usage and logprobs.

use std::sync::Arc;

use serde_json::{json, Value};

use super::agent::{openai_message, random_id, Answer, AnswerPlan, Step};
use super::request::Endpoint;
use crate::generate::{FinishReason, GenerationResult, TokenLogprob};
use crate::tokenizer::Tokenizer;

/// What every body of one response shares.
pub struct Reply {
    /// Which API the response answers.
    pub endpoint: Endpoint,
    /// The response `id` (`chatcmpl-…` or `cmpl-…`).
    pub id: String,
    /// `created`: Unix time in seconds.
    pub created: u64,
    /// The `model` id responses carry.
    pub model: String,
    /// `system_fingerprint`.
    pub fingerprint: String,
    /// Decodes token ids for logprobs entries.
    pub tokenizer: Arc<Tokenizer>,
    /// `stream_options.include_usage`: streams end with a usage chunk.
    pub include_usage: bool,
    /// Extension: bodies carry the prompt's and the completion's token ids.
    pub return_token_ids: bool,
    /// Choices carry `logprobs`.
    pub logprobs: bool,
    /// Each choice's prompt ids (choices of one prompt repeat it).
    pub prompts: Vec<Vec<u32>>,
    /// Choices per prompt (`n`).
    pub n: usize,
    /// Chat answers with tools or reasoning markers: how to split them.
    pub plan: Option<AnswerPlan>,
}

/// A random id such as `chatcmpl-3kT9...`.
pub(crate) fn new_id(endpoint: Endpoint) -> String {
    use rand::distributions::Alphanumeric;
    use rand::Rng;
    let tail: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    match endpoint {
        Endpoint::Chat => format!("chatcmpl-{tail}"),
        Endpoint::Completions => format!("cmpl-{tail}"),
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// JSON has no infinities; OpenAI reports impossible tokens as -9999.
fn finite(x: f32) -> f64 {
    if x.is_finite() {
        x as f64
    } else {
        -9999.0
    }
}

/// `finish_reason` as OpenAI spells it; a cancelled generation reads `"stop"`.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// Usage of the choices of one request: each prompt counted once, every
/// choice's completion tokens summed (as OpenAI counts `n` and prompt lists).
pub fn usage(results: &[&GenerationResult], n: usize) -> Value {
    let n = n.max(1);
    let prompt: usize = results.iter().step_by(n).map(|r| r.prompt_tokens).sum();
    let cached: usize = results.iter().step_by(n).map(|r| r.cached_tokens).sum();
    let completion: usize = results.iter().map(|r| r.generation_tokens).sum();
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    });
    let specs: Vec<_> = results
        .iter()
        .filter_map(|r| r.speculation.as_ref())
        .collect();
    if !specs.is_empty() {
        usage["speculation"] = json!({
            "drafted": specs.iter().map(|s| s.drafted).sum::<usize>(),
            "accepted": specs.iter().map(|s| s.accepted).sum::<usize>(),
            "target_calls": specs.iter().map(|s| s.target_calls).sum::<usize>(),
        });
    }
    usage
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        })
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id]).unwrap_or_default()
    }

    /// One entry of a chat `logprobs.content` list.
    fn chat_logprob(&self, lp: &TokenLogprob) -> Value {
        let entry = |id: u32, logprob: f32| {
            let token = self.token_text(id);
            json!({"token": token, "logprob": finite(logprob), "bytes": token.as_bytes()})
        };
        let mut value = entry(lp.token, lp.logprob);
        value["top_logprobs"] = lp.top.iter().map(|&(id, l)| entry(id, l)).collect();
        value
    }

    /// A completions `logprobs` object for consecutive tokens whose text
    /// starts at `offset` characters into the completion.
    fn completion_logprobs(&self, lps: &[TokenLogprob], mut offset: usize) -> Value {
        let mut tokens = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top = Vec::new();
        let mut offsets = Vec::new();
        for lp in lps {
            let text = self.token_text(lp.token);
            offsets.push(offset);
            offset += text.chars().count();
            tokens.push(text);
            token_logprobs.push(finite(lp.logprob));
            let alternatives: serde_json::Map<String, Value> = lp
                .top
                .iter()
                .map(|&(id, l)| (self.token_text(id), json!(finite(l))))
                .collect();
            top.push(Value::Object(alternatives));
        }
        json!({
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }

    fn logprobs_value(&self, lps: &[TokenLogprob], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.endpoint {
            Endpoint::Chat => {
                json!({"content": lps.iter().map(|lp| self.chat_logprob(lp)).collect::<Vec<_>>()})
            }
            Endpoint::Completions => self.completion_logprobs(lps, offset),
        }
    }

    /// The whole answer of a non-streaming request: one choice per result,
    /// in choice order.
    pub fn complete(&self, results: &[GenerationResult]) -> Value {
        let choices: Vec<Value> = results
            .iter()
            .enumerate()
            .map(|(index, result)| {
                let mut reason = finish_reason(result.finish_reason);
                let mut choice = match (self.endpoint, &self.plan) {
                    (Endpoint::Chat, Some(plan)) => {
                        let answer = Answer::of(plan, &result.text);
                        if !answer.calls.is_empty() {
                            reason = "tool_calls";
                        }
                        json!({"index": index, "message": openai_message(&answer)})
                    }
                    (Endpoint::Chat, None) => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": result.text},
                    }),
                    (Endpoint::Completions, _) => json!({"index": index, "text": result.text}),
                };
                choice["logprobs"] = self.logprobs_value(&result.logprobs, 0);
                choice["finish_reason"] = json!(reason);
                if self.return_token_ids {
                    choice["token_ids"] = json!(result.token_ids);
                    choice["prompt_token_ids"] = json!(self.prompts[index]);
                }
                choice
            })
            .collect();
        let mut body = self.envelope(false, Value::Array(choices));
        body["usage"] = usage(&results.iter().collect::<Vec<_>>(), self.n);
        body
    }

    fn chunk(&self, choice: Value) -> Value {
        let mut body = self.envelope(true, json!([choice]));
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        body
    }

    /// The chunk that opens a chat choice's stream (the assistant role);
    /// none for completions.
    pub(crate) fn opening_chunk(&self, index: usize) -> Option<Value> {
        match self.endpoint {
            Endpoint::Chat => Some(self.chunk(json!({
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            }))),
            Endpoint::Completions => None,
        }
    }

    /// A chunk carrying new text (and the token's logprobs when asked).
    pub(crate) fn text_chunk(
        &self,
        index: usize,
        text: &str,
        logprob: Option<&TokenLogprob>,
        offset: usize,
    ) -> Value {
        let logprobs = match logprob {
            Some(lp) => self.logprobs_value(std::slice::from_ref(lp), offset),
            None => Value::Null,
        };
        match self.endpoint {
            Endpoint::Chat => self.chunk(json!({
                "index": index,
                "delta": {"content": text},
                "logprobs": logprobs,
                "finish_reason": null,
            })),
            Endpoint::Completions => self.chunk(json!({
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": null,
            })),
        }
    }

    /// Chunks for a split answer's steps; `calls` counts the choice's calls
    /// so far. A call opens with a delta of its `index`, `id`, `type`, name
    /// and empty `arguments`; its arguments follow in pieces (`index` and
    /// `function.arguments`) that join to the whole JSON string. Logprobs
    /// ride on the first chunk.
    pub(crate) fn delta_chunks(
        &self,
        index: usize,
        steps: Vec<Step>,
        logprob: Option<&TokenLogprob>,
        calls: &mut usize,
    ) -> Vec<Value> {
        let mut logprobs = match logprob {
            Some(lp) => self.logprobs_value(std::slice::from_ref(lp), 0),
            None => Value::Null,
        };
        let mut chunks = Vec::new();
        let mut steps: Vec<Step> = steps
            .into_iter()
            .filter(|s| !matches!(s, Step::Call(_)))
            .collect();
        // A token that shows no text still reports its logprobs.
        if steps.is_empty() && logprobs != Value::Null {
            steps.push(Step::Content(String::new()));
        }
        let mut push = |delta: Value| {
            chunks.push(self.chunk(json!({
                "index": index,
                "delta": delta,
                "logprobs": std::mem::take(&mut logprobs),
                "finish_reason": null,
            })));
        };
        for step in steps {
            match step {
                Step::Reasoning(t) => push(json!({"reasoning_content": t, "reasoning": t})),
                Step::Content(t) => push(json!({"content": t})),
                Step::CallStart { index: i, id, name } => {
                    let id = id.unwrap_or_else(|| random_id("call_"));
                    push(
                        json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}}]}),
                    );
                    *calls = (*calls).max(i + 1);
                }
                Step::CallArguments { index: i, text } => {
                    push(json!({"tool_calls": [{"index": i, "function": {"arguments": text}}]}))
                }
                Step::Call(_) => {}
            }
        }
        chunks
    }

    /// The chunk that ends the choice, with its finish reason
    /// (`tool_calls` when `called`).
    pub(crate) fn closing_chunk(
        &self,
        index: usize,
        result: &GenerationResult,
        called: bool,
    ) -> Value {
        let reason = if called {
            "tool_calls"
        } else {
            finish_reason(result.finish_reason)
        };
        let mut choice = match self.endpoint {
            Endpoint::Chat => json!({"index": index, "delta": {}, "logprobs": null}),
            Endpoint::Completions => json!({"index": index, "text": "", "logprobs": null}),
        };
        choice["finish_reason"] = json!(reason);
        if self.return_token_ids {
            choice["token_ids"] = json!(result.token_ids);
            choice["prompt_token_ids"] = json!(self.prompts[index]);
        }
        self.chunk(choice)
    }

    /// The extra last chunk of `stream_options.include_usage`.
    pub fn usage_chunk(&self, results: &[&GenerationResult]) -> Value {
        let mut body = self.envelope(true, json!([]));
        body["usage"] = usage(results, self.n);
        body
    }
}
