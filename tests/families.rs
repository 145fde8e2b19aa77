//! The features on every family added beside LLaMA/Qwen, on the tiny
//! mlx-lm-made checkpoints of `goldens/arch/` (their logits are checked in
//! `architectures.rs`): serial generation, continuous batching (sliding-window
//! layers included), speculative decoding with a draft model, and LoRA
//! training gradients on attention (and the MoE router and experts).

mod common;

use mlx_bun::autodiff::forward::TrainForward;
use mlx_bun::decode::BatchItem;
use mlx_bun::decode::BatchLimits;
use mlx_bun::decode::{self, generate, Row};
use mlx_bun::generate::{GenerateOptions, TokenEvent};
use mlx_bun::lora::{AdapterLayout, LoraParameters};
use mlx_bun::model::decoder::FeedForward;
use mlx_bun::model::Model;
use mlx_bun::speculative::ModelDrafter;
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::losses::Head;
use mlx_rs::ops::expand_dims;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::{random, Array};

const FAMILIES: [&str; 18] = [
    "gemma2",
    "gemma3_text",
    "phi3",
    "qwen3_moe",
    "qwen3_moe_q4",
    "mixtral",
    "smollm3",
    "granite_q4",
    "gpt_oss",
    "seed_oss_q4",
    "llama4_text",
    "glm4_moe_q4",
    "deepseek_v3_q4",
    "deepseek_v3_plain_q",
    "olmo3",
    "exaone4_q4",
    "ministral3",
    "gemma4_text",
];

const PROMPTS: [&[u32]; 2] = [&[1, 17, 42, 99, 3], &[250, 7, 7, 128, 64, 5, 200, 9, 11]];

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

fn serial_tokens(model: &Model, tok: &Tokenizer, prompt: &[u32]) -> Vec<u32> {
    let mut caches = model.make_caches();
    let result = generate(
        model,
        tok,
        &mut caches,
        prompt,
        &greedy(8),
        None,
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(result.token_ids.len(), 8);
    result.token_ids
}

#[test]
fn generation_batching_and_speculation_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let draft_dir = common::arch_with_tokenizer("llama", tmp.path());
    let draft = Model::load(&draft_dir).unwrap();
    for case in FAMILIES {
        let dir = common::arch_with_tokenizer(case, tmp.path());
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        let tok = Tokenizer::load(&dir).unwrap();
        let serial: Vec<Vec<u32>> = PROMPTS
            .iter()
            .map(|p| serial_tokens(&model, &tok, p))
            .collect();

        // Every family batches, sliding-window layers too (their rows join
        // a rotating batch cache), and each row decodes as it does alone.
        assert!(model.supports_batching(), "{case}");
        let items = PROMPTS
            .iter()
            .map(|p| BatchItem {
                prompt: p.to_vec(),
                options: greedy(8),
                constraint: None,
                on_token: Box::new(|_| true),
                caches: Vec::new(),
            })
            .collect();
        let batch = mlx_bun::decode::generate_batch(&model, &tok, items, BatchLimits::default())
            .unwrap_or_else(|e| panic!("{case}: {e:#}"));
        for (row, want) in batch.iter().zip(&serial) {
            assert_eq!(
                &row.token_ids, want,
                "{case}: batch row differs from serial"
            );
        }

        // Greedy speculative decoding with an unrelated draft model of the
        // same vocabulary emits the target's own greedy tokens.
        let opts = greedy(8);
        let mut drafter = ModelDrafter::new(&draft, &opts.sampling).unwrap();
        let mut caches = model.make_caches();
        let spec = decode::run(
            &model,
            &mut caches,
            Row::new(
                &model,
                &tok,
                PROMPTS[1].to_vec(),
                0,
                &opts,
                None,
                Box::new(|_: &TokenEvent| true),
            )
            .unwrap()
            .with_drafter(Box::new(&mut drafter), 3),
            opts.prefill_step,
        );
        match spec {
            Ok(r) => assert_eq!(r.token_ids, serial[1], "{case}: speculative differs"),
            Err(e) => panic!("{case}: speculative decoding failed: {e:#}"),
        }
    }
}

/// Cross-entropy of next-token prediction over `ids` through the training
/// forward (the path LoRA training differentiates).
fn loss(model: &Model, ids: &Array) -> Array {
    let fwd = TrainForward {
        decoder: &model.decoder,
        checkpoint_from: None,
    };
    let n = ids.shape()[1];
    use mlx_rs::ops::indexing::IndexOp;
    let (h, _) = fwd.hidden(&ids.index((.., ..n - 1)), None, false).unwrap();
    let logits = Head::of(&model.decoder).logits(&h).unwrap();
    let targets = expand_dims(ids.index((.., 1..)), -1).unwrap();
    let picked = logits.take_along_axis(&targets, -1).unwrap();
    let lse = logits.logsumexp_axis(-1, true).unwrap();
    (&lse - &picked).mean(None).unwrap()
}

#[test]
fn lora_gradients_on_attention_router_and_experts() {
    let ids = Array::from_slice(&[1i32, 17, 42, 99, 3, 250, 7, 7, 128, 64], &[1, 10]);
    for case in FAMILIES {
        let dir = common::repo_root().join("goldens/arch").join(case);
        let model = Model::load(&dir).unwrap();
        let params = LoraParameters {
            rank: 4,
            scale: 2.0,
            dropout: 0.0,
            keys: None,
        };
        let layout = AdapterLayout::new(&model, 0, &params).unwrap();
        for (i, block) in model.decoder.layers.iter().enumerate() {
            let has = |key: &str| layout.sites.iter().any(|s| s.layer == i && s.key == key);
            // Phi-3 adapts its fused qkv_proj, as mlx-lm (tests/lora_families.rs);
            // DeepSeek-V3's queries go through q_a_proj and q_b_proj.
            let q = if case == "phi3" {
                "self_attn.qkv_proj"
            } else if case == "deepseek_v3_q4" {
                "self_attn.q_b_proj"
            } else {
                "self_attn.q_proj"
            };
            assert!(has(q) && has("self_attn.o_proj"), "{case} layer {i}");
            if case.starts_with("deepseek_v3") {
                // Latent attention: no k_proj / v_proj, the latent's input
                // projection adapted.
                assert!(has("self_attn.kv_a_proj_with_mqa"), "{case} layer {i}");
                assert!(!has("self_attn.k_proj") && !has("self_attn.v_proj"));
            }
            if let FeedForward::Sparse(moe) = &block.mlp {
                // mlx-lm's GLM-4.5 and DeepSeek-V3 routers are bare matrices
                // (not adapted); their shared experts are adapted.
                assert_eq!(
                    has(moe.router_key),
                    moe.router_is_linear,
                    "{case} layer {i}: router"
                );
                if let Some(shared) = moe.shared.as_ref().filter(|s| !s.key.is_empty()) {
                    let shared = format!("{}.down_proj", shared.key);
                    assert!(has(&shared), "{case} layer {i}: shared experts not adapted");
                }
                let experts = format!("{}.down_proj", moe.experts_key);
                assert!(has(&experts), "{case} layer {i}: experts not adapted");
                assert!(!has("mlp.gate_proj"), "{case} layer {i}");
            }
        }
        // Both factors non-zero so every gradient flows.
        let mut key = random::key(3).unwrap();
        let p: Vec<Array> = layout
            .shapes(&model)
            .iter()
            .map(|s| {
                let (next, sub) = random::split(&key, 2).unwrap();
                key = next;
                let x = &random::normal::<f32>(&s[..], None, None, &sub).unwrap() * 0.1;
                // The experts' `b` (`[experts, out, r]`) starts at zero, as
                // mlx-lm initializes it: see the finite difference below.
                if s.len() == 3 && s[2] == 4 {
                    Array::zeros::<f32>(&s[..]).unwrap()
                } else {
                    x
                }
            })
            .collect();
        let at = |p: &[Array]| -> f32 {
            let mut m = model.clone();
            layout.set_params(&mut m, p).unwrap();
            loss(&m, &ids).item_cast::<f32>()
        };
        let closure = |p: &[Array]| -> Vec<Array> {
            let mut m = model.clone();
            layout.set_params(&mut m, p).unwrap();
            vec![loss(&m, &ids)]
        };
        let argnums: Vec<i32> = (0..p.len() as i32).collect();
        let (_, grads) = value_and_grad_with_argnums(closure, &argnums[..])(&p[..]).unwrap();
        for (site, g) in layout.sites.iter().zip(grads.chunks(2)) {
            // With `b = 0` only `b` has a gradient.
            let norm = (&g[0] * &g[0]).sum(None).unwrap().item_cast::<f32>()
                + (&g[1] * &g[1]).sum(None).unwrap().item_cast::<f32>();
            assert!(
                norm.is_finite() && norm > 0.0,
                "{case}: no gradient reaches {}",
                site.path()
            );
        }
        // Autodiff against a central difference along a random direction.
        // Not along the experts' adapters, and from zero `b` there: moving
        // them moves hidden states across top-k routing ties and GPT-OSS's
        // activation clips within the step (their gradients are checked
        // against mlx-lm's in tests/lora_families.rs).
        let dirs: Vec<Array> = p
            .iter()
            .map(|a| {
                let (next, sub) = random::split(&key, 2).unwrap();
                key = next;
                let d = random::normal::<f32>(a.shape(), None, None, &sub).unwrap();
                if a.ndim() == 3 {
                    Array::zeros::<f32>(a.shape()).unwrap()
                } else {
                    d
                }
            })
            .collect();
        // Random weights make the loss sharply curved (and top-k routing is
        // piecewise): a small step, a 5% tolerance, still catches a wrong or
        // missing gradient term (GPT-OSS clips its expert activations: kinks).
        let eps = 3e-4f32;
        let shifted =
            |s: f32| -> Vec<Array> { p.iter().zip(&dirs).map(|(a, d)| a + &(d * s)).collect() };
        let (up, mid, down) = (at(&shifted(eps)), at(&shifted(0.0)), at(&shifted(-eps)));
        let analytic: f32 = grads
            .iter()
            .zip(&dirs)
            .map(|(g, d)| (g * d).sum(None).unwrap().item_cast::<f32>())
            .sum();
        // The central difference, or a one-sided one where top-k routing
        // switches experts (a jump in the loss) on the other side of the point.
        let diffs = [
            (up - down) / (2.0 * eps),
            (up - mid) / eps,
            (mid - down) / eps,
        ];
        let close = |fd: f32| (fd - analytic).abs() <= 5e-2 * analytic.abs().max(fd.abs()) + 1e-2;
        assert!(
            diffs.iter().any(|&fd| close(fd)),
            "{case}: finite differences {diffs:?} (central, forward, backward) vs autodiff {analytic}"
        );
    }
}

/// The hybrid families: their gated DeltaNet (Qwen3-Next, Qwen3.5), short
/// convolution (LFM2) or Mamba-2 (Nemotron-H) layers keep a recurrent state
/// (`StateCache`, mlx-lm's `ArraysCache`) beside the attention layers' KV
/// caches.
const HYBRID: [&str; 14] = [
    "qwen3_next",
    "qwen3_next_q4",
    "qwen3_5",
    "qwen3_5_moe_q4",
    "lfm2",
    "lfm2_q4",
    "nemotron_h",
    "nemotron_h_q4",
    "nemotron_h_moe",
    "nemotron_h_moe_latent",
    "nemotron_h_moe_q4",
    "granitemoehybrid",
    "granitemoehybrid_q4",
    "granitemoehybrid_dense",
];

#[test]
fn hybrid_families_batch_and_refuse_what_needs_trimming() {
    let tmp = tempfile::tempdir().unwrap();
    let draft = Model::load(&common::arch_with_tokenizer("llama", tmp.path())).unwrap();
    for case in HYBRID {
        let dir = common::arch_with_tokenizer(case, tmp.path());
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        let tok = Tokenizer::load(&dir).unwrap();

        // Rows of 5 and 9 prompt tokens decoded as one batch: each row's
        // state joins the batch as it is, and decodes as it does alone.
        let serial: Vec<Vec<u32>> = PROMPTS
            .iter()
            .map(|p| serial_tokens(&model, &tok, p))
            .collect();
        assert!(model.supports_batching(), "{case}");
        let items = PROMPTS
            .iter()
            .map(|p| BatchItem {
                prompt: p.to_vec(),
                options: greedy(8),
                constraint: None,
                on_token: Box::new(|_| true),
                caches: Vec::new(),
            })
            .collect();
        let batch = mlx_bun::decode::generate_batch(&model, &tok, items, BatchLimits::default())
            .unwrap_or_else(|e| panic!("{case}: {e:#}"));
        for (row, want) in batch.iter().zip(&serial) {
            assert_eq!(
                &row.token_ids, want,
                "{case}: batch row differs from serial"
            );
        }

        // A state cannot drop rejected drafts: speculative decoding is
        // refused, by name, before anything runs.
        let opts = greedy(8);
        let mut drafter = ModelDrafter::new(&draft, &opts.sampling).unwrap();
        let mut caches = model.make_caches();
        let err = decode::run(
            &model,
            &mut caches,
            Row::new(
                &model,
                &tok,
                PROMPTS[1].to_vec(),
                0,
                &opts,
                None,
                Box::new(|_: &TokenEvent| true),
            )
            .unwrap()
            .with_drafter(Box::new(&mut drafter), 3),
            opts.prefill_step,
        )
        .err()
        .unwrap_or_else(|| panic!("{case}: speculative decoding must be refused"));
        assert!(format!("{err:#}").contains("trimmable"), "{case}: {err:#}");
    }

    // The CLI generates text with hybrid models (Nemotron-H with experts too).
    for case in ["qwen3_next", "nemotron_h_moe"] {
        let dir = tmp.path().join(case);
        let out = common::run_ok(&[
            "generate",
            "-m",
            dir.to_str().unwrap(),
            "-p",
            "t1 t17 t42 t99",
            "--ignore-chat-template",
            "-n",
            "8",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.split_whitespace().count(), 8, "{case}: {text}");
    }
    let dir = tmp.path().join("qwen3_next");
    let dir = dir.to_str().unwrap();

    // A drafting server refuses the model at start, saying why, instead of
    // failing every request.
    let out = common::bin()
        .args(["serve", "-m", dir, "--draft-model", "ngram", "--port", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot decode speculatively"), "{stderr}");
}

/// LoRA adapts the recurrent layers of the hybrid families (gated DeltaNet,
/// short convolutions, Mamba-2: `tests/lora_families.rs`), but ORPO, which
/// continues from a shared prompt's keys and values, refuses them.
#[test]
fn tools_that_skip_recurrent_layers_refuse_hybrid_models() {
    let tmp = tempfile::tempdir().unwrap();
    for case in ["qwen3_next", "lfm2", "nemotron_h", "granitemoehybrid"] {
        let model = Model::load(&common::arch_with_tokenizer(case, tmp.path())).unwrap();
        AdapterLayout::new(&model, -1, &LoraParameters::default()).unwrap();
        // ORPO passes its shared prompt on as keys and values: refused.
        let fwd = TrainForward {
            decoder: &model.decoder,
            checkpoint_from: None,
        };
        let ids = Array::from_slice(&[1i32, 17, 42], &[1, 3]);
        let Err(err) = fwd.hidden(&ids, None, true) else {
            panic!("{case}: a shared prompt state must be refused");
        };
        assert!(
            format!("{err:#}").contains("does not cover recurrent layers"),
            "{case}: {err:#}"
        );
    }
    let dense = Model::load(&common::arch_with_tokenizer("llama", tmp.path())).unwrap();
    AdapterLayout::new(&dense, -1, &LoraParameters::default()).unwrap();
}
