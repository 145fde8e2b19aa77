//! Gradients of the training losses checked by finite differences on a tiny
//! random model, and the memory-saving paths (chunked head, rematerialized
//! chunks, per-layer checkpointing, the shared prompt of ORPO) checked
//! against the plain computation.

use std::collections::HashMap;
use std::path::Path;

use mlx_bun::autodiff::forward::TrainForward;
use mlx_bun::dataset_rows::{PreferenceExample, SftExample};
use mlx_bun::lora::{AdapterLayout, LoraParameters};
use mlx_bun::model::Model;
use mlx_bun::train::batches::pad_sft;
use mlx_bun::train::config::SftScope;
use mlx_bun::train::losses::sft_loss;
use mlx_bun::train::orpo::{log1mexp, orpo_loss};
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::{random, Array};

const VOCAB: i32 = 64;

/// A 2-layer LLaMA-style model with random dense weights.
fn tiny_model(dir: &Path) -> Model {
    let config = serde_json::json!({
        "model_type": "llama",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": VOCAB,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let key = random::key(7).unwrap();
    let mut keys = random::split(&key, 64).unwrap().0;
    let mut tensors: HashMap<String, Array> = HashMap::new();
    let mut add = |name: String, shape: &[i32], scale: f32| {
        let (next, sub) = random::split(&keys, 2).unwrap();
        keys = next;
        let w = random::normal::<f32>(shape, None, None, &sub).unwrap();
        tensors.insert(name, &w * scale);
    };
    add("model.embed_tokens.weight".into(), &[VOCAB, 32], 0.5);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        add(format!("{p}.self_attn.q_proj.weight"), &[32, 32], 0.2);
        add(format!("{p}.self_attn.k_proj.weight"), &[16, 32], 0.2);
        add(format!("{p}.self_attn.v_proj.weight"), &[16, 32], 0.2);
        add(format!("{p}.self_attn.o_proj.weight"), &[32, 32], 0.2);
        add(format!("{p}.mlp.gate_proj.weight"), &[48, 32], 0.2);
        add(format!("{p}.mlp.up_proj.weight"), &[48, 32], 0.2);
        add(format!("{p}.mlp.down_proj.weight"), &[32, 48], 0.2);
    }
    let mut norms = vec!["model.norm.weight".to_string()];
    for l in 0..2 {
        norms.push(format!("model.layers.{l}.input_layernorm.weight"));
        norms.push(format!("model.layers.{l}.post_attention_layernorm.weight"));
    }
    for name in norms {
        tensors.insert(name, Array::ones::<f32>(&[32]).unwrap());
    }
    Array::save_safetensors(tensors.iter(), None, dir.join("model.safetensors")).unwrap();
    Model::load(dir).unwrap()
}

fn layout(model: &Model) -> AdapterLayout {
    let params = LoraParameters {
        rank: 4,
        scale: 2.0,
        dropout: 0.0,
        keys: None,
    };
    AdapterLayout::new(model, 2, &params).unwrap()
}

/// Adapters with both factors non-zero, so every gradient is exercised.
fn random_params(model: &Model, layout: &AdapterLayout, seed: u64) -> Vec<Array> {
    let mut key = random::key(seed).unwrap();
    layout
        .shapes(model)
        .iter()
        .map(|shape| {
            let (next, sub) = random::split(&key, 2).unwrap();
            key = next;
            &random::normal::<f32>(&shape[..], None, None, &sub).unwrap() * 0.1
        })
        .collect()
}

type LossFn<'a> = dyn Fn(&Model) -> Array + 'a;

fn loss_at(model: &Model, layout: &AdapterLayout, params: &[Array], f: &LossFn) -> f32 {
    let mut m = model.clone();
    layout.set_params(&mut m, params).unwrap();
    f(&m).item_cast::<f32>()
}

fn value_and_grads(
    model: &Model,
    layout: &AdapterLayout,
    params: &[Array],
    f: &LossFn,
) -> (f32, Vec<Array>) {
    let closure = |p: &[Array]| -> Vec<Array> {
        let mut m = model.clone();
        layout.set_params(&mut m, p).unwrap();
        vec![f(&m)]
    };
    let argnums: Vec<i32> = (0..params.len() as i32).collect();
    let (v, g) = value_and_grad_with_argnums(closure, &argnums[..])(params).unwrap();
    (v[0].item_cast::<f32>(), g)
}

/// Central differences along random directions against the autodiff gradient.
fn check_gradient(model: &Model, layout: &AdapterLayout, params: &[Array], f: &LossFn, what: &str) {
    let (_, grads) = value_and_grads(model, layout, params, f);
    let eps = 1e-2f32;
    for (trial, mask) in [(1u64, None), (2, Some(0usize)), (3, Some(1usize))] {
        // Directions over all arrays, only the `a` factors, only the `b` factors.
        let dirs: Vec<Array> = random_params(model, layout, 100 + trial)
            .into_iter()
            .enumerate()
            .map(|(i, d)| match mask {
                Some(m) if i % 2 != m => &d * 0.0,
                _ => d,
            })
            .collect();
        let shifted = |s: f32| -> Vec<Array> {
            params
                .iter()
                .zip(&dirs)
                .map(|(p, d)| p + &(d * s))
                .collect()
        };
        let fd = (loss_at(model, layout, &shifted(eps), f)
            - loss_at(model, layout, &shifted(-eps), f))
            / (2.0 * eps);
        let analytic: f32 = grads
            .iter()
            .zip(&dirs)
            .map(|(g, d)| (g * d).sum(None).unwrap().item_cast::<f32>())
            .sum();
        let tol = 2e-2 * analytic.abs().max(fd.abs()) + 1e-4;
        assert!(
            (fd - analytic).abs() <= tol,
            "{what}, direction {trial}: finite difference {fd} vs autodiff {analytic}"
        );
        assert!(
            analytic.abs() > 1e-3,
            "{what}: degenerate direction {trial}"
        );
    }
}

fn sft_examples() -> Vec<SftExample> {
    vec![
        SftExample {
            tokens: vec![3, 9, 27, 17, 51, 12, 5],
            offset: 3,
        },
        SftExample {
            tokens: vec![8, 1, 44, 2],
            offset: 0,
        },
    ]
}

fn pairs() -> Vec<PreferenceExample> {
    vec![
        PreferenceExample {
            prompt: vec![5, 17, 33, 2, 9],
            chosen: vec![40, 41, 7],
            rejected: vec![12, 60, 61, 62, 7],
        },
        PreferenceExample {
            prompt: vec![6, 18],
            chosen: vec![22],
            rejected: vec![23, 24],
        },
    ]
}

fn fwd(m: &Model, checkpoint: bool) -> TrainForward<'_> {
    TrainForward {
        decoder: &m.decoder,
        checkpoint_from: checkpoint.then_some(0),
    }
}

#[test]
fn sft_gradient_matches_finite_differences() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let layout = layout(&model);
    let params = random_params(&model, &layout, 1);
    let ex = sft_examples();
    let batch = pad_sft(&ex.iter().collect::<Vec<_>>(), 2048);
    let f = |m: &Model| sft_loss(&fwd(m, false), &batch, 512, false).unwrap().0;
    check_gradient(&model, &layout, &params, &f, "sft");
}

#[test]
fn orpo_gradient_matches_finite_differences_in_both_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let layout = layout(&model);
    let params = random_params(&model, &layout, 2);
    let data = pairs();
    let refs: Vec<&PreferenceExample> = data.iter().collect();
    for scope in [SftScope::Full, SftScope::Response] {
        let f = |m: &Model| {
            orpo_loss(&fwd(m, false), &refs, 0.5, scope, 512, false)
                .unwrap()
                .0
                .loss
        };
        check_gradient(&model, &layout, &params, &f, &format!("orpo {scope:?}"));
        // The odds-ratio term alone, so its gradient is checked on its own.
        let or_only = |m: &Model| {
            orpo_loss(&fwd(m, false), &refs, 0.5, scope, 512, false)
                .unwrap()
                .0
                .or
        };
        check_gradient(&model, &layout, &params, &or_only, "orpo odds-ratio term");
    }
}

fn assert_close(a: &[Array], b: &[Array], tol: f32, what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let diff = (x - y).abs().unwrap().max(None).unwrap().item_cast::<f32>();
        let scale = x
            .abs()
            .unwrap()
            .max(None)
            .unwrap()
            .item_cast::<f32>()
            .max(1e-3);
        assert!(
            diff <= tol * scale,
            "{what}: array {i} differs by {diff} (scale {scale})"
        );
    }
}

#[test]
fn chunked_rematerialized_and_checkpointed_paths_give_the_same_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let layout = layout(&model);
    let params = random_params(&model, &layout, 3);
    let data = pairs();
    let refs: Vec<&PreferenceExample> = data.iter().collect();
    let plain = |m: &Model| {
        orpo_loss(&fwd(m, false), &refs, 0.1, SftScope::Full, 512, false)
            .unwrap()
            .0
            .loss
    };
    let saving = |m: &Model| {
        orpo_loss(&fwd(m, true), &refs, 0.1, SftScope::Full, 3, true)
            .unwrap()
            .0
            .loss
    };
    let (v1, g1) = value_and_grads(&model, &layout, &params, &plain);
    let (v2, g2) = value_and_grads(&model, &layout, &params, &saving);
    assert!((v1 - v2).abs() < 1e-5 * v1.abs(), "{v1} vs {v2}");
    assert_close(&g1, &g2, 1e-4, "orpo");

    let ex = sft_examples();
    let batch = pad_sft(&ex.iter().collect::<Vec<_>>(), 2048);
    let plain = |m: &Model| sft_loss(&fwd(m, false), &batch, 512, false).unwrap().0;
    let saving = |m: &Model| sft_loss(&fwd(m, true), &batch, 2, true).unwrap().0;
    let (v1, g1) = value_and_grads(&model, &layout, &params, &plain);
    let (v2, g2) = value_and_grads(&model, &layout, &params, &saving);
    assert!((v1 - v2).abs() < 1e-5 * v1.abs(), "{v1} vs {v2}");
    assert_close(&g1, &g2, 1e-4, "sft");
}

/// log p of each response token from one plain forward of prompt + response.
fn naive_mean_logp(m: &Model, prompt: &[u32], response: &[u32]) -> (f32, f32, usize) {
    let ids: Vec<i32> = prompt.iter().chain(response).map(|&t| t as i32).collect();
    let n = ids.len() as i32;
    let x = Array::from_slice(&ids[..ids.len() - 1], &[1, n - 1]);
    let mut caches = m.make_caches();
    let logits = m.forward(&x, &mut caches).unwrap();
    let lse = logits.logsumexp_axis(-1, true).unwrap();
    let logp = &logits - &lse;
    let v: Vec<f32> = logp
        .reshape(&[n - 1, VOCAB])
        .unwrap()
        .as_slice::<f32>()
        .to_vec();
    let per: Vec<f32> = (0..(n - 1) as usize)
        .map(|t| v[t * VOCAB as usize + ids[t + 1] as usize])
        .collect();
    let p = prompt.len();
    let resp: f32 = per[p - 1..].iter().sum::<f32>() / response.len() as f32;
    (resp, per.iter().sum(), per.len())
}

#[test]
fn shared_prompt_orpo_equals_the_plain_formula() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let layout = layout(&model);
    let params = random_params(&model, &layout, 4);
    let mut m = model.clone();
    layout.set_params(&mut m, &params).unwrap();
    let data = pairs();
    let refs: Vec<&PreferenceExample> = data.iter().collect();
    let lambda = 0.25f64;
    let (mut or_sum, mut full_sum, mut full_count, mut lw_sum) = (0f64, 0f64, 0usize, 0f64);
    for p in &data {
        let (lw, sum, count) = naive_mean_logp(&m, &p.prompt, &p.chosen);
        let (lr, _, _) = naive_mean_logp(&m, &p.prompt, &p.rejected);
        let (lw, lr) = (lw as f64, lr as f64);
        let l1m = |x: f64| (-x.exp_m1()).ln();
        let odds = (lw - lr) - (l1m(lw) - l1m(lr));
        or_sum += (1.0 + (-odds).exp()).ln();
        full_sum += sum as f64;
        full_count += count;
        lw_sum += lw;
    }
    let n = data.len() as f64;
    for (scope, nll) in [
        (SftScope::Full, -full_sum / full_count as f64),
        (SftScope::Response, -lw_sum / n),
    ] {
        let (terms, _) =
            orpo_loss(&fwd(&m, false), &refs, lambda as f32, scope, 512, false).unwrap();
        let expect = nll + lambda * or_sum / n;
        let got = terms.loss.item_cast::<f32>() as f64;
        assert!(
            (got - expect).abs() < 1e-5 * expect.abs(),
            "{scope:?}: {got} vs {expect}"
        );
        let or = terms.or.item_cast::<f32>() as f64;
        assert!((or - or_sum / n).abs() < 1e-5, "{or} vs {}", or_sum / n);
    }
}

#[test]
fn log1mexp_is_accurate_and_has_finite_gradients() {
    let xs = [-1e-6f32, -1e-3, -0.5, -0.69, -0.7, -1.0, -5.0, -40.0];
    let x = Array::from_slice(&xs, &[xs.len() as i32]);
    let y: Vec<f32> = log1mexp(&x).unwrap().as_slice::<f32>().to_vec();
    for (xi, yi) in xs.iter().zip(&y) {
        let expect = (-(*xi as f64).exp_m1()).ln();
        assert!(
            ((*yi as f64) - expect).abs() <= 1e-5 * expect.abs().max(1e-6),
            "log1mexp({xi}) = {yi}, expected {expect}"
        );
    }
    let f = |a: &[Array]| -> Vec<Array> { vec![log1mexp(&a[0]).unwrap().sum(None).unwrap()] };
    let (_, g) = value_and_grad_with_argnums(f, &[0][..])(&[x]).unwrap();
    let g: Vec<f32> = g[0].as_slice::<f32>().to_vec();
    for (xi, gi) in xs.iter().zip(&g) {
        // d/dx log(1 - e^x) = -e^x / (1 - e^x)
        let x = *xi as f64;
        let expect = -x.exp() / -x.exp_m1();
        assert!(gi.is_finite(), "gradient at {xi} is {gi}");
        assert!(
            ((*gi as f64) - expect).abs() <= 1e-3 * expect.abs() + 1e-6,
            "{gi} vs {expect} at {xi}"
        );
    }
}

#[test]
fn dropout_is_active_only_while_training() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut layout = layout(&model);
    layout.dropout = 0.5;
    let params = random_params(&model, &layout, 5);
    let ex = sft_examples();
    let batch = pad_sft(&ex.iter().collect::<Vec<_>>(), 2048);
    let loss = |training: bool| -> f32 {
        let mut m = model.clone();
        if training {
            layout.set_training_params(&mut m, &params).unwrap();
        } else {
            layout.set_params(&mut m, &params).unwrap();
        }
        sft_loss(&fwd(&m, false), &batch, 512, false)
            .unwrap()
            .0
            .item_cast::<f32>()
    };
    let (a, b) = (loss(false), loss(false));
    assert_eq!(a, b, "inference must be deterministic");
    let (c, d) = (loss(true), loss(true));
    assert!(c != d && c != a, "dropout masks should differ: {a} {c} {d}");
}
