//! DeepSeek-V3 beyond the logits `architectures.rs` checks: a Hugging Face
//! checkpoint layout loads to the same model (as mlx-lm's `sanitize`: the
//! unsplit `kv_b_proj`, experts stored one by one, the multi-token-prediction
//! layer dropped), and a quantized KV cache holding the latent and the shared
//! rotary key follows the dense cache.

mod common;

use std::collections::HashMap;

use mlx_bun::cache::{KvCache, KvQuantization, StandardCache};
use mlx_bun::model::Model;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{abs, concatenate, dequantize, quantize, zeros};
use mlx_rs::Array;

fn golden(case: &str) -> std::path::PathBuf {
    common::repo_root().join("goldens/arch").join(case)
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    abs(&(a - b)).unwrap().max(None).unwrap().item_cast::<f32>()
}

#[test]
fn hugging_face_layout_loads_as_mlx_lm_sanitizes_it() {
    let src = golden("deepseek_v3");
    let weights = Array::load_safetensors(src.join("model.safetensors")).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let experts = config["n_routed_experts"].as_i64().unwrap() as i32;
    let rank = config["kv_lora_rank"].as_i64().unwrap() as i32;
    let mut hf: HashMap<String, Array> = HashMap::new();
    for (name, a) in &weights {
        if let Some(p) = name.strip_suffix(".embed_q.weight") {
            // embed_q [heads, rank, nope] and unembed_out [heads, v, rank]
            // back into kv_b_proj [heads × (nope + v), rank].
            let wk = a.swap_axes(-1, -2).unwrap();
            let wv = &weights[&format!("{p}.unembed_out.weight")];
            let kv_b = concatenate(&[wk, wv.clone()], 1)
                .unwrap()
                .reshape(&[-1, rank])
                .unwrap();
            hf.insert(format!("{p}.kv_b_proj.weight"), kv_b);
        } else if name.ends_with(".unembed_out.weight") {
            continue;
        } else if let Some((p, proj)) = name.split_once(".mlp.switch_mlp.") {
            for e in 0..experts {
                hf.insert(format!("{p}.mlp.experts.{e}.{proj}"), a.index(e));
            }
        } else {
            hf.insert(name.clone(), a.clone());
        }
    }
    // The multi-token-prediction layer after the last one.
    let layers = config["num_hidden_layers"].as_i64().unwrap();
    hf.insert(
        format!("model.layers.{layers}.self_attn.kv_a_proj_with_mqa.weight"),
        zeros::<f32>(&[64, 64]).unwrap(),
    );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let meta: HashMap<String, String> = HashMap::new();
    Array::save_safetensors(
        hf.iter().map(|(k, v)| (k.as_str(), v)),
        &meta,
        tmp.path().join("model.safetensors"),
    )
    .unwrap();

    let ours = Model::load(tmp.path()).unwrap();
    let mlx_layout = Model::load(&src).unwrap();
    assert_eq!(ours.init_draws, mlx_layout.init_draws);
    let expected = Array::load_safetensors(src.join("expected.safetensors")).unwrap();
    let tokens = &expected["tokens"];
    let ids = tokens.reshape(&[1, -1]).unwrap();
    let mut caches = ours.make_caches();
    let full = ours.forward(&ids, &mut caches).unwrap().index((0, .., ..));
    let diff = max_abs_diff(&full, &expected["full"]);
    assert!(diff < 1e-3, "Hugging Face layout: logits differ by {diff}");
}

/// Logits of the last position of each chunk of `ids` run through `caches`.
fn chunked(model: &Model, caches: &mut [Box<dyn KvCache>], ids: &Array, cuts: &[i32]) -> Array {
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts {
        let logits = model.forward(&ids.index((.., start..end)), caches).unwrap();
        out.push(logits.index((0, -1.., ..)));
        start = end;
    }
    concatenate(&out, 0).unwrap()
}

/// A dense cache holding what a quantized cache (start 0) holds, in floats:
/// the first update as given, then, from the second on, every position
/// quantized and dequantized. Attention over it is the dense path's over
/// the very numbers the quantized path reads packed.
#[derive(Clone)]
struct Dequantized {
    inner: StandardCache,
    bits: i32,
    converted: bool,
}

impl Dequantized {
    fn round_trip(&self, a: &Array) -> Array {
        let (w, s, b) = quantize(a, 32, self.bits).unwrap();
        dequantize(&w, &s, &b, 32, self.bits).unwrap()
    }
}

impl KvCache for Dequantized {
    fn offset(&self) -> usize {
        self.inner.offset()
    }
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> anyhow::Result<(Array, Array)> {
        if self.inner.offset() == 0 {
            return self.inner.update_and_fetch(keys, values);
        }
        if !self.converted {
            let (k, v) = self.inner.state().unwrap();
            let n = self.inner.offset();
            let (k, v) = (self.round_trip(&k), self.round_trip(&v));
            self.inner.set_state(k, v, n)?;
            self.converted = true;
        }
        let (k, v) = (self.round_trip(keys), self.round_trip(values));
        self.inner.update_and_fetch(&k, &v)
    }
    fn is_trimmable(&self) -> bool {
        false
    }
    fn trim(&mut self, _n: usize) -> usize {
        0
    }
    fn state(&self) -> Option<(Array, Array)> {
        self.inner.state()
    }
    fn set_state(&mut self, keys: Array, values: Array, offset: usize) -> anyhow::Result<()> {
        self.inner.set_state(keys, values, offset)
    }
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }
    fn kind(&self) -> &'static str {
        "KVCache"
    }
}

/// Attention over a quantized KV cache (the latent and the shared rotary key
/// packed, read by `quantized_matmul`) equals the dense path over the same
/// numbers dequantized: for a 4-token chunk and for single tokens.
#[test]
fn quantized_kv_cache_reads_what_it_holds() {
    for case in ["deepseek_v3", "deepseek_v3_plain_q"] {
        let model = Model::load(&golden(case)).unwrap();
        let expected = Array::load_safetensors(golden(case).join("expected.safetensors")).unwrap();
        let ids = expected["tokens"].reshape(&[1, -1]).unwrap();
        // A 4-token prefill (dense until the cache holds positions), a
        // 4-token chunk and 4 single tokens over the quantized latent.
        let cuts = [4, 8, 9, 10, 11, 12];
        for bits in [4, 8] {
            let mut reference: Vec<Box<dyn KvCache>> = (0..model.num_layers())
                .map(|_| -> Box<dyn KvCache> {
                    Box::new(Dequantized {
                        inner: StandardCache::new(),
                        bits,
                        converted: false,
                    })
                })
                .collect();
            let want = chunked(&model, &mut reference, &ids, &cuts);
            let q = KvQuantization {
                bits,
                group_size: 32,
                start: 0,
            };
            let mut caches = model.decoder.make_caches_with(None, Some(q)).unwrap();
            let got = chunked(&model, &mut caches, &ids, &cuts);
            assert!(
                caches[0].quantized_state().is_some(),
                "{case}: not quantized"
            );
            let diff = max_abs_diff(&got, &want);
            eprintln!("{case}: {bits}-bit KV, {diff:.1e} from the dequantized dense run");
            assert!(diff < 1e-3, "{case}: {bits}-bit KV logits differ by {diff}");
        }
    }
}

/// mlx-lm's own `sanitize` of a quantized `kv_b_proj` (dequantized, split,
/// requantized per head) and per-expert tensors, on
/// `goldens/deepseek_v3_hf_q4` (`scripts/oracle/make_deepseek_v3_hf_golden.py`).
#[test]
fn quantized_hugging_face_layout_equals_mlx_lm() {
    let dir = common::repo_root().join("goldens/deepseek_v3_hf_q4");
    let model = Model::load(&dir).unwrap();
    // `scripts/oracle/init_draws.py goldens/deepseek_v3_hf_q4`: the dense
    // checkpoint's 35, plus one per requantized embed_q / unembed_out.
    assert_eq!(model.init_draws, 41);
    let expected = Array::load_safetensors(dir.join("expected.safetensors")).unwrap();
    let ids = expected["tokens"].reshape(&[1, -1]).unwrap();
    let mut caches = model.make_caches();
    let full = model.forward(&ids, &mut caches).unwrap().index((0, .., ..));
    let diff = max_abs_diff(&full, &expected["full"]);
    assert!(diff < 1e-3, "quantized kv_b_proj: logits differ by {diff}");
}

/// `--kv-group-size` is checked against what each layer caches (the latent
/// and the rotary key, 32 wide here), not against `hidden / heads` (16).
#[test]
fn the_cli_quantizes_the_latent_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::arch_with_tokenizer("deepseek_v3_q4", tmp.path());
    let generate = |group: &str| {
        common::bin()
            .args(["generate", "-m"])
            .arg(&dir)
            .args(["-p", "t1 t17 t42 t99", "--ignore-chat-template", "-n", "4"])
            .args(["--kv-bits", "4", "--kv-group-size", group])
            .args(["--quantized-kv-start", "0"])
            .output()
            .unwrap()
    };
    let out = generate("32");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.split_whitespace().count(), 4, "{text}");
    let out = generate("64");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--kv-group-size 64 does not divide the 32 values per head that layer 0 caches"
        ),
        "{err}"
    );
}
