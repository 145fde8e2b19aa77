//! `--kv-bits` rows decoded in one batch (the quantized batch cache,
//! `src/cache/batch_quantized.rs`): rows of different lengths, joining while
//! others decode, give the greedy tokens they give alone with a
//! `QuantizedCache`; a start between the rows' lengths follows the batch's
//! rule (docs/batching.md); and `serve --kv-bits 8` batches its clients and
//! answers each as `generate --kv-bits 8` does alone.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::server::Server;
use mlx_bun::cache::{KvCache, KvQuantization};
use mlx_bun::chat_template::Message;
use mlx_bun::decode::generate;
use mlx_bun::decode::{BatchLimits, BatchScheduler, Row};
use mlx_bun::generate::{GenerateOptions, DEFAULT_PREFILL_STEP};
use mlx_bun::model::Model;
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::speculative::NgramDrafter;
use mlx_bun::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// MLX work in one process runs one test at a time; the server test too,
/// so that timings stay predictable on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

const MAX_TOKENS: usize = 12;

/// User messages of clearly different lengths.
const QUESTIONS: [&str; 4] = [
    "Name a fruit.",
    "Tell me a short story about a cat who learns to sail across a wide and stormy sea.",
    "Why is the sky blue?",
    "List three facts about the moon, the tides it causes on our oceans, and how far away it \
     is from the Earth, in simple words for a child who is eight years old.",
];

fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    QUESTIONS
        .iter()
        .map(|q| {
            let messages: Vec<Message> =
                serde_json::from_value(json!([{"role": "user", "content": q}])).unwrap();
            build_prompt(tok, &PromptInput::Messages(messages))
                .unwrap()
                .1
        })
        .collect()
}

fn opts(prefill_step: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: MAX_TOKENS,
        prefill_step,
        ..GenerateOptions::default()
    }
}

fn caches(model: &Model, q: KvQuantization) -> Vec<Box<dyn KvCache>> {
    model.decoder.make_caches_with(None, Some(q)).unwrap()
}

/// `prompt` decoded alone (the serial path) with a quantized cache.
fn alone(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    q: KvQuantization,
    o: &GenerateOptions,
) -> Vec<u32> {
    let mut c = caches(model, q);
    generate(model, tok, &mut c, prompt, o, None, &mut |_| true)
        .unwrap()
        .token_ids
}

/// When rows join: `first` inserted at once, `later` after `join_after`
/// steps (while the first decode).
struct Joins<'s> {
    first: &'s [usize],
    later: &'s [usize],
    join_after: usize,
}

/// The rows joining as `joins` says; each row's tokens, and the most rows
/// that decoded together.
fn batched<'a>(
    model: &'a Model,
    tok: &'a Tokenizer,
    prompts: &[Vec<u32>],
    q: KvQuantization,
    o: &GenerateOptions,
    joins: Joins<'_>,
) -> (Vec<Option<Vec<u32>>>, usize) {
    let Joins {
        first,
        later,
        join_after,
    } = joins;
    let limits = BatchLimits {
        prefill_step: o.prefill_step,
        // Every row verifies its `k` drafts, so rejected positions are trimmed
        // whatever this machine's step times.
        measured_draft_width: false,
        ..BatchLimits::default()
    };
    let mut sched = BatchScheduler::new(model, limits);
    let insert = |sched: &mut BatchScheduler<'a>, i: usize| {
        let row = Row::new(
            model,
            tok,
            prompts[i].clone(),
            0,
            o,
            None,
            Box::new(|_| true),
        )
        .unwrap();
        sched.insert(i as u64, row, caches(model, q));
    };
    for &i in first {
        insert(&mut sched, i);
    }
    let mut tokens = vec![None; prompts.len()];
    let (mut steps, mut most) = (0, 0);
    let mut joined = later.is_empty();
    while !sched.is_idle() || !joined {
        if !joined && steps == join_after {
            assert!(sched.decoding() > 0, "later rows join while others decode");
            for &i in later {
                insert(&mut sched, i);
            }
            joined = true;
        }
        for f in sched.step().unwrap() {
            tokens[f.id as usize] = Some(f.result.token_ids);
        }
        most = most.max(sched.decoding());
        steps += 1;
    }
    (tokens, most)
}

fn load() -> (Model, Tokenizer) {
    let dir = common::model_dir();
    (Model::load(&dir).unwrap(), Tokenizer::load(&dir).unwrap())
}

/// Quantized from the first token (`--quantized-kv-start 0`): two rows
/// start, two of other lengths join three steps later; every row equals
/// itself alone, at 8 and 4 bits. The 4-bit case prefills in chunks of 16,
/// so its rows join with caches that already converted to quantized ones.
#[test]
fn rows_quantized_from_the_start_equal_running_alone() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (model, tok) = load();
    let prompts = prompts(&tok);
    for (bits, step) in [(8, DEFAULT_PREFILL_STEP), (4, 16)] {
        let q = KvQuantization {
            bits,
            group_size: 64,
            start: 0,
        };
        let o = opts(step);
        let (got, most) = batched(
            &model,
            &tok,
            &prompts,
            q,
            &o,
            Joins {
                first: &[0, 1],
                later: &[2, 3],
                join_after: 3,
            },
        );
        assert!(
            most >= 3,
            "{bits} bits: at most {most} rows decoded together"
        );
        for (i, p) in prompts.iter().enumerate() {
            let want = alone(&model, &tok, p, q, &o);
            assert_eq!(
                got[i].as_ref().expect("every row finishes"),
                &want,
                "{bits} bits, row {i} ({} prompt tokens) differs from running alone",
                p.len()
            );
        }
    }
}

/// The batch's rule: dense while every row is below the start (each row
/// equals itself alone, dense), quantized for every row once one reaches it
/// (the row past the start equals itself alone; the row below it equals
/// itself alone quantized from its first decoded token, start 0).
#[test]
fn a_start_between_the_rows_quantizes_every_row() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (model, tok) = load();
    let prompts = prompts(&tok);
    let (short, long) = (0, 3);
    let (ls, ll) = (prompts[short].len(), prompts[long].len());
    assert!(
        ls + MAX_TOKENS + 2 <= ll,
        "the prompts are {ls} and {ll} tokens"
    );
    let o = opts(DEFAULT_PREFILL_STEP);
    let q = |start| KvQuantization {
        bits: 4,
        group_size: 64,
        start,
    };

    // Every row below the start throughout: the dense batch.
    let high = q(ll + MAX_TOKENS + 1);
    let (got, most) = batched(
        &model,
        &tok,
        &prompts,
        high,
        &o,
        Joins {
            first: &[0, 1, 2, 3],
            later: &[],
            join_after: 0,
        },
    );
    assert_eq!(most, 4);
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[i].as_ref().unwrap(),
            &alone(&model, &tok, p, high, &o),
            "row {i} below the start differs from running alone"
        );
    }

    // The long row is past the start when it joins, the short one never
    // reaches it alone.
    let between = q(ls + MAX_TOKENS + 1);
    let (got, most) = batched(
        &model,
        &tok,
        &prompts,
        between,
        &o,
        Joins {
            first: &[short, long],
            later: &[],
            join_after: 0,
        },
    );
    assert_eq!(most, 2);
    assert_eq!(
        got[long].as_ref().unwrap(),
        &alone(&model, &tok, &prompts[long], between, &o),
        "the row past the start differs from running alone"
    );
    assert_eq!(
        got[short].as_ref().unwrap(),
        &alone(&model, &tok, &prompts[short], q(0), &o),
        "the row below the start is not quantized from its first decoded token"
    );
}

/// Rows drafting by prompt lookup in a quantized batch drop their own
/// rejected drafts (holes in the quantized rows): every row still equals
/// plain greedy decoding alone with a quantized cache.
#[test]
fn drafting_rows_in_a_quantized_batch_equal_plain_decoding_alone() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (model, tok) = load();
    let copy: Vec<Message> = serde_json::from_value(json!([{"role": "user", "content":
        "Copy this list exactly, one item per line: apples, pears, plums, cherries, grapes."}]))
    .unwrap();
    let mut prompts = prompts(&tok);
    prompts.push(build_prompt(&tok, &PromptInput::Messages(copy)).unwrap().1);
    let q = KvQuantization {
        bits: 4,
        group_size: 64,
        start: 0,
    };
    let o = GenerateOptions {
        max_tokens: 24,
        ..GenerateOptions::default()
    };
    let mut sched = BatchScheduler::new(&model, BatchLimits::default());
    for (i, p) in prompts.iter().enumerate().skip(1) {
        let mut row = Row::new(&model, &tok, p.clone(), 0, &o, None, Box::new(|_| true)).unwrap();
        if i % 2 == 0 {
            row = row.with_drafter(Box::new(NgramDrafter::default()), 3);
        }
        sched.insert(i as u64, row, caches(&model, q));
    }
    let mut results = vec![None; prompts.len()];
    while !sched.is_idle() {
        for f in sched.step().unwrap() {
            results[f.id as usize] = Some(f.result);
        }
    }
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts.iter().enumerate().skip(1) {
        let got = results[i].take().unwrap();
        assert_eq!(
            got.token_ids,
            alone(&model, &tok, p, q, &o),
            "row {i} differs from plain decoding alone"
        );
        if let Some(s) = got.speculation {
            drafted += s.drafted;
            accepted += s.accepted;
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "some drafts are accepted, some rejected: {accepted}/{drafted}"
    );
}

/// `serve --kv-bits 8 --quantized-kv-start 0` with four concurrent clients
/// (two streamed, two not), prefilling as `generate` does: each answer
/// equals `generate` with the same flags alone, and `/stats` saw rows
/// decoding together.
#[test]
fn serve_with_kv_bits_batches_and_equals_generate() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::model_dir();
    let kv = ["--kv-bits", "8", "--quantized-kv-start", "0"];
    let n = 24;
    // Prompts prefill in one chunk, as `generate` does: chunks timed to the
    // machine's speed put boundaries where a loaded machine's rounding can
    // flip a near-tie.
    let mut flags = kv.to_vec();
    flags.extend(["--prefill-step-size", "2048"]);
    let server = Server::start(&dir, &flags);
    let client = || {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap()
    };

    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (watching, url) = (watching.clone(), server.url("/stats"));
        std::thread::spawn(move || {
            let mut most = 0;
            while watching.load(Ordering::Relaxed) {
                if let Ok(r) = client().get(&url).send() {
                    let v: Value = r.json().unwrap();
                    most = most.max(v["batch"]["active_rows"].as_u64().unwrap_or(0));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let clients: Vec<_> = QUESTIONS
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let url = server.url("/v1/chat/completions");
            let streamed = i % 2 == 1;
            let body = json!({
                "messages": [{"role": "user", "content": q}],
                "max_tokens": n,
                "temperature": 0,
                "stream": streamed,
            });
            std::thread::spawn(move || {
                let r = client().post(url).json(&body).send().unwrap();
                assert_eq!(r.status().as_u16(), 200);
                if !streamed {
                    let v: Value = r.json().unwrap();
                    return v["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap()
                        .to_string();
                }
                let text = r.text().unwrap();
                let payloads: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect();
                assert_eq!(payloads.last(), Some(&"[DONE]"), "{text}");
                payloads[..payloads.len() - 1]
                    .iter()
                    .map(|p| serde_json::from_str::<Value>(p).unwrap())
                    .filter_map(|c| {
                        c["choices"][0]["delta"]["content"]
                            .as_str()
                            .map(String::from)
                    })
                    .collect()
            })
        })
        .collect();
    let answers: Vec<String> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    watching.store(false, Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert!(
        most >= 2,
        "requests never decoded together (at most {most} rows): {}",
        server.log_text()
    );

    let n = n.to_string();
    for (&q, answer) in QUESTIONS.iter().zip(&answers) {
        let mut args = vec![
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            q,
            "-n",
            n.as_str(),
            "--json",
        ];
        args.extend(kv);
        let cli: Value = serde_json::from_slice(&common::run_ok(&args).stdout).unwrap();
        assert_eq!(
            answer,
            cli["text"].as_str().unwrap(),
            "the served answer to {q:?} differs from generate alone"
        );
    }
}
