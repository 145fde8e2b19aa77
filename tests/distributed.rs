//! Two ranks over MLX's ring backend on loopback: the sharded model's greedy
//! tokens equal the single process's (tensor and pipeline parallel), each
//! rank holds only its share of the weights, and one failing rank stops the
//! others with its error. A sharded `serve` answers as a single process
//! does (both APIs, streaming or not, two requests at once, a client that
//! leaves), and stopping its launcher stops every rank.

mod common;

use std::time::{Duration, Instant};

use common::server::Server;
use common::{bin, float32_model, model_dir};
use serde_json::{json, Value};

const PROMPT: &str = "Write a haiku about the sea";

fn generate(model: &std::path::Path, launch: Option<&[&str]>, extra: &[&str]) -> Value {
    generate_with_env(model, launch, extra, &[])
}

fn generate_with_env(
    model: &std::path::Path,
    launch: Option<&[&str]>,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let mut cmd = bin();
    if let Some(extra) = launch {
        cmd.args(["launch", "-n", "2", "--backend", "ring", "--"]);
        cmd.arg("generate");
        cmd.args(extra);
    } else {
        cmd.arg("generate");
        cmd.args(extra);
    }
    cmd.args(["--model", model.to_str().unwrap(), "--prompt", PROMPT])
        .args(["--max-tokens", "8", "--temp", "0", "--json"])
        .envs(env.iter().copied());
    let out = cmd.output().expect("running mlx-bun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    // Only rank 0 prints: exactly one JSON line.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "expected one JSON line, got {stdout:?}");
    serde_json::from_str(lines[0]).unwrap()
}

fn check_sharded(model: &std::path::Path, flags: &[&str]) {
    // Flags after --pipeline apply to the single process too.
    let shared: Vec<&str> = flags
        .iter()
        .copied()
        .filter(|f| *f != "--pipeline")
        .collect();
    let single = generate(model, None, &shared);
    let sharded = generate(model, Some(flags), &[]);
    assert_eq!(single["generation_tokens"], 8);
    assert_eq!(sharded["token_ids"], single["token_ids"], "{flags:?}");
    assert_eq!(sharded["text"], single["text"], "{flags:?}");
    // Rank 0 read only its share: its peak memory is well below the
    // single process's, which holds every weight.
    let peak = |v: &Value| v["peak_memory_bytes"].as_f64().unwrap();
    assert!(
        peak(&sharded) < 0.8 * peak(&single),
        "{flags:?}: rank 0 peak {} vs single {}",
        peak(&sharded),
        peak(&single)
    );
}

#[test]
fn tensor_parallel_float32_matches_single_process() {
    check_sharded(&float32_model(), &[]);
}

#[test]
fn pipeline_parallel_float32_matches_single_process() {
    check_sharded(&float32_model(), &["--pipeline"]);
}

#[test]
fn pipeline_parallel_by_all_sum_matches_single_process() {
    // The hand-over GPUs use (MLX's CUDA backend has no send/recv), forced
    // on the CPU ring; the ranks inherit the launcher's environment.
    let model = model_dir();
    let single = generate(&model, None, &[]);
    let env = [("MLX_BUN_PIPELINE_ALL_SUM", "1")];
    let sharded = generate_with_env(&model, Some(&["--pipeline"]), &[], &env);
    assert_eq!(single["generation_tokens"], 8);
    assert_eq!(sharded["token_ids"], single["token_ids"]);
}

#[test]
fn tensor_parallel_quantized_matches_single_process() {
    // 4-bit weights: packed columns, scales and biases split along groups.
    check_sharded(&model_dir(), &[]);
}

#[test]
fn speculative_with_a_sharded_target_matches_single_process() {
    // The draft (4-bit) runs whole on every rank; the float32 target is sharded.
    let draft = model_dir();
    let draft = draft.to_str().unwrap();
    check_sharded(
        &float32_model(),
        &["--draft-model", draft, "--num-draft-tokens", "3"],
    );
}

#[test]
fn a_failing_rank_stops_the_others_with_its_error() {
    let start = Instant::now();
    let out = bin()
        .args(["launch", "-n", "2", "--", "/bin/sh", "-c"])
        .arg(r#"if [ "$MLX_RANK" = 1 ]; then echo "error: boom on rank one" >&2; exit 3; fi; sleep 60"#)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: rank 1 failed (exit status: 3): boom on rank one"),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "rank 0 was not stopped"
    );
}

#[test]
fn sharded_refusals_name_the_flag() {
    let out = bin()
        .args(["launch", "-n", "2", "--", "generate", "--prompt", "hi"])
        .args(["--adapter-path", "adapters", "--max-tokens", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--adapter-path is not supported when the model is sharded"),
        "{stderr}"
    );
    let out = bin()
        .args(["launch", "-n", "2", "--", "serve", "--kv-bits", "8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--kv-bits is not supported when the model is sharded"),
        "{stderr}"
    );
}

/// `generate` on a tiny checkpoint of goldens/arch, by one process or by
/// two ranks: its greedy token ids, or its standard error when it failed.
fn tiny_tokens(model: &std::path::Path, launch: bool, flags: &[&str]) -> Result<Value, String> {
    let mut cmd = bin();
    if launch {
        cmd.args(LAUNCH);
    }
    cmd.arg("generate")
        .args([
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "t1 t2 t3 t4",
        ])
        .args([
            "--max-tokens",
            "8",
            "--temp",
            "0",
            "--ignore-chat-template",
            "--json",
        ])
        .args(flags);
    let out = cmd.output().expect("running mlx-bun");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "expected one JSON line, got {stdout:?}");
    let v: Value = serde_json::from_str(lines[0]).unwrap();
    Ok(v["token_ids"].clone())
}

/// Each `modes` (flags of `generate`) on two ranks gives the single
/// process's tokens for `model`; tokens only (the checkpoints are tiny).
fn check_tiny_sharded(model: &std::path::Path, modes: &[&[&str]]) {
    let single = tiny_tokens(model, false, &[]).unwrap();
    assert_eq!(single.as_array().map(Vec::len), Some(8), "{model:?}");
    for flags in modes {
        let sharded = tiny_tokens(model, true, flags)
            .unwrap_or_else(|e| panic!("{model:?} {flags:?} failed: {e}"));
        assert_eq!(sharded, single, "{model:?} {flags:?}");
    }
}

/// Two ranks refuse `model` under `flags` with an error containing `reason`.
fn check_tiny_refused(model: &std::path::Path, flags: &[&str], reason: &str) {
    let err = tiny_tokens(model, true, flags).expect_err("sharding should be refused");
    assert!(err.contains(reason), "{model:?} {flags:?}: {err}");
}

const BOTH_SPLITS: [&[&str]; 2] = [&[], &["--pipeline"]];

#[test]
fn dense_families_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // Gemma's sandwich norms and soft-capping, Phi-3's fused q/k/v and
    // gate/up (dense and 4-bit), Llama 4's `feed_forward`, biases, NoPE
    // layers, scaled residuals, post-norm blocks, query scaling.
    for case in [
        "gemma2",
        "gemma3_text",
        "phi3",
        "phi3_q4",
        "llama4_text",
        "smollm3",
        "granite",
        "seed_oss_q4",
        "exaone4",
        "ministral3",
    ] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

#[test]
fn mixture_of_experts_families_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // Experts split by intermediate columns (4-bit along whole groups),
    // GPT-OSS's expert biases and attention sinks, GLM-4.5's shared
    // experts and dense first layer.
    for case in [
        "qwen3_moe",
        "mixtral",
        "mixtral_q4",
        "gpt_oss",
        "gpt_oss_q4",
        "glm4_moe",
    ] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

#[test]
fn gated_deltanet_families_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // DeltaNet layers split by key head (Qwen3-Next's grouped projections,
    // Qwen3.5's split ones and their q | k | v convolution channels),
    // attention with an output gate, experts with a gated shared expert.
    for case in ["qwen3_next", "qwen3_5", "qwen3_5_q4", "qwen3_5_moe"] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

#[test]
fn latent_attention_families_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // DeepSeek-V3's latent attention split by query head (through q_lora
    // or a plain q_proj with biases), its shared and routed experts by
    // columns, the grouped sigmoid router whole. (Its 4-bit checkpoint's
    // experts are one quantization group wide: refused below.)
    for case in ["deepseek_v3", "deepseek_v3_plain_q"] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

#[test]
fn short_convolution_families_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // LFM2's convolution split by channel (b, c and x thirds of in_proj,
    // the depthwise kernel, with and without its bias, dense and 4-bit).
    for case in ["lfm2", "lfm2_q4"] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

#[test]
fn norms_over_all_heads_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // OLMo 3's query/key norms over all heads: each rank's sum of squares
    // summed across ranks, dense and 4-bit.
    for case in ["olmo3", "olmo3_q4"] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

#[test]
fn mamba2_families_split_by_tensors_and_layers_match_single_process() {
    let tmp = tempfile::tempdir().unwrap();
    // Nemotron-H's Mamba-2 layers split by group (gate, x, B, C and step
    // sizes of in_proj, the convolution's channels, the per-group gated
    // norm), its ReLU² MLP layers by columns, dense and 4-bit, its experts
    // layers' routed and shared experts by columns (with the latent
    // projections whole and their biases); Granite 4's gated norm over all
    // channels (squares summed across ranks), its experts beside the fused
    // shared MLP, or the fused dense MLP alone.
    for case in [
        "nemotron_h",
        "nemotron_h_q4",
        "nemotron_h_moe",
        "nemotron_h_moe_latent",
        "granitemoehybrid",
        "granitemoehybrid_dense",
    ] {
        check_tiny_sharded(&common::arch_with_tokenizer(case, tmp.path()), &BOTH_SPLITS);
    }
}

/// Rewrites the tiny Granite 4 checkpoint in `dir` (two Mamba-2 groups of
/// state 16, 64 channels) as one with a single group, as published Granite 4
/// models have: the second group's B and C rows of `in_proj` and channels of
/// the convolution are dropped.
fn keep_one_mamba_group(dir: &std::path::Path) {
    let config = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert_eq!(c["mamba_n_groups"], 2);
    c["mamba_n_groups"] = json!(1);
    std::fs::write(&config, c.to_string()).unwrap();
    let (inner, state) = (64, 16);
    // Row ranges of the second group's B and C: in_proj is z | x | B | C | dt,
    // the convolution x | B | C.
    let dropped = |name: &str| -> Vec<std::ops::Range<usize>> {
        let xbc = if name.ends_with("in_proj.weight") {
            inner
        } else {
            0
        };
        let b = xbc + inner;
        vec![b + state..b + 2 * state, b + 3 * state..b + 4 * state]
    };
    rewrite_safetensors(dir, |name, shape, bytes| {
        let mamba = name.contains(".mamba.")
            && (name.ends_with("in_proj.weight") || name.contains("conv1d."));
        if !mamba {
            return None;
        }
        let rows = shape[0] as usize;
        let row_bytes = bytes.len() / rows;
        let gone = dropped(name);
        let kept: Vec<u8> = (0..rows)
            .filter(|r| !gone.iter().any(|g| g.contains(r)))
            .flat_map(|r| bytes[r * row_bytes..(r + 1) * row_bytes].iter().copied())
            .collect();
        let mut shape = shape.to_vec();
        shape[0] = (kept.len() / row_bytes) as u64;
        Some(vec![(name.to_string(), shape, kept)])
    });
}

/// A tensor as written back: its name, shape and bytes.
type Tensor = (String, Vec<u64>, Vec<u8>);

/// Rewrites `dir`'s model.safetensors, replacing each tensor for which
/// `edit(name, shape, bytes)` returns the tensors to store in its place.
fn rewrite_safetensors(
    dir: &std::path::Path,
    edit: impl Fn(&str, &[u64], &[u8]) -> Option<Vec<Tensor>>,
) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let (mut out_header, mut out_data) = (serde_json::Map::new(), Vec::new());
    for (name, info) in &header {
        if name == "__metadata__" {
            continue;
        }
        let [start, end] = [0, 1].map(|i| info["data_offsets"][i].as_u64().unwrap() as usize);
        let shape: Vec<u64> = info["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let tensors = edit(name, &shape, &data[start..end])
            .unwrap_or_else(|| vec![(name.clone(), shape.clone(), data[start..end].to_vec())]);
        for (name, shape, tensor) in tensors {
            let at = out_data.len();
            out_data.extend(tensor);
            let offsets = json!([at, out_data.len()]);
            out_header.insert(
                name,
                json!({"dtype": info["dtype"], "shape": shape, "data_offsets": offsets}),
            );
        }
    }
    let mut header = Value::Object(out_header).to_string().into_bytes();
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(out_data);
    std::fs::write(&path, file).unwrap();
}

#[test]
fn a_single_mamba2_group_splits_by_head() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::arch_with_tokenizer("granitemoehybrid", tmp.path());
    let two_groups = tiny_tokens(&model, false, &[]).unwrap();
    keep_one_mamba_group(&model);
    let one_group = tiny_tokens(&model, false, &[]).unwrap();
    assert_ne!(one_group, two_groups, "the rewrite changed nothing");
    check_tiny_sharded(&model, &BOTH_SPLITS);
}

/// Rewrites `dir`'s model.safetensors with its stacked experts
/// (`…mlp.switch_mlp.{proj}.weight` `[experts, out, in]`) stored one by one
/// as Hugging Face does (`…mlp.experts.{e}.{proj}.weight`).
fn unstack_experts(dir: &std::path::Path) {
    rewrite_safetensors(dir, |name, shape, bytes| {
        let (layer, proj) = name.split_once(".switch_mlp.")?;
        // Nemotron-H's `fc1` and `fc2` are Hugging Face's `up_proj` and `down_proj`.
        let proj = match proj.split_once('.') {
            Some(("fc1", part)) => format!("up_proj.{part}"),
            Some(("fc2", part)) => format!("down_proj.{part}"),
            _ => proj.to_string(),
        };
        let experts = shape[0] as usize;
        let each = bytes.len() / experts;
        let tensors = (0..experts)
            .map(|e| {
                let name = format!("{layer}.experts.{e}.{proj}");
                (
                    name,
                    shape[1..].to_vec(),
                    bytes[e * each..(e + 1) * each].to_vec(),
                )
            })
            .collect();
        Some(tensors)
    });
}

#[test]
fn experts_stored_one_by_one_split_as_stacked_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::arch_with_tokenizer("qwen3_moe", tmp.path());
    let stacked = tiny_tokens(&model, false, &[]).unwrap();
    unstack_experts(&model);
    let header = std::fs::read(model.join("model.safetensors")).unwrap();
    assert!(String::from_utf8_lossy(&header).contains("model.layers.0.mlp.experts.7.down_proj"));
    assert_eq!(tiny_tokens(&model, false, &[]).unwrap(), stacked);
    check_tiny_sharded(&model, &BOTH_SPLITS);
    let model = common::arch_with_tokenizer("nemotron_h_moe", tmp.path());
    let stacked = tiny_tokens(&model, false, &[]).unwrap();
    unstack_experts(&model);
    let header = std::fs::read(model.join("model.safetensors")).unwrap();
    let names = String::from_utf8_lossy(&header);
    assert!(names.contains("backbone.layers.0.mixer.experts.7.down_proj"));
    assert_eq!(tiny_tokens(&model, false, &[]).unwrap(), stacked);
    check_tiny_sharded(&model, &[&[]]);
}

#[test]
fn families_tensor_parallelism_refuses_split_by_layers() {
    let tmp = tempfile::tempdir().unwrap();
    for (case, reason) in [
        (
            "granitemoehybrid_q4",
            "1 quantization group(s) of 32, which cannot be split across 2 ranks",
        ),
        // One quantization group of expert columns cannot be halved.
        (
            "qwen3_moe_q4",
            "1 quantization group(s) of 32, which cannot be split across 2 ranks",
        ),
        (
            "deepseek_v3_q4",
            "1 quantization group(s) of 32, which cannot be split across 2 ranks",
        ),
        (
            "nemotron_h_moe_q4",
            "1 quantization group(s) of 32, which cannot be split across 2 ranks",
        ),
    ] {
        let model = common::arch_with_tokenizer(case, tmp.path());
        check_tiny_refused(&model, &[], reason);
        check_tiny_sharded(&model, &[&["--pipeline"]]);
    }
}

#[test]
fn unsplittable_models_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let gemma4 = common::arch_with_tokenizer("gemma4_text", tmp.path());
    for flags in BOTH_SPLITS {
        check_tiny_refused(&gemma4, flags, "share keys and values across layers");
    }
    // The llama checkpoint read as 2 heads of 32 sharing one KV head.
    let one_kv = common::arch_with_tokenizer("llama", tmp.path());
    let config = one_kv.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["num_attention_heads"] = json!(2);
    c["num_key_value_heads"] = json!(1);
    std::fs::write(&config, c.to_string()).unwrap();
    check_tiny_refused(
        &one_kv,
        &[],
        "1 cannot be split across 2 ranks (use --pipeline)",
    );
    check_tiny_sharded(&one_kv, &[&["--pipeline"]]);
}

const LAUNCH: [&str; 6] = ["launch", "-n", "2", "--backend", "ring", "--"];

/// Greedy requests of a few tokens, over both APIs, streaming and not.
fn requests() -> Vec<(&'static str, Value)> {
    let completion = json!({"prompt": PROMPT, "max_tokens": 5, "temperature": 0});
    let chat = json!({
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 5,
        "temperature": 0,
    });
    let streaming = |mut v: Value| {
        v["stream"] = json!(true);
        v
    };
    // Sampled with a seed: every rank draws from the same key.
    let seeded = json!({"prompt": "Once upon", "max_tokens": 5, "temperature": 0.9, "seed": 5});
    // Structured output: every rank runs the same grammar.
    let mut json_object = chat.clone();
    json_object["response_format"] = json!({"type": "json_object"});
    vec![
        ("/v1/completions", completion.clone()),
        ("/v1/completions", streaming(completion)),
        ("/v1/chat/completions", chat.clone()),
        ("/v1/chat/completions", streaming(chat)),
        ("/v1/completions", seeded),
        ("/v1/chat/completions", json_object),
    ]
}

/// A second prompt, for two requests at once.
fn other_request() -> Value {
    json!({"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0})
}

/// The text `body` produced (streaming: the deltas joined).
fn answer(server: &Server, path: &str, body: &Value) -> String {
    let resp = reqwest::blocking::Client::new()
        .post(server.url(path))
        .json(body)
        .timeout(Duration::from_secs(120))
        .send()
        .expect("sending the request");
    let status = resp.status();
    let text = resp.text().unwrap();
    assert!(status.is_success(), "{path}: {status}: {text}");
    let piece = |choice: &Value| {
        let v = &choice["text"];
        let v = if v.is_null() {
            &choice["message"]["content"]
        } else {
            v
        };
        let v = if v.is_null() {
            &choice["delta"]["content"]
        } else {
            v
        };
        v.as_str().unwrap_or("").to_string()
    };
    if body["stream"] == json!(true) {
        let mut out = String::new();
        let mut done = false;
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            if let Some(choice) = v["choices"].get(0) {
                out += &piece(choice);
            }
        }
        assert!(done, "{path}: the stream did not end: {text}");
        out
    } else {
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 5, "{path}: {text}");
        piece(&v["choices"][0])
    }
}

/// What every server must answer, from one single-process server.
fn single_process_answers() -> &'static Vec<String> {
    static ANSWERS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ANSWERS.get_or_init(|| {
        let mut server = Server::start(&model_dir(), &[]);
        let mut answers: Vec<String> = requests()
            .iter()
            .map(|(path, body)| answer(&server, path, body))
            .collect();
        answers.push(answer(&server, "/v1/completions", &other_request()));
        assert!(server.stop(Duration::from_secs(60)).success());
        answers
    })
}

/// The processes below `pid` (the launcher and its ranks).
fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        // "pid (comm) state ppid …": the command may hold spaces.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(all.iter().filter(|&&c| parent_of(c) == Some(p)));
        i += 1;
    }
    found.remove(0);
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

fn check_sharded_serve(flags: &[&str]) {
    let expected = single_process_answers();
    let mut server = Server::start_under(&LAUNCH, &model_dir(), flags);
    let ranks = descendants(server.pid());
    // The launcher and two ranks.
    assert!(ranks.len() >= 3, "{ranks:?}: {}", server.log_text());
    for (i, (path, body)) in requests().iter().enumerate() {
        assert_eq!(
            &answer(&server, path, body),
            &expected[i],
            "{flags:?} {path} {body}"
        );
    }
    // Two requests at once: both rows of one batch on every rank.
    std::thread::scope(|s| {
        let a = s.spawn(|| answer(&server, "/v1/completions", &requests()[0].1));
        let b = s.spawn(|| answer(&server, "/v1/completions", &other_request()));
        assert_eq!(&a.join().unwrap(), &expected[0], "{flags:?} concurrent");
        assert_eq!(&b.join().unwrap(), &expected[6], "{flags:?} concurrent");
    });
    // A client that leaves mid-stream: the ranks cancel its row together
    // and go on serving.
    let mut long = requests()[1].1.clone();
    long["max_tokens"] = json!(200);
    let mut resp = reqwest::blocking::Client::new()
        .post(server.url("/v1/completions"))
        .json(&long)
        .send()
        .unwrap();
    let mut first = [0u8; 64];
    std::io::Read::read(&mut resp, &mut first).unwrap();
    drop(resp);
    assert_eq!(
        &answer(&server, "/v1/completions", &requests()[0].1),
        &expected[0],
        "{flags:?} after a client left"
    );
    let log = server.log_text();
    assert!(
        log.contains("[rank 1]") && log.contains("following rank 0"),
        "{log}"
    );
    // Stopping the launcher stops every rank.
    let status = server.stop(Duration::from_secs(60));
    let log = server.log_text();
    assert!(log.contains("mlx-bun serve: stopped"), "{log}");
    assert!(status.code().is_some(), "{status:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while ranks.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "ranks left running: {log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tensor_parallel_serve_answers_as_one_process() {
    check_sharded_serve(&[]);
}

#[test]
fn pipeline_parallel_serve_answers_as_one_process() {
    check_sharded_serve(&["--pipeline"]);
}
