//! `mlx-bun generate --batch-file prompts.jsonl`: every line a prompt, all of
//! them run as rows of one continuous batch; results print in input order.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use mlx_bun::chat_template::Message;
use mlx_bun::decode::{generate_batch, BatchItem, BatchLimits};
use mlx_bun::generate::{GenerateOptions, GenerationResult};
use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::runtime::Runtime;
use mlx_bun::sampling::SamplingParams;
use serde::Deserialize;

/// One line: a prompt string, an array of chat messages, or an object with
/// a prompt or messages and per-line overrides of the command's flags.
#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Text(String),
    Messages(Vec<Message>),
    Request(Box<Request>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    system: Option<String>,
    max_tokens: Option<usize>,
    #[serde(alias = "temp")]
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    stop: Option<Vec<String>>,
    json_schema: Option<serde_json::Value>,
}

/// What the command's flags give every line.
pub struct Defaults {
    pub options: GenerateOptions,
    pub system: Option<String>,
    pub use_chat_template: bool,
    pub constraint: Option<ConstraintSpec>,
    pub limits: BatchLimits,
    pub json: bool,
}

struct Parsed {
    input: PromptInput,
    options: GenerateOptions,
    constraint: Option<ConstraintSpec>,
}

fn parse_line(text: &str, defaults: &Defaults) -> Result<Parsed> {
    let line: Line = serde_json::from_str(text).context(
        "expected a JSON string (prompt), an array of messages, or an object with \
         \"prompt\" or \"messages\"",
    )?;
    let text_input = |text: String, system: Option<String>| PromptInput::Text {
        text,
        system,
        use_chat_template: defaults.use_chat_template,
    };
    let mut options = defaults.options.clone();
    let mut constraint = defaults.constraint.clone();
    let input = match line {
        Line::Text(text) => text_input(text, defaults.system.clone()),
        Line::Messages(messages) => PromptInput::Messages(messages),
        Line::Request(r) => {
            let input = match (r.prompt, r.messages) {
                (Some(p), None) => text_input(p, r.system.or_else(|| defaults.system.clone())),
                (None, Some(m)) => PromptInput::Messages(m),
                _ => bail!("give exactly one of \"prompt\" and \"messages\""),
            };
            let s: &mut SamplingParams = &mut options.sampling;
            if let Some(t) = r.temperature {
                if !(t >= 0.0 && t.is_finite()) {
                    bail!("\"temperature\" must be 0 or more");
                }
                s.temperature = t;
            }
            if let Some(p) = r.top_p {
                if !(p > 0.0 && p <= 1.0) {
                    bail!("\"top_p\" must be in (0, 1]");
                }
                s.top_p = p;
            }
            if let Some(k) = r.top_k {
                s.top_k = k;
            }
            if let Some(m) = r.min_p {
                if !(0.0..=1.0).contains(&m) {
                    bail!("\"min_p\" must be in [0, 1]");
                }
                s.min_p = m;
            }
            if r.seed.is_some() {
                s.seed = r.seed;
            }
            if let Some(n) = r.max_tokens {
                options.max_tokens = n;
            }
            if let Some(stop) = r.stop {
                options.stop = stop;
            }
            if let Some(schema) = r.json_schema {
                constraint = Some(ConstraintSpec::JsonSchema(schema));
            }
            input
        }
    };
    Ok(Parsed {
        input,
        options,
        constraint,
    })
}

pub fn run(path: &Path, runtime: &Runtime, defaults: Defaults) -> Result<()> {
    let (model, tokenizer) = (&runtime.model, &runtime.tokenizer);
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the batch file {}", path.display()))?;
    let mut grammar: Option<GrammarEngine> = None;
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), n + 1);
        let parsed = parse_line(line, &defaults).with_context(at)?;
        let (_, prompt) = build_prompt(tokenizer, &parsed.input).with_context(at)?;
        let constraint = match &parsed.constraint {
            Some(spec) => {
                if grammar.is_none() {
                    grammar = Some(GrammarEngine::new(tokenizer)?);
                }
                Some(
                    grammar
                        .as_ref()
                        .unwrap()
                        .constraint(spec)
                        .with_context(at)?,
                )
            }
            None => None,
        };
        items.push(BatchItem {
            prompt,
            options: parsed.options,
            constraint,
            on_token: Box::new(|_| true),
            caches: runtime.make_caches()?,
        });
    }
    if items.is_empty() {
        bail!("{} has no prompts", path.display());
    }
    let results = generate_batch(model, tokenizer, items, defaults.limits)?;
    print(&results, defaults.json)
}

fn print(results: &[GenerationResult], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for (i, r) in results.iter().enumerate() {
        if json {
            writeln!(out, "{}", serde_json::to_string(r)?)?;
        } else {
            if i > 0 {
                writeln!(out)?;
            }
            writeln!(out, "==> {} <==", i + 1)?;
            writeln!(out, "{}", r.text)?;
        }
    }
    Ok(())
}
