//! Start-up that never fails silently: a warm-up that fails leaves the
//! gateway unhealthy with its reason (what `/health` reports), and a model
//! that cannot serve ends `serve` with one `error:` line and a non-zero exit.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_bun::gateway::{Gateway, GatewayConfig, Health, Warmup};
use mlx_bun::model::Model;
use mlx_bun::runtime::Runtime;
use mlx_bun::tokenizer::Tokenizer;
use mlx_rs::Array;

fn config(warmup: Warmup) -> GatewayConfig {
    GatewayConfig {
        max_queue: 4,
        prompt_cache_bytes: 0,
        decode_concurrency: 2,
        prompt_concurrency: 1,
        kv_budget_bytes: None,
        ssd: None,
        warmup,
        sharding: Default::default(),
        fixed_prefill_step: None,
    }
}

/// The default model with a final norm that no forward pass accepts: it
/// loads, and fails at its first token.
fn broken_runtime() -> Runtime {
    let dir = common::model_dir();
    let mut model = Model::load(&dir).unwrap();
    model.decoder.norm.weight = Array::from_slice(&[1f32; 3], &[3]);
    Runtime {
        model,
        tokenizer: Arc::new(Tokenizer::load(&dir).unwrap()),
        draft: None,
        num_draft_tokens: 2,
        kv: Default::default(),
        fit: None,
    }
}

#[test]
fn a_failed_warm_up_is_reported_with_its_reason() {
    let runtime = broken_runtime();
    let load = move || Ok(runtime);
    let gateway = Gateway::start(load, config(Warmup::Basic)).unwrap();
    let err = gateway
        .wait_ready()
        .expect_err("a broken model must not become ready");
    assert!(format!("{err:#}").contains("warm-up failed"), "{err:#}");
    match gateway.health() {
        Health::Failed(reason) => assert!(reason.contains("warm-up failed"), "{reason}"),
        other => panic!("health is {other:?}, not failed"),
    }
    assert!(!gateway.is_ready());
}

#[test]
fn without_a_warm_up_the_gateway_is_ready_at_once() {
    let runtime = broken_runtime();
    let load = move || Ok(runtime);
    let gateway = Gateway::start(load, config(Warmup::Off)).unwrap();
    gateway.wait_ready().unwrap();
    assert_eq!(gateway.health(), Health::Ready);
}

#[test]
fn serve_exits_with_one_error_line_when_its_model_cannot_serve() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::model_dir();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    std::fs::write(
        tmp.path().join("model.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let started = Instant::now();
    let out = common::bin()
        .args(["serve", "--port", "0", "--model"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(120));
    assert!(!out.status.success(), "serve must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("safetensors"), "{stderr}");
}
