//! Hybrid models (recurrent states beside attention layers) keep what they
//! have read: prompt-cache files in mlx-lm's layout, both ways, and the
//! server's prompt cache continuing a conversation's next turn from the
//! state of the last one (the tiny mlx-lm-made checkpoints of
//! `goldens/arch/`).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_bun::cache::KvCache;
use mlx_bun::model::Model;
use mlx_bun::prefix::file as kv_file;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use serde_json::{json, Value};

const HYBRID: [&str; 8] = [
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_q4",
    "lfm2",
    "nemotron_h",
    "nemotron_h_q4",
    "granitemoehybrid",
    "granitemoehybrid_dense",
];
const PROMPT: [u32; 6] = [1, 17, 42, 99, 3, 5];
const SUFFIX: [u32; 2] = [7, 9];
const NEW_TOKENS: usize = 6;

fn arch(case: &str) -> PathBuf {
    common::repo_root().join("goldens/arch").join(case)
}

fn ids(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// mlx-lm's side (`scripts/oracle/hybrid_cache_file.py`): the greedy tokens
/// it continues with.
fn oracle(args: &[&str]) -> Vec<u32> {
    let python = common::oracle_python().expect("the oracle is required");
    let out = std::process::Command::new(python)
        .arg(common::repo_root().join("scripts/oracle/hybrid_cache_file.py"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Greedy tokens after feeding `suffix` to caches that hold a prompt.
fn continue_greedy(model: &Model, caches: &mut [Box<dyn KvCache>], suffix: &[u32]) -> Vec<u32> {
    let mut input: Vec<i32> = suffix.iter().map(|&t| t as i32).collect();
    let mut out = Vec::new();
    for _ in 0..NEW_TOKENS {
        let x = Array::from_slice(&input, &[1, input.len() as i32]);
        let logits = model.decoder.forward(&x, caches).unwrap();
        let last = logits.index((0, -1, ..));
        let token = argmax_axis(&last, -1, None).unwrap().item_cast::<u32>();
        out.push(token);
        input = vec![token as i32];
    }
    out
}

#[test]
fn prompt_cache_files_of_hybrid_models_move_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    for case in HYBRID {
        let dir = arch(case);
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));

        // mlx-lm writes, we continue.
        let theirs = tmp.path().join(format!("{case}-mlx-lm.safetensors"));
        let want = oracle(&[
            "write",
            dir.to_str().unwrap(),
            theirs.to_str().unwrap(),
            &ids(&PROMPT),
            &ids(&SUFFIX),
            &NEW_TOKENS.to_string(),
        ]);
        let file = kv_file::load(&theirs).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        kv_file::check_compatible(&file, &model, &theirs).unwrap();
        assert_eq!(file.offset(), PROMPT.len(), "{case}");
        let kinds: Vec<&str> = file.caches.iter().map(|c| c.kind()).collect();
        assert!(kinds.contains(&"ArraysCache"), "{case}: {kinds:?}");
        let mut caches = file.caches;
        kv_file::cast_to(&mut caches, model.dtype).unwrap();
        assert_eq!(
            continue_greedy(&model, &mut caches, &SUFFIX),
            want,
            "{case}: continuing mlx-lm's file"
        );

        // We write, mlx-lm continues, and so do we from our own file.
        let ours = tmp.path().join(format!("{case}-ours.safetensors"));
        let mut caches = model.make_caches();
        kv_file::fill(&model, &mut caches, &PROMPT, 512, &mut |_, _| {}).unwrap();
        kv_file::save(&ours, &caches, &BTreeMap::new()).unwrap();
        let got = oracle(&[
            "continue",
            dir.to_str().unwrap(),
            ours.to_str().unwrap(),
            &ids(&SUFFIX),
            &NEW_TOKENS.to_string(),
        ]);
        assert_eq!(got, want, "{case}: mlx-lm continuing our file");
        let mut again = kv_file::load(&ours).unwrap().caches;
        assert_eq!(
            continue_greedy(&model, &mut again, &SUFFIX),
            want,
            "{case}: continuing our own file"
        );
    }

    // A file whose layers do not match the model's kinds is refused.
    let theirs = tmp.path().join("qwen3_next-mlx-lm.safetensors");
    let file = kv_file::load(&theirs).unwrap();
    let llama = Model::load(&arch("llama")).unwrap();
    let err = kv_file::check_compatible(&file, &llama, &theirs).unwrap_err();
    assert!(format!("{err:#}").contains("layer"), "{err:#}");
}

/// A copy of a tiny checkpoint with a word-level tokenizer over its 256 ids
/// (`t0` .. `t255`) and a chat template written in those words: `t1 ROLE
/// CONTENT t2` per message (roles are unknown words, read as `t0`).
fn chat_model(case: &str, tmp: &Path) -> PathBuf {
    let dir = common::arch_with_tokenizer(case, tmp);
    let template = "{% for m in messages %}t1 {{ m.role }} {{ m.content }} t2 {% endfor %}\
                    {% if add_generation_prompt %}t1 assistant {% endif %}";
    let config = json!({"chat_template": template, "eos_token": "t2"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// A greedy chat completion: the reply, and the prompt's length and cached
/// tokens.
fn chat(server: &common::server::Server, messages: &Value) -> (String, u64, u64) {
    let body = json!({"messages": messages, "max_tokens": 5, "temperature": 0});
    let r = reqwest::blocking::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "{}", server.log_text());
    let v: Value = r.json().unwrap();
    let usage = &v["usage"];
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

#[test]
fn a_second_chat_turn_on_a_hybrid_model_reuses_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = chat_model("qwen3_next", tmp.path());
    let first = "t5 t9 t33 t41 t7 t8 t100 t12 t13 t77 t3 t4";
    // The batch lane, then one request at a time.
    for lane in [&[][..], &["--decode-concurrency", "1"][..]] {
        let mut server = common::server::Server::start(&dir, lane);
        let turn1 = json!([{"role": "user", "content": first}]);
        let (reply, prompt1, cached1) = chat(&server, &turn1);
        assert_eq!(cached1, 0, "{lane:?}");
        assert_eq!(reply.split_whitespace().count(), 5, "{reply:?}");

        // The reply comes back as it was generated: the state after the
        // first turn's prompt and its reply continues, so only the new turn
        // is prefilled (and the reply's last token where the lane had not
        // fed it yet).
        let turn2 = json!([
            {"role": "user", "content": first},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "t60 t61"},
        ]);
        let (_, prompt2, cached2) = chat(&server, &turn2);
        assert!(
            (prompt1 + 4..=prompt1 + 5).contains(&cached2),
            "{lane:?}: {cached2} of {prompt2} cached after a prompt of {prompt1}"
        );

        // The client sends the reply back edited (as clients that drop
        // reasoning do): the state at the end of the first prompt serves.
        let edited = json!([
            {"role": "user", "content": first},
            {"role": "assistant", "content": "t90 t91"},
            {"role": "user", "content": "t60 t61"},
        ]);
        let (_, _, cached3) = chat(&server, &edited);
        assert_eq!(cached3, prompt1 - 1, "{lane:?}");

        // The same question again is answered as the first time.
        let (again, _, cached4) = chat(&server, &turn1);
        assert_eq!(again, reply, "{lane:?}");
        assert_eq!(cached4, prompt1 - 1, "{lane:?}");
        server.stop(std::time::Duration::from_secs(30));
    }
}

/// `cache-prompt` saves a hybrid model's prompt, and `generate
/// --prompt-cache-file` continues it as generating the whole text does.
#[test]
fn the_cli_caches_a_hybrid_prompt_and_continues_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = chat_model("qwen3_5", tmp.path());
    // Plain text: no chat template around the cached prompt.
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    let dir = dir.to_str().unwrap();
    let file = tmp.path().join("prompt.safetensors");
    let cached = "t5 t9 t33 t41 t7 t8 t100 t12";
    common::run_ok(&[
        "cache-prompt",
        "-m",
        dir,
        "-p",
        cached,
        "--prompt-cache-file",
        file.to_str().unwrap(),
    ]);
    let generate = |extra: &[&str], prompt: &str| {
        let mut args = vec![
            "generate",
            "-m",
            dir,
            "-p",
            prompt,
            "--ignore-chat-template",
            "-n",
            "8",
        ];
        args.extend_from_slice(extra);
        String::from_utf8_lossy(&common::run_ok(&args).stdout).into_owned()
    };
    let continued = generate(&["--prompt-cache-file", file.to_str().unwrap()], "t3 t4");
    let whole = generate(&[], &format!("{cached} t3 t4"));
    assert_eq!(continued, whole);
    assert_eq!(whole.split_whitespace().count(), 8, "{whole}");
}
