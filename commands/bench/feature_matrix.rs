//! `mlx-bun bench feature-matrix`: every serving feature combination
//! (batching, grammar, speculative decoding) against the real `mlx-bun serve`,
//! started fresh per cell and driven over HTTP, with the prompt cache cold and
//! then warm. Results go to the eval database, a dated markdown report and a
//! PNG plot.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_bun::evaldb::{EvalDb, Metric, RunMeta};
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short)]
    model: Option<String>,
    /// Draft model of the spec cells (default: the model itself).
    #[arg(long)]
    draft_model: Option<String>,
    /// Only these cells (comma-separated names; default: all).
    #[arg(long, value_delimiter = ',')]
    cells: Option<Vec<String>>,
    /// A small version for CI: tiny token counts, one or two requests per cell.
    #[arg(long)]
    smoke: bool,
    /// Only these workloads (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,
    /// Runs of the whole cell list, interleaved; the summary gives each
    /// cell's median and range over them.
    #[arg(long, default_value_t = 1, value_parser = crate::validate::at_least_one)]
    rounds: usize,
    /// Folder for the markdown report and the PNG plot.
    #[arg(long, default_value = "docs/bench")]
    out: PathBuf,
    /// Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Seconds to wait for a server to report ready.
    #[arg(long, default_value_t = 600)]
    ready_timeout: u64,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

/// How a cell's server drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draft {
    None,
    /// Prompt lookup (`--draft-model ngram`).
    Ngram,
    /// A draft model (`--draft-model`, default: the model itself).
    Model,
}

/// One feature combination.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub name: &'static str,
    pub batch: bool,
    pub grammar: bool,
    pub draft: Draft,
    /// 8-bit KV cache from the first token (`--kv-bits 8 --quantized-kv-start 0`).
    pub kv8: bool,
}

const fn cell(name: &'static str, batch: bool, grammar: bool, draft: Draft, kv8: bool) -> Cell {
    Cell {
        name,
        batch,
        grammar,
        draft,
        kv8,
    }
}

pub const CELLS: &[Cell] = &[
    cell("serial", false, false, Draft::None, false),
    cell("batch4", true, false, Draft::None, false),
    cell("serial+grammar", false, true, Draft::None, false),
    cell("batch4+grammar", true, true, Draft::None, false),
    cell("serial+spec", false, false, Draft::Ngram, false),
    cell("serial+grammar+spec", false, true, Draft::Model, false),
    cell("batch4+spec", true, false, Draft::Ngram, false),
    cell("batch4+grammar+spec", true, true, Draft::Ngram, false),
    cell("batch4+draft", true, false, Draft::Model, false),
    cell("batch4+kv8", true, false, Draft::None, true),
];

impl Cell {
    fn spec(&self) -> bool {
        self.draft != Draft::None
    }

    /// The same cell without grammar: the baseline of the grammar overhead.
    fn without_grammar(&self) -> Option<&'static str> {
        self.grammar.then(|| {
            CELLS
                .iter()
                .find(|c| {
                    c.batch == self.batch
                        && c.draft == self.draft
                        && c.kv8 == self.kv8
                        && !c.grammar
                })
                .map(|c| c.name)
        })?
    }
}

/// Token budgets and request counts of one run.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Sizes {
    chat_tokens: usize,
    /// Extraction under the schema: enough for the JSON to complete.
    extract_tokens: usize,
    /// Extraction without a grammar (its output is not validated).
    extract_free_tokens: usize,
    long_tokens: usize,
    /// Copying a given text with one edit (what prompt lookup drafts well).
    copy_tokens: usize,
    agent_tokens: usize,
    agent_turns: usize,
    /// Requests per workload in a serial cell; batch cells send this many
    /// concurrent streams times `streams`.
    requests: usize,
    streams: usize,
}

impl Sizes {
    fn new(smoke: bool) -> Self {
        if smoke {
            Self {
                chat_tokens: 4,
                extract_tokens: 32,
                extract_free_tokens: 8,
                long_tokens: 8,
                copy_tokens: 16,
                agent_tokens: 4,
                agent_turns: 2,
                requests: 1,
                streams: 2,
            }
        } else {
            Self {
                chat_tokens: 64,
                extract_tokens: 128,
                extract_free_tokens: 128,
                long_tokens: 512,
                copy_tokens: 160,
                agent_tokens: 48,
                agent_turns: 4,
                requests: 2,
                streams: 4,
            }
        }
    }
}

/// The extraction workload's schema: outputs are validated against it.
fn extraction_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "city": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150}
        },
        "required": ["name", "city", "age"],
        "additionalProperties": false
    })
}

const PEOPLE: &[&str] = &[
    "Maria Lopez is 34 and lives in Valencia, where she teaches chemistry.",
    "Tom Becker, 58, runs a bakery in Hamburg.",
    "Aiko Tanaka moved to Osaka last year; she is 27.",
    "Samuel Okafor (41) works as a nurse in Lagos.",
];

const COPY_TEXTS: &[&str] = &[
    "The old lighthouse stood at the edge of the cliff. Every night its keeper climbed \
     the spiral stairs, lit the lamp, and watched the ships pass far below. In winter the \
     storms shook the windows, but the light never went out.",
    "Our team meets every Monday at nine. We review last week's tickets, agree on the \
     priorities for the coming week, and assign each ticket to one person. The meeting \
     ends at ten, and the notes go to the shared folder.",
    "To make the dough, mix the flour with the salt, add the water slowly, and knead for \
     ten minutes. Let it rest for an hour under a cloth, then shape it into a round loaf \
     and bake it for forty minutes.",
    "The library opens at eight and closes at six. Members may borrow up to five books \
     for three weeks. Late returns cost ten cents a day, and lost books must be replaced \
     or paid for at the desk.",
];

const CHATS: &[&str] = &[
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Give me one tip for sleeping better.",
    "What does a bee make?",
];

/// One HTTP exchange as measured by the client.
#[derive(Clone, Debug, Default)]
struct Exchange {
    ttft_s: f64,
    total_s: f64,
    completion_tokens: u64,
    text: String,
    finish_reason: String,
    drafted: u64,
    accepted: u64,
    speculated: bool,
}

impl Exchange {
    /// The stream's completion tokens over its whole request time. (Tokens
    /// after the first over the time after the first would be a decode-only
    /// rate, but the speculative lane delivers bursts: for short outputs most
    /// tokens arrive with the first chunk and that rate is meaningless.)
    fn stream_tps(&self) -> Option<f64> {
        (self.completion_tokens > 0 && self.total_s > 0.0)
            .then(|| self.completion_tokens as f64 / self.total_s)
    }
}

/// A running `mlx-bun serve`, killed on drop.
struct Server {
    child: Child,
    base: String,
    stderr: Arc<Mutex<String>>,
}

fn read_into(mut r: impl Read + Send + 'static, buf: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut b = buf.lock().unwrap();
            b.push_str(&String::from_utf8_lossy(&chunk[..n]));
            // Keep the tail: enough to report a failure.
            if b.len() > 64 * 1024 {
                let cut = b.len() - 32 * 1024;
                let cut = (cut..b.len()).find(|&i| b.is_char_boundary(i)).unwrap_or(0);
                b.drain(..cut);
            }
        }
    });
}

impl Server {
    fn start(serve_args: &[String], timeout: Duration) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg("serve")
            .args(serve_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting mlx-bun serve: {e}"))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        read_into(child.stderr.take().expect("piped"), stderr.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("ready at ").nth(1) {
                    let url = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(url);
                }
            }
        });
        let deadline = Instant::now() + timeout;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(url) => {
                    return Ok(Self {
                        child,
                        base: url,
                        stderr,
                    })
                }
                Err(_) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        std::thread::sleep(Duration::from_millis(200));
                        let err = stderr.lock().unwrap().clone();
                        return Err(format!("serve exited with {status}:\n{}", err.trim()));
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        let err = stderr.lock().unwrap().clone();
                        return Err(format!(
                            "serve was not ready after {}s:\n{}",
                            timeout.as_secs(),
                            err.trim()
                        ));
                    }
                }
            }
        }
    }

    /// Peak resident memory of the server process (VmHWM), in bytes.
    fn peak_rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    }

    fn stats(&self, http: &reqwest::blocking::Client) -> Result<Value> {
        Ok(http
            .get(format!("{}/stats", self.base))
            .send()?
            .error_for_status()?
            .json()?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends one streamed chat completion and measures it.
fn chat(http: &reqwest::blocking::Client, base: &str, body: &Value) -> Result<Exchange> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let start = Instant::now();
    let resp = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .context("sending a request")?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().unwrap_or_default();
        bail!("HTTP {status}: {text}");
    }
    let mut ex = Exchange::default();
    let mut first = None;
    for line in BufReader::new(resp).lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let chunk: Value =
            serde_json::from_str(data).with_context(|| format!("bad SSE chunk {data}"))?;
        if let Some(err) = chunk.get("error") {
            bail!("error in stream: {err}");
        }
        if let Some(choice) = chunk["choices"].get(0) {
            if let Some(t) = choice["delta"]["content"].as_str() {
                if !t.is_empty() && first.is_none() {
                    first = Some(start.elapsed().as_secs_f64());
                }
                ex.text.push_str(t);
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                ex.finish_reason = r.to_string();
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            ex.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
            if let Some(s) = u.get("speculation") {
                ex.speculated = true;
                ex.drafted = s["drafted"].as_u64().unwrap_or(0);
                ex.accepted = s["accepted"].as_u64().unwrap_or(0);
            }
        }
    }
    ex.total_s = start.elapsed().as_secs_f64();
    ex.ttft_s = first.unwrap_or(ex.total_s);
    Ok(ex)
}

/// Results of one workload in one phase of one cell.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct WorkloadResult {
    requests: usize,
    completion_tokens: u64,
    wall_s: f64,
    aggregate_tok_s: f64,
    stream_tok_s: Vec<f64>,
    ttft_s: Vec<f64>,
    /// Outputs checked against the schema: valid, invalid, cut by max_tokens.
    schema_valid: usize,
    schema_invalid: usize,
    schema_truncated: usize,
    speculated: usize,
    drafted: u64,
    accepted: u64,
}

fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = (p * (v.len() - 1) as f64).round() as usize;
    v[rank.min(v.len() - 1)]
}

/// The request bodies of one workload: `streams` independent sequences of
/// requests (the agent loop's turns depend on the previous reply).
fn run_workload(
    http: &reqwest::blocking::Client,
    base: &str,
    workload: &str,
    cell: &Cell,
    sizes: &Sizes,
    validator: &jsonschema::Validator,
) -> Result<WorkloadResult> {
    let streams = if cell.batch { sizes.streams } else { 1 };
    let per_stream = sizes.requests;
    let start = Instant::now();
    let results: Vec<Result<Vec<Exchange>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..streams)
            .map(|stream| {
                s.spawn(move || -> Result<Vec<Exchange>> {
                    let mut out = Vec::new();
                    for r in 0..per_stream {
                        let i = stream * per_stream + r;
                        out.extend(one_sequence(http, base, workload, cell, sizes, i)?);
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a client thread panicked"))
            })
            .collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let mut res = WorkloadResult {
        wall_s,
        ..Default::default()
    };
    for exchanges in results {
        for ex in exchanges? {
            res.requests += 1;
            res.completion_tokens += ex.completion_tokens;
            res.ttft_s.push(ex.ttft_s);
            if let Some(tps) = ex.stream_tps() {
                res.stream_tok_s.push(tps);
            }
            res.drafted += ex.drafted;
            res.accepted += ex.accepted;
            res.speculated += ex.speculated as usize;
            if workload == "extraction" && cell.grammar {
                if ex.finish_reason == "length" {
                    res.schema_truncated += 1;
                } else {
                    match serde_json::from_str::<Value>(&ex.text) {
                        Ok(v) if validator.is_valid(&v) => res.schema_valid += 1,
                        _ => {
                            res.schema_invalid += 1;
                            bail!(
                                "{}: extraction output does not match the schema: {}",
                                cell.name,
                                ex.text
                            );
                        }
                    }
                }
            }
        }
    }
    res.aggregate_tok_s = res.completion_tokens as f64 / wall_s.max(1e-9);
    Ok(res)
}

fn constraint(cell: &Cell, workload: &str) -> Option<Value> {
    if !cell.grammar {
        return None;
    }
    Some(if workload == "extraction" {
        json!({"type": "json_schema",
               "json_schema": {"name": "person", "strict": true, "schema": extraction_schema()}})
    } else {
        json!({"type": "json_object"})
    })
}

/// One request (or, for the agent loop, one conversation of turns).
fn one_sequence(
    http: &reqwest::blocking::Client,
    base: &str,
    workload: &str,
    cell: &Cell,
    sizes: &Sizes,
    i: usize,
) -> Result<Vec<Exchange>> {
    let body = |messages: Value, max_tokens: usize| {
        let mut b = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0.0});
        if let Some(rf) = constraint(cell, workload) {
            b["response_format"] = rf;
        }
        b
    };
    let msg = |role: &str, content: &str| json!({"role": role, "content": content});
    Ok(match workload {
        "chat" => vec![chat(
            http,
            base,
            &body(
                json!([msg("user", CHATS[i % CHATS.len()])]),
                sizes.chat_tokens,
            ),
        )?],
        "extraction" => vec![chat(
            http,
            base,
            &body(
                json!([
                    msg(
                        "system",
                        "Extract the person as JSON with name, city and age."
                    ),
                    msg("user", PEOPLE[i % PEOPLE.len()])
                ]),
                if cell.grammar {
                    sizes.extract_tokens
                } else {
                    sizes.extract_free_tokens
                },
            ),
        )?],
        "copy" => vec![chat(
            http,
            base,
            &body(
                json!([msg(
                    "user",
                    &format!(
                        "Repeat the following text exactly, word for word, but write every \
                         number as digits:\n\n{}",
                        COPY_TEXTS[i % COPY_TEXTS.len()]
                    )
                )]),
                sizes.copy_tokens,
            ),
        )?],
        "long" => vec![chat(
            http,
            base,
            &body(
                json!([msg(
                    "user",
                    "Write a detailed essay about the history of bread, from the first \
                     grains to modern bakeries."
                )]),
                sizes.long_tokens,
            ),
        )?],
        "agent" => {
            let mut messages =
                vec![
                msg(
                    "system",
                    "You are an agent. Call tools by writing the tool name, then use the results.",
                ),
                msg("user", "Find the weather in Paris and suggest what to wear."),
            ];
            let mut out = Vec::new();
            for turn in 0..sizes.agent_turns {
                let ex = chat(http, base, &body(json!(messages), sizes.agent_tokens))?;
                messages.push(msg("assistant", &ex.text));
                messages.push(msg(
                    "user",
                    &format!("Tool result {turn}: 14 C, light rain, wind 20 km/h."),
                ));
                out.push(ex);
            }
            out
        }
        other => bail!("unknown workload {other}"),
    })
}

pub const WORKLOADS: &[&str] = &["chat", "extraction", "copy", "long", "agent"];

/// One phase (cold or warm) of one cell.
#[derive(Clone, Debug, serde::Serialize)]
struct PhaseResult {
    phase: &'static str,
    started_unix: f64,
    finished_unix: f64,
    workloads: BTreeMap<String, WorkloadResult>,
    aggregate_tok_s: f64,
    ttft_p50_s: f64,
    ttft_p95_s: f64,
    stream_tok_s_p50: f64,
    /// Drafted tokens the model kept (spec cells), from `/stats`.
    acceptance: Option<f64>,
    cache_hit_rate: f64,
    schema_valid: usize,
    schema_invalid: usize,
    schema_truncated: usize,
    peak_rss_bytes: Option<u64>,
}

#[derive(Clone, Debug, serde::Serialize)]
struct CellResult {
    cell: String,
    /// Which run of the cell list (`--rounds`), from 0.
    round: usize,
    serve_args: Vec<String>,
    ok: bool,
    error: Option<String>,
    phases: Vec<PhaseResult>,
    /// Decode tok/s of this grammar cell over its no-grammar twin, per phase.
    grammar_overhead: Option<f64>,
    run_ids: Vec<i64>,
}

fn stat(v: &Value, path: &[&str]) -> f64 {
    path.iter().fold(v, |v, k| &v[*k]).as_f64().unwrap_or(0.0)
}

/// What one cell's phases run.
struct Plan<'a> {
    sizes: Sizes,
    workloads: Vec<&'static str>,
    validator: &'a jsonschema::Validator,
}

fn run_phase(
    http: &reqwest::blocking::Client,
    server: &Server,
    cell: &Cell,
    plan: &Plan<'_>,
    phase: &'static str,
) -> Result<PhaseResult> {
    let (sizes, validator) = (&plan.sizes, plan.validator);
    let started_unix = unix_now();
    let before = server.stats(http)?;
    let mut workloads = BTreeMap::new();
    for w in plan.workloads.iter().copied() {
        let r = run_workload(http, &server.base, w, cell, sizes, validator)
            .with_context(|| format!("workload {w}"))?;
        workloads.insert(w.to_string(), r);
    }
    let after = server.stats(http)?;
    let delta = |p: &[&str]| stat(&after, p) - stat(&before, p);
    let hits = delta(&["prompt_cache", "hits"]);
    let misses = delta(&["prompt_cache", "misses"]);
    let drafted = delta(&["speculative", "drafted_tokens"]);
    let accepted = delta(&["speculative", "accepted_tokens"]);
    let all = || workloads.values();
    let ttft: Vec<f64> = all().flat_map(|w| w.ttft_s.clone()).collect();
    let streams: Vec<f64> = all().flat_map(|w| w.stream_tok_s.clone()).collect();
    let tokens: u64 = all().map(|w| w.completion_tokens).sum();
    let wall: f64 = all().map(|w| w.wall_s).sum();
    if cell.spec() {
        // A drafting server drafts for every request: as rows of the batch,
        // or on the speculative lane when it does not batch.
        let requests: usize = all().map(|w| w.requests).sum();
        let speculated: usize = all().map(|w| w.speculated).sum();
        if speculated != requests || drafted <= 0.0 {
            bail!(
                "routing: {speculated} of {requests} requests decoded speculatively \
                 ({drafted} tokens drafted); every request of a drafting server must"
            );
        }
    }
    if cell.batch {
        let outside = &after["batch"]["requests_outside_batch"];
        if outside.as_object().is_some_and(|o| !o.is_empty()) {
            bail!("routing: requests ran outside the batch: {outside}");
        }
    }
    Ok(PhaseResult {
        phase,
        started_unix,
        finished_unix: unix_now(),
        aggregate_tok_s: tokens as f64 / wall.max(1e-9),
        ttft_p50_s: percentile(&ttft, 0.5),
        ttft_p95_s: percentile(&ttft, 0.95),
        stream_tok_s_p50: percentile(&streams, 0.5),
        acceptance: (drafted > 0.0).then(|| accepted / drafted),
        cache_hit_rate: if hits + misses > 0.0 {
            hits / (hits + misses)
        } else {
            0.0
        },
        schema_valid: all().map(|w| w.schema_valid).sum(),
        schema_invalid: all().map(|w| w.schema_invalid).sum(),
        schema_truncated: all().map(|w| w.schema_truncated).sum(),
        peak_rss_bytes: server.peak_rss(),
        workloads,
    })
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn serve_args(cell: &Cell, model: &str, draft: &str) -> Vec<String> {
    let mut a: Vec<String> = ["--port", "0", "--log-level", "warn", "--model", model]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let concurrency = if cell.batch { "4" } else { "1" };
    a.extend(["--decode-concurrency".into(), concurrency.into()]);
    match cell.draft {
        Draft::None => {}
        Draft::Ngram => a.extend(["--draft-model".into(), "ngram".into()]),
        Draft::Model => a.extend(["--draft-model".into(), draft.to_string()]),
    }
    if cell.kv8 {
        a.extend(["--kv-bits", "8", "--quantized-kv-start", "0"].map(String::from));
    }
    // Extra serve flags for every cell (whitespace-separated).
    if let Ok(extra) = std::env::var("MLX_BUN_FEATURE_MATRIX_SERVE_ARGS") {
        a.extend(extra.split_whitespace().map(String::from));
    }
    a
}

fn run_cell(
    http: &reqwest::blocking::Client,
    cell: &Cell,
    args: &[String],
    plan: &Plan<'_>,
    timeout: Duration,
) -> (Vec<PhaseResult>, Option<String>) {
    let server = match Server::start(args, timeout) {
        Ok(s) => s,
        Err(e) => return (Vec::new(), Some(format!("the server did not start: {e}"))),
    };
    let mut phases = Vec::new();
    for phase in ["cold", "warm"] {
        match run_phase(http, &server, cell, plan, phase) {
            Ok(p) => phases.push(p),
            Err(e) => {
                let tail = server.stderr.lock().unwrap().clone();
                let tail: String = tail
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                return (
                    phases,
                    Some(format!("{phase} phase: {e:#}\nserver stderr:\n{tail}")),
                );
            }
        }
    }
    (phases, None)
}

fn record(
    db: &EvalDb,
    meta: &RunMeta,
    model: &str,
    smoke: bool,
    sizes: &Sizes,
    res: &CellResult,
) -> Result<Vec<i64>> {
    let mut ids = Vec::new();
    let phases: Vec<Option<&PhaseResult>> = if res.phases.is_empty() {
        vec![None]
    } else {
        res.phases.iter().map(Some).collect()
    };
    for p in phases {
        let label = format!(
            "feature-matrix/{}/{}",
            res.cell,
            p.map(|p| p.phase).unwrap_or("cold")
        );
        let flags = json!({"cell": res.cell, "serve_args": res.serve_args, "smoke": smoke,
                           "sizes": sizes, "round": res.round});
        let id = db.start_run_with("bench", Some(&label), model, &flags, meta)?;
        ids.push(id);
        let Some(p) = p else {
            db.finish_run(id, "failed", &json!({"error": res.error}))?;
            continue;
        };
        let m = |name: &'static str, value: f64, unit: &'static str, hib: Option<bool>| Metric {
            name,
            value,
            unit,
            higher_is_better: hib,
        };
        let mut metrics = vec![
            m("aggregate_tok_s", p.aggregate_tok_s, "tok/s", Some(true)),
            m("ttft_p50_s", p.ttft_p50_s, "s", Some(false)),
            m("ttft_p95_s", p.ttft_p95_s, "s", Some(false)),
            m("cache_hit_rate", p.cache_hit_rate, "", Some(true)),
            m("schema_invalid", p.schema_invalid as f64, "", Some(false)),
        ];
        if let Some(a) = p.acceptance {
            metrics.push(m("acceptance", a, "", Some(true)));
        }
        if let Some(rss) = p.peak_rss_bytes {
            metrics.push(m("peak_rss_bytes", rss as f64, "bytes", Some(false)));
        }
        db.record_metrics(id, &metrics)?;
        // Every stream is one sample: `evals compare` sees the noise.
        for w in p.workloads.values() {
            for &t in &w.stream_tok_s {
                db.record_metrics(id, &[m("stream_tok_s", t, "tok/s", Some(true))])?;
            }
        }
        let status = if res.ok { "done" } else { "failed" };
        db.finish_run(id, status, &serde_json::to_value(p)?)?;
        db.set_times(id, p.started_unix, p.finished_unix)?;
    }
    Ok(ids)
}

pub fn run(args: Args) -> Result<()> {
    let model_dir = crate::model_arg::resolve(args.model.as_deref())?;
    let model = model_dir.display().to_string();
    let draft = match &args.draft_model {
        Some(d) => crate::model_arg::resolve(Some(d))?.display().to_string(),
        None => model.clone(),
    };
    let cells: Vec<Cell> = match &args.cells {
        None => CELLS.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                CELLS
                    .iter()
                    .find(|c| c.name == n)
                    .copied()
                    .with_context(|| {
                        let all: Vec<_> = CELLS.iter().map(|c| c.name).collect();
                        format!("unknown cell {n:?}; cells: {}", all.join(", "))
                    })
            })
            .collect::<Result<_>>()?,
    };
    let sizes = Sizes::new(args.smoke);
    let workloads: Vec<&'static str> = match &args.workloads {
        None => WORKLOADS.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                WORKLOADS
                    .iter()
                    .find(|w| *w == n)
                    .copied()
                    .with_context(|| {
                        format!(
                            "unknown workload {n:?}; workloads: {}",
                            WORKLOADS.join(", ")
                        )
                    })
            })
            .collect::<Result<_>>()?,
    };
    let db_path = args
        .db
        .clone()
        .unwrap_or_else(mlx_bun::evaldb::default_path);
    let db = EvalDb::open(&db_path)?;
    let meta = RunMeta::detect(Some(&model_dir));
    let validator = jsonschema::validator_for(&extraction_schema())
        .map_err(|e| anyhow::anyhow!("the extraction schema: {e}"))?;
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(1800))
        .build()?;
    let timeout = Duration::from_secs(args.ready_timeout);
    let plan = Plan {
        sizes,
        workloads,
        validator: &validator,
    };

    let bar = crate::progress::bar(
        "feature-matrix [{bar:20}] {pos}/{len} {msg}",
        (cells.len() * args.rounds) as u64,
        true,
    );
    let mut results: Vec<CellResult> = Vec::new();
    let runs: Vec<(usize, &Cell)> = (0..args.rounds)
        .flat_map(|round| cells.iter().map(move |c| (round, c)))
        .collect();
    for &(round, cell) in &runs {
        bar.set_message(cell.name);
        let serve_args = serve_args(cell, &model, &draft);
        let (phases, error) = run_cell(&http, cell, &serve_args, &plan, timeout);
        let mut res = CellResult {
            cell: cell.name.to_string(),
            round,
            serve_args,
            ok: error.is_none(),
            error,
            phases,
            grammar_overhead: None,
            run_ids: Vec::new(),
        };
        if let Some(e) = &res.error {
            bar.println(format!("{}: FAILED: {e}", cell.name));
        }
        res.run_ids = record(&db, &meta, &model, args.smoke, &sizes, &res)?;
        results.push(res);
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Grammar overhead: each grammar cell against its no-grammar twin of this round.
    for i in 0..results.len() {
        let Some(twin) = runs[i].1.without_grammar() else {
            continue;
        };
        let round = results[i].round;
        let tps = |r: &CellResult| r.phases.first().map(|p| p.aggregate_tok_s);
        let base = results
            .iter()
            .find(|r| r.cell == twin && r.round == round)
            .and_then(tps);
        if let Some(base) = base {
            if let Some(t) = tps(&results[i]) {
                results[i].grammar_overhead = Some(base / t.max(1e-9));
            }
        }
    }

    let date = crate::bench::today();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let stem = format!(
        "feature-matrix-{date}{}",
        if args.smoke { "-smoke" } else { "" }
    );
    let png = args.out.join(format!("{stem}.png"));
    let md = args.out.join(format!("{stem}.md"));
    super::plot::feature_matrix(&png, &plot_rows(&results))?;
    let report = markdown(&results, &meta, &model, &sizes, args.smoke, &date, &png);
    std::fs::write(&md, report).with_context(|| format!("writing {}", md.display()))?;

    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", table(&results));
        if args.rounds > 1 {
            print!("{}", summary(&results, &cells));
        }
        println!("report: {}  plot: {}", md.display(), png.display());
        println!("eval database: {}", db.path().display());
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.cell.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("{} cell(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

fn plot_rows(results: &[CellResult]) -> Vec<super::plot::Bar> {
    results
        .iter()
        .map(|r| {
            let get = |ph: &str| {
                r.phases
                    .iter()
                    .find(|p| p.phase == ph)
                    .map(|p| p.aggregate_tok_s)
            };
            super::plot::Bar {
                label: r.cell.clone(),
                cold: get("cold"),
                warm: get("warm"),
            }
        })
        .collect()
}

/// Median, smallest and largest of `xs`.
fn spread(xs: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    Some((median, v[0], v[v.len() - 1]))
}

/// Each cell's warm-phase medians over the rounds, with their range.
fn summary(results: &[CellResult], cells: &[Cell]) -> String {
    let mut out = format!(
        "\nwarm phase over {} rounds: median [min-max]\n{:<20} {:>24} {:>24} {:>8}\n",
        results.iter().map(|r| r.round + 1).max().unwrap_or(0),
        "cell",
        "agg tok/s",
        "copy tok/s",
        "accept"
    );
    let show = |s: Option<(f64, f64, f64)>| match s {
        Some((m, lo, hi)) => format!("{m:.2} [{lo:.2}-{hi:.2}]"),
        None => "-".into(),
    };
    for cell in cells {
        let warm: Vec<&PhaseResult> = results
            .iter()
            .filter(|r| r.cell == cell.name)
            .filter_map(|r| r.phases.iter().find(|p| p.phase == "warm"))
            .collect();
        let agg: Vec<f64> = warm.iter().map(|p| p.aggregate_tok_s).collect();
        let copy: Vec<f64> = warm
            .iter()
            .filter_map(|p| p.workloads.get("copy").map(|w| w.aggregate_tok_s))
            .collect();
        let accept: Vec<f64> = warm.iter().filter_map(|p| p.acceptance).collect();
        out += &format!(
            "{:<20} {:>24} {:>24} {:>8}\n",
            cell.name,
            show(spread(&agg)),
            show(spread(&copy)),
            spread(&accept).map_or("-".into(), |(m, _, _)| format!("{m:.2}"))
        );
    }
    out
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

fn table(results: &[CellResult]) -> String {
    let mut out = format!(
        "{:<20} {:<5} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>9}  status\n",
        "cell",
        "phase",
        "agg tok/s",
        "p50 tok/s",
        "ttft p50",
        "ttft p95",
        "accept",
        "cache",
        "schema",
        "rss MiB"
    );
    for r in results {
        if r.phases.is_empty() {
            out += &format!("{:<20} {:<5} {:>9}  FAILED\n", r.cell, "-", "-");
        }
        for p in &r.phases {
            out += &format!(
                "{:<20} {:<5} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>9}  {}\n",
                r.cell,
                p.phase,
                fmt(Some(p.aggregate_tok_s), 2),
                fmt(Some(p.stream_tok_s_p50), 2),
                fmt(Some(p.ttft_p50_s), 2),
                fmt(Some(p.ttft_p95_s), 2),
                fmt(p.acceptance, 2),
                fmt(Some(p.cache_hit_rate), 2),
                format!("{}/{}", p.schema_valid, p.schema_valid + p.schema_invalid),
                fmt(p.peak_rss_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 0),
                if r.ok { "ok" } else { "FAILED" }
            );
        }
    }
    out
}

fn markdown(
    results: &[CellResult],
    meta: &RunMeta,
    model: &str,
    sizes: &Sizes,
    smoke: bool,
    date: &str,
    png: &Path,
) -> String {
    let mut md = format!(
        "# Feature matrix, {date}{}\n\n\
         `mlx-bun bench feature-matrix{}` on host `{}`, commit `{}`, model `{}` \
         (fingerprint `{}`).\n\n\
         Token budgets: chat {}, extraction {} ({} without grammar), copy {}, long-form {}, \
         agent {} × {} turns; \
         {} request(s) per workload per stream, {} concurrent streams in batch cells.\n\n",
        if smoke { " (smoke)" } else { "" },
        if smoke { " --smoke" } else { "" },
        meta.host.as_deref().unwrap_or("?"),
        meta.git_commit.as_deref().unwrap_or("?"),
        model,
        meta.model_fingerprint.as_deref().unwrap_or("?"),
        sizes.chat_tokens,
        sizes.extract_tokens,
        sizes.extract_free_tokens,
        sizes.copy_tokens,
        sizes.long_tokens,
        sizes.agent_tokens,
        sizes.agent_turns,
        sizes.requests,
        sizes.streams,
    );
    md += &format!(
        "![aggregate tok/s per cell]({})\n\n",
        png.file_name().unwrap_or_default().to_string_lossy()
    );
    md += "| cell | phase | aggregate tok/s | copy tok/s | per-stream tok/s p50 | TTFT p50 s | \
           TTFT p95 s | acceptance | grammar overhead | schema valid | cache hit rate | \
           peak RSS MiB | eval run |\n\
           |---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in results {
        for (i, p) in r.phases.iter().enumerate() {
            md += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} | {} | {} |\n",
                r.cell,
                p.phase,
                fmt(Some(p.aggregate_tok_s), 2),
                fmt(p.workloads.get("copy").map(|w| w.aggregate_tok_s), 2),
                fmt(Some(p.stream_tok_s_p50), 2),
                fmt(Some(p.ttft_p50_s), 3),
                fmt(Some(p.ttft_p95_s), 3),
                fmt(p.acceptance, 2),
                if i == 0 {
                    fmt(r.grammar_overhead, 2).replace('-', "")
                } else {
                    String::new()
                },
                p.schema_valid,
                p.schema_valid + p.schema_invalid,
                fmt(Some(p.cache_hit_rate), 2),
                fmt(p.peak_rss_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 0),
                r.run_ids.get(i).map(|i| i.to_string()).unwrap_or_default(),
            );
        }
    }
    let failed: Vec<&CellResult> = results.iter().filter(|r| !r.ok).collect();
    if !failed.is_empty() {
        md += "\n## Failed cells\n\n";
        for r in failed {
            md += &format!(
                "### {}\n\n`mlx-bun serve {}`\n\n```\n{}\n```\n\n",
                r.cell,
                r.serve_args.join(" "),
                r.error.as_deref().unwrap_or("").trim()
            );
        }
    }
    md += "\nCopy tok/s is the aggregate of the copy workload alone (repeating a given \
           text with one edit), where prompt-lookup drafting pays. \
           Grammar overhead is the no-grammar twin's aggregate tok/s over this cell's \
           (cold phase, same run): 1.00 means free. The schema column counts complete \
           extraction outputs that validate against the schema (grammar cells only).\n";
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_cells_have_twins() {
        let twin = |n: &str| {
            CELLS
                .iter()
                .find(|c| c.name == n)
                .unwrap()
                .without_grammar()
        };
        assert_eq!(twin("serial+grammar"), Some("serial"));
        assert_eq!(twin("batch4+grammar"), Some("batch4"));
        assert_eq!(twin("batch4+grammar+spec"), Some("batch4+spec"));
        assert_eq!(twin("serial+grammar+spec"), None);
        assert_eq!(twin("serial"), None);
    }

    #[test]
    fn percentiles() {
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.95), 4.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
