//! Every supported architecture against mlx-lm's own implementation: tiny
//! random models built by mlx-lm (`scripts/oracle/make_arch_goldens.py`),
//! logits compared for a one-pass forward and for prefill + cached steps.

mod common;

use mlx_bun::model::Model;
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{abs, concatenate};
use mlx_rs::Array;

const CASES: [&str; 60] = [
    "llama",
    "llama3_rope",
    "llama_sliding",
    "mistral",
    "qwen2",
    "qwen3",
    "llama_q4",
    "gemma2",
    "gemma2_q4",
    "gemma3_text",
    "gemma3_text_q4",
    "phi3",
    "phi3_q4",
    "qwen3_moe",
    // mlx-lm 0.32.2 cannot run quantized experts on MLX 0.32.2's CPU build
    // (it passes gather_qmm an argument MLX rejects): for the two MoE 4-bit
    // cases the expected logits are mlx-lm's dense run of the same,
    // dequantized weights, so they check our gather_qmm path against
    // gather_mm on identical numbers.
    "qwen3_moe_q4",
    "mixtral",
    "mixtral_q4",
    "smollm3",
    "smollm3_q4",
    "granite",
    "granite_q4",
    "gpt_oss",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "gpt_oss_q4",
    "seed_oss",
    "seed_oss_q4",
    "llama4_text",
    "llama4_text_q4",
    "glm4_moe",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "glm4_moe_q4",
    "deepseek_v3",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "deepseek_v3_q4",
    "deepseek_v3_plain_q",
    "olmo3",
    "olmo3_q4",
    "exaone4",
    "exaone4_q4",
    "ministral3",
    "ministral3_q4",
    "qwen3_next",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "qwen3_next_q4",
    "qwen3_5",
    "qwen3_5_q4",
    "qwen3_5_moe",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "qwen3_5_moe_q4",
    "lfm2",
    "lfm2_q4",
    "nemotron_h",
    "nemotron_h_q4",
    "nemotron_h_moe",
    "nemotron_h_moe_latent",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "nemotron_h_moe_q4",
    "gemma4_text",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "gemma4_text_q4",
    // The multimodal checkpoint layout: text_config, language_model.*.
    "gemma4",
    "granitemoehybrid",
    // As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "granitemoehybrid_q4",
    "granitemoehybrid_dense",
    // The Mistral 3 wrapper: text_config (Ministral 3 untied by default, a
    // tied LLaMA-style one), language_model.*, vision tensors to drop; the
    // 4-bit one with per-layer overrides named under language_model.
    "mistral3",
    "mistral3_llama",
    "mistral3_q4",
];

/// How far the logits of the model in `dir` are from the golden of `golden`
/// (its `expected.safetensors`: the tokens and mlx-lm's logits).
fn golden_logits_diff(dir: &std::path::Path, golden: &std::path::Path) -> f32 {
    let model = Model::load(dir).unwrap();
    let expected = Array::load_safetensors(golden.join("expected.safetensors")).unwrap();
    let n = expected["tokens"].shape()[0];
    let ids = expected["tokens"].reshape(&[1, n]).unwrap();
    let full = model
        .forward(&ids, &mut model.make_caches())
        .unwrap()
        .index((0, .., ..));
    max_abs_diff(&full, &expected["full"])
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    abs(&(a - b)).unwrap().max(None).unwrap().item_cast::<f32>()
}

#[test]
fn logits_match_mlx_lm() {
    for case in CASES {
        let dir = common::repo_root().join("goldens/arch").join(case);
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));
        let expected = Array::load_safetensors(dir.join("expected.safetensors")).unwrap();
        let tokens = &expected["tokens"];
        let n = tokens.shape()[0];
        let ids = tokens.reshape(&[1, n]).unwrap();

        let mut caches = model.make_caches();
        let full = model.forward(&ids, &mut caches).unwrap().index((0, .., ..));
        let one_pass = max_abs_diff(&full, &expected["full"]);
        assert!(
            one_pass < 1e-3,
            "{case}: one-pass logits differ by {one_pass}"
        );

        let mut caches = model.make_caches();
        let mut steps = vec![model
            .forward(&ids.index((.., ..8)), &mut caches)
            .unwrap()
            .index((0, 7..8, ..))];
        for i in 8..n {
            steps.push(
                model
                    .forward(&ids.index((.., i..i + 1)), &mut caches)
                    .unwrap()
                    .index((0, .., ..)),
            );
        }
        let incremental = concatenate(&steps, 0).unwrap();
        let cached = max_abs_diff(&incremental, &expected["incremental"]);
        assert!(
            cached < 1e-3,
            "{case}: cached-step logits differ by {cached}"
        );
        eprintln!("{case}: max logit difference {one_pass:.1e} one pass, {cached:.1e} cached");
        // Greedy tokens through the cached steps are mlx-lm's.
        let ours: Vec<u32> = argmax_axis(&incremental, -1, None)
            .unwrap()
            .as_slice()
            .to_vec();
        let theirs: Vec<u32> = argmax_axis(&expected["incremental"], -1, None)
            .unwrap()
            .as_slice()
            .to_vec();
        assert_eq!(ours, theirs, "{case}: greedy tokens differ");
    }
}

#[test]
fn unknown_architecture_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::repo_root().join("goldens/arch/llama");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["model_type"] = "mamba".into();
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let err = Model::load(tmp.path())
        .err()
        .expect("mamba must be refused");
    assert!(
        format!("{err:#}").contains("unsupported architecture \"mamba\""),
        "{err:#}"
    );
    assert!(
        format!("{err:#}")
            .contains("supported: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, qwen3_moe, mixtral, smollm3, granite, gpt_oss, seed_oss, llama4_text, glm4_moe, olmo3, exaone4, ministral3, qwen3_next, qwen3_5, qwen3_5_moe, lfm2, deepseek_v3, kimi_k2, nemotron_h, gemma4_text, gemma4, granitemoehybrid, mistral3"),
        "{err:#}"
    );

    std::fs::write(tmp.path().join("config.json"), "{not json").unwrap();
    let err = Model::load(tmp.path())
        .err()
        .expect("bad config must be refused");
    assert!(format!("{err:#}").contains("config.json"), "{err:#}");

    let err = Model::load(&tmp.path().join("missing")).err().unwrap();
    assert!(format!("{err:#}").contains("does not exist"), "{err:#}");
}

/// A Qwen3-Next checkpoint in the Hugging Face layout (experts one by one,
/// convolutions `[channels, 1, kernel]`, norms stored as offsets from 1, an
/// MTP head) loads as mlx-lm's `sanitize` converts it: the same logits.
#[test]
fn qwen3_next_hugging_face_layout_loads() {
    let src = common::repo_root().join("goldens/arch/qwen3_next");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let one = Array::from_f32(1.0);
    let mut hf = std::collections::HashMap::new();
    for (name, t) in Array::load_safetensors(src.join("model.safetensors")).unwrap() {
        let norm = [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "model.norm.weight",
            "q_norm.weight",
            "k_norm.weight",
        ];
        if name.ends_with("conv1d.weight") {
            hf.insert(name, t.swap_axes(1, 2).unwrap());
        } else if norm.iter().any(|n| name.ends_with(n)) {
            hf.insert(name, &t - &one);
        } else if let Some((layer, proj)) = name.split_once(".switch_mlp.") {
            for e in 0..t.shape()[0] {
                hf.insert(format!("{layer}.experts.{e}.{proj}"), t.index(e));
            }
        } else {
            hf.insert(name, t);
        }
    }
    hf.insert(
        "mtp.fc.weight".into(),
        Array::from_slice(&[0f32; 4], &[2, 2]),
    );
    Array::save_safetensors(&hf, None, tmp.path().join("model.safetensors")).unwrap();

    let diff = golden_logits_diff(tmp.path(), &src);
    assert!(diff < 1e-3, "Hugging Face layout: logits differ by {diff}");
}

/// Nemotron-H checkpoints with experts layers as Hugging Face ships them
/// (each expert's `up_proj` / `down_proj` on its own, convolutions
/// `[channels, 1, kernel]`, an MTP head) load as mlx-lm's `sanitize`
/// converts them: the same logits.
#[test]
fn nemotron_h_moe_hugging_face_layout_loads() {
    for case in ["nemotron_h_moe", "nemotron_h_moe_latent"] {
        let src = common::repo_root().join("goldens/arch").join(case);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
        let mut hf = std::collections::HashMap::new();
        for (name, t) in Array::load_safetensors(src.join("model.safetensors")).unwrap() {
            if name.ends_with("conv1d.weight") {
                hf.insert(name, t.swap_axes(1, 2).unwrap());
            } else if let Some((mixer, proj)) = name.split_once(".switch_mlp.") {
                let proj = proj.replace("fc1", "up_proj").replace("fc2", "down_proj");
                for e in 0..t.shape()[0] {
                    hf.insert(format!("{mixer}.experts.{e}.{proj}"), t.index(e));
                }
            } else {
                hf.insert(name, t);
            }
        }
        let junk = Array::from_slice(&[0f32; 4], &[2, 2]);
        hf.insert("mtp.layers.0.mixer.gate.weight".into(), junk);
        Array::save_safetensors(&hf, None, tmp.path().join("model.safetensors")).unwrap();

        let diff = golden_logits_diff(tmp.path(), &src);
        assert!(
            diff < 1e-3,
            "{case} in Hugging Face's layout: logits differ by {diff}"
        );
    }
}

/// Qwen3.5 and Qwen3.5-MoE checkpoints as Hugging Face ships them (the
/// text model under `model.language_model.`, `lm_head` and `mtp.*` at the
/// top, vision tensors beside them, `[channels, 1, kernel]` convolutions,
/// norms stored as offsets from 1, the MoE's experts fused into
/// `experts.gate_up_proj` / `experts.down_proj`) load as mlx-lm's
/// `sanitize` converts them: the same logits.
#[test]
fn qwen3_5_hugging_face_layout_loads() {
    for case in ["qwen3_5", "qwen3_5_moe"] {
        let src = common::repo_root().join("goldens/arch").join(case);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
        let one = Array::from_f32(1.0);
        let mut hf = std::collections::HashMap::new();
        let mut switch = std::collections::HashMap::new();
        for (name, t) in Array::load_safetensors(src.join("model.safetensors")).unwrap() {
            let name = match name.strip_prefix("language_model.model.") {
                Some(rest) => format!("model.language_model.{rest}"),
                None => name.strip_prefix("language_model.").unwrap().to_string(),
            };
            let norm = [
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "language_model.norm.weight",
                "q_norm.weight",
                "k_norm.weight",
            ];
            if name.ends_with("conv1d.weight") {
                hf.insert(name, t.swap_axes(1, 2).unwrap());
            } else if norm.iter().any(|n| name.ends_with(n)) {
                hf.insert(name, &t - &one);
            } else if let Some((mlp, proj)) = name.split_once(".switch_mlp.") {
                switch.insert((mlp.to_string(), proj.to_string()), t);
            } else {
                hf.insert(name, t);
            }
        }
        for ((mlp, proj), t) in &switch {
            match proj.as_str() {
                "gate_proj.weight" => {
                    let up = &switch[&(mlp.clone(), "up_proj.weight".to_string())];
                    let fused = concatenate(&[t, up], 1).unwrap();
                    hf.insert(format!("{mlp}.experts.gate_up_proj"), fused);
                }
                "down_proj.weight" => {
                    hf.insert(format!("{mlp}.experts.down_proj"), t.clone());
                }
                _ => {}
            }
        }
        let junk = Array::from_slice(&[0f32; 4], &[2, 2]);
        hf.insert("mtp.fc.weight".into(), junk.clone());
        hf.insert("model.visual.blocks.0.attn.qkv.weight".into(), junk);
        Array::save_safetensors(&hf, None, tmp.path().join("model.safetensors")).unwrap();

        let diff = golden_logits_diff(tmp.path(), &src);
        assert!(
            diff < 1e-3,
            "{case} in Hugging Face's layout: logits differ by {diff}"
        );
    }
}

/// An LFM2 checkpoint as Hugging Face ships it (convolutions `[channels, 1,
/// kernel]`; a config naming its attention layers by `full_attn_idxs`,
/// without the shared `rms_norm_eps` and `intermediate_size`) loads as
/// mlx-lm's `sanitize` converts it: the same logits.
#[test]
fn lfm2_hugging_face_layout_loads() {
    let src = common::repo_root().join("goldens/arch/lfm2");
    let tmp = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let top = config.as_object_mut().unwrap();
    for key in ["rms_norm_eps", "intermediate_size", "layer_types"] {
        top.remove(key);
    }
    top.insert("full_attn_idxs".into(), serde_json::json!([1, 3]));
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let mut hf = std::collections::HashMap::new();
    for (name, t) in Array::load_safetensors(src.join("model.safetensors")).unwrap() {
        let t = match name.ends_with("conv.conv.weight") {
            true => t.swap_axes(1, 2).unwrap(),
            false => t,
        };
        hf.insert(name, t);
    }
    Array::save_safetensors(&hf, None, tmp.path().join("model.safetensors")).unwrap();

    let diff = golden_logits_diff(tmp.path(), &src);
    assert!(diff < 1e-3, "Hugging Face layout: logits differ by {diff}");
}

/// Mistral 3 checkpoints as Hugging Face ships them (the text model under
/// `model.language_model.`, `lm_head` and the vision tensors beside it)
/// load as mlx-lm's `sanitize` renames them: the same logits. A
/// `text_config` of `mistral4` is refused by name.
#[test]
fn mistral3_hugging_face_layout_loads() {
    for case in ["mistral3", "mistral3_llama"] {
        let src = common::repo_root().join("goldens/arch").join(case);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
        let mut hf = std::collections::HashMap::new();
        for (name, t) in Array::load_safetensors(src.join("model.safetensors")).unwrap() {
            let name = match name.strip_prefix("language_model.model.") {
                Some(rest) => format!("model.language_model.{rest}"),
                None => name.replace("language_model.lm_head", "lm_head"),
            };
            hf.insert(name.replace("vision_tower", "model.vision_tower"), t);
        }
        assert!(hf.contains_key("model.vision_tower.patch_conv.weight"));
        Array::save_safetensors(&hf, None, tmp.path().join("model.safetensors")).unwrap();

        let diff = golden_logits_diff(tmp.path(), &src);
        assert!(
            diff < 1e-3,
            "{case} in Hugging Face's layout: logits differ by {diff}"
        );
    }

    let src = common::repo_root().join("goldens/arch/mistral3");
    let tmp = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["text_config"]["model_type"] = "mistral4".into();
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let err = Model::load(tmp.path())
        .err()
        .expect("mistral4 must be refused");
    assert!(format!("{err:#}").contains("\"mistral4\""), "{err:#}");
}
