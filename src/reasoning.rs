//! Reasoning ("thinking") text split from the answer. The markers are the
//! ones mlx-lm knows (`<think>…</think>`, `<longcat_think>…`,
//! `<|think:start|>…<|think:end|>`, Gemma's `<|channel>thought…<channel|>`),
//! found as tokens of the vocabulary, as mlx-lm finds them, or named by the
//! chat template; and GPT-OSS's harmony `analysis` channel, whose answer
//! header (`<|start|>assistant<|channel|>final<|message|>`) is dropped from
//! the content. The splitter works on streamed text: a marker cut across two
//! pieces is held back until it is whole.

use crate::tokenizer::Tokenizer;

/// The text that opens and closes a reasoning block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningMarkers {
    /// The text that opens a block, e.g. `<think>`.
    pub start: String,
    /// The text that closes it, e.g. `</think>`.
    pub end: String,
}

const HARMONY: (&str, &str) = ("<|channel|>analysis<|message|>", "<|end|>");

/// The headers of a harmony answer on the `final` channel.
const HARMONY_FINAL: [&str; 2] = [
    "<|start|>assistant<|channel|>final<|message|>",
    "<|channel|>final<|message|>",
];

const SINGLE_TOKEN: [(&str, &str); 3] = [
    ("<think>", "</think>"),
    ("<longcat_think>", "</longcat_think>"),
    ("<|think:start|>", "<|think:end|>"),
];

impl ReasoningMarkers {
    /// The markers `start` and `end`.
    pub fn new(start: &str, end: &str) -> Self {
        Self {
            start: start.into(),
            end: end.into(),
        }
    }

    /// The markers of a model: a pair whose both halves are vocabulary
    /// tokens, else a pair its chat template writes.
    pub fn infer(tokenizer: &Tokenizer, template: Option<&str>) -> Option<Self> {
        for (start, end) in SINGLE_TOKEN {
            if tokenizer.token_to_id(start).is_some() && tokenizer.token_to_id(end).is_some() {
                return Some(Self::new(start, end));
            }
        }
        if tokenizer.token_to_id("<|channel>").is_some()
            && tokenizer.token_to_id("<channel|>").is_some()
        {
            return Some(Self::new("<|channel>thought", "<channel|>"));
        }
        if ["<|start|>", "<|channel|>", "<|message|>", "<|end|>"]
            .into_iter()
            .all(|t| tokenizer.token_to_id(t).is_some())
        {
            return Some(Self::new(HARMONY.0, HARMONY.1));
        }
        let template = template?;
        SINGLE_TOKEN
            .into_iter()
            .find(|(s, e)| template.contains(s) && template.contains(e))
            .map(|(s, e)| Self::new(s, e))
    }

    /// By name for `--reasoning-parser`: `think` (and `qwen3`, `deepseek_r1`),
    /// `longcat`, `gemma4`, `harmony` (`gpt_oss`), or `none` (no split).
    pub fn from_name(name: &str) -> anyhow::Result<Option<Self>> {
        Ok(match name {
            "think" | "qwen3" | "deepseek_r1" => Some(Self::new("<think>", "</think>")),
            "longcat" => Some(Self::new("<longcat_think>", "</longcat_think>")),
            "gemma4" => Some(Self::new("<|channel>thought", "<channel|>")),
            "harmony" | "gpt_oss" => Some(Self::new(HARMONY.0, HARMONY.1)),
            "none" => None,
            other => anyhow::bail!(
                "unknown reasoning parser {other:?}; expected think, longcat, gemma4, harmony or none"
            ),
        })
    }

    /// GPT-OSS's harmony channels.
    fn is_harmony(&self) -> bool {
        self.start == HARMONY.0 && self.end == HARMONY.1
    }

    /// Whether a prompt leaves the model inside a reasoning block (templates
    /// that open `<think>` for the model).
    pub fn prompt_opens(&self, prompt: &str) -> bool {
        match prompt.rfind(&self.start) {
            Some(at) => !prompt[at..].contains(&self.end),
            None => false,
        }
    }
}

/// A piece of output: reasoning or answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Reasoning(String),
    Answer(String),
}

/// Splits streamed output into reasoning and answer.
pub(crate) struct ReasoningSplitter {
    markers: ReasoningMarkers,
    inside: bool,
    held: String,
    /// Just left a reasoning block: the answer's leading blank lines go.
    trim_answer: bool,
    /// Harmony: the start of an answer while it may still be a `final` header.
    lead: Option<String>,
}

/// The longest tail of `text` that begins `marker` (a marker possibly cut).
pub(crate) fn partial_tail(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

impl ReasoningSplitter {
    /// `inside`: the prompt already opened a reasoning block.
    pub fn new(markers: ReasoningMarkers, inside: bool) -> Self {
        Self {
            markers,
            inside,
            held: String::new(),
            trim_answer: false,
            lead: None,
        }
        .starting()
    }

    /// Harmony answers may open with a header at once.
    fn starting(mut self) -> Self {
        if self.markers.is_harmony() {
            self.trim_answer = true;
        }
        self
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let marker = if self.inside {
                &self.markers.end
            } else {
                &self.markers.start
            };
            match self.held.find(marker.as_str()) {
                Some(at) => {
                    let before = self.held[..at].to_string();
                    self.held.drain(..at + marker.len());
                    self.emit(&mut out, before);
                    self.inside = !self.inside;
                    // The answer usually starts after a blank line.
                    self.trim_answer = !self.inside;
                }
                None => {
                    let keep = partial_tail(&self.held, marker);
                    let ready = self.held[..self.held.len() - keep].to_string();
                    self.held.drain(..self.held.len() - keep);
                    self.emit(&mut out, ready);
                    return out;
                }
            }
        }
    }

    /// The rest at the end of the output.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        self.emit(&mut out, rest);
        if let Some(lead) = self.lead.take().filter(|l| !l.is_empty()) {
            out.push(Piece::Answer(lead));
        }
        out
    }

    /// A harmony answer's start, without its `final` header; `None` while
    /// the text may still grow into one.
    fn strip_header(&mut self, text: String) -> Option<String> {
        let mut lead = self.lead.take().unwrap_or_default();
        lead.push_str(&text);
        let t = lead.trim_start();
        if let Some(h) = HARMONY_FINAL.iter().find(|h| t.starts_with(**h)) {
            return Some(t[h.len()..].trim_start().to_string());
        }
        if HARMONY_FINAL.iter().any(|h| h.starts_with(t)) {
            self.lead = Some(lead);
            return None;
        }
        Some(t.to_string())
    }

    fn emit(&mut self, out: &mut Vec<Piece>, text: String) {
        if self.trim_answer && !self.inside && self.markers.is_harmony() {
            let Some(t) = self.strip_header(text) else {
                return;
            };
            self.trim_answer = false;
            if !t.is_empty() {
                out.push(Piece::Answer(t));
            }
            return;
        }
        let text = if self.trim_answer && !self.inside {
            let t = text.trim_start().to_string();
            self.trim_answer = t.is_empty();
            t
        } else {
            text
        };
        if text.is_empty() {
            return;
        }
        out.push(if self.inside {
            Piece::Reasoning(text)
        } else {
            Piece::Answer(text)
        });
    }
}

/// Splits a whole output into (reasoning, answer).
pub fn split(markers: &ReasoningMarkers, inside: bool, text: &str) -> (String, String) {
    let mut s = ReasoningSplitter::new(markers.clone(), inside);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for p in pieces {
        match p {
            Piece::Reasoning(t) => reasoning.push_str(&t),
            Piece::Answer(t) => answer.push_str(&t),
        }
    }
    (reasoning.trim().to_string(), answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think() -> ReasoningMarkers {
        ReasoningMarkers::new("<think>", "</think>")
    }

    #[test]
    fn whole_and_streamed_agree() {
        // Qwen3 with thinking on.
        let out = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is 4.";
        assert_eq!(
            split(&think(), false, out),
            (
                "The user wants 2+2. That is 4.".into(),
                "The answer is 4.".into()
            )
        );
        for cut in 1..out.len() {
            if !out.is_char_boundary(cut) {
                continue;
            }
            let mut s = ReasoningSplitter::new(think(), false);
            let mut pieces = s.push(&out[..cut]);
            pieces.extend(s.push(&out[cut..]));
            pieces.extend(s.finish());
            let answer: String = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Answer(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(answer, "The answer is 4.", "cut at {cut}");
        }
    }

    #[test]
    fn harmony_analysis_is_reasoning() {
        // gpt-oss-20b: analysis, then the answer on the final channel.
        let harmony = ReasoningMarkers::from_name("harmony").unwrap().unwrap();
        let out = "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>4";
        assert_eq!(
            split(&harmony, false, out),
            ("User asks 2+2. Answer 4.".into(), "4".into())
        );
        for cut in 1..out.len() {
            let mut s = ReasoningSplitter::new(harmony.clone(), false);
            let mut pieces = s.push(&out[..cut]);
            pieces.extend(s.push(&out[cut..]));
            pieces.extend(s.finish());
            let answer: String = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Answer(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(answer, "4", "cut at {cut}");
        }
        assert_eq!(
            split(&harmony, false, "<|channel|>final<|message|>Hi"),
            ("".into(), "Hi".into())
        );
        let call = "<|channel|>analysis<|message|>Use f.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>";
        assert_eq!(
            split(&harmony, false, call).1,
            "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
        );
    }

    #[test]
    fn prompt_that_opens_the_block() {
        // DeepSeek-R1 / Qwen3-Thinking-2507 templates end the prompt with `<think>\n`.
        let prompt = "<|im_start|>assistant\n<think>\n";
        assert!(think().prompt_opens(prompt));
        assert!(!think().prompt_opens("<think>\n\n</think>\n\n"));
        assert_eq!(
            split(&think(), true, "Just add.\n</think>\n\n4"),
            ("Just add.".into(), "4".into())
        );
        assert_eq!(
            split(&think(), false, "no thinking"),
            ("".into(), "no thinking".into())
        );
    }
}
