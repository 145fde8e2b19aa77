//! LoRA on Phi-3 (fused `qkv_proj` / `gate_up_proj`), on Mixture-of-Experts
//! models (per-expert adapters on the experts, as mlx-lm's `LoRASwitchLinear`)
//! and on the recurrent layers of the hybrid families (gated DeltaNet, short
//! convolutions, Mamba-2),
//! against mlx-lm on the tiny checkpoints of `goldens/arch/` that mlx-lm's own
//! model classes made: the same adapter names and shapes, the same loss and
//! adapter gradients from the same adapter, each side loads the other's
//! adapter and generates the same greedy tokens with it, and `train fuse`
//! writes the tensors `mlx_lm.fuse` writes.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use mlx_bun::adapters;
use mlx_bun::autodiff::forward::TrainForward;
use mlx_bun::decode::generate;
use mlx_bun::generate::GenerateOptions;
use mlx_bun::lora::{AdapterLayout, LoraParameters};
use mlx_bun::model::Model;
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::losses::Head;
use mlx_rs::ops::expand_dims;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::Array;
use serde_json::Value;

const TOKENS: [i32; 12] = [1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 200];
const PROMPT: [u32; 3] = [1, 17, 42];

fn oracle(py: &Path, args: &[&str]) -> Value {
    let out = Command::new(py)
        .arg(common::repo_root().join("scripts/oracle/lora_families.py"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("running the oracle");
    assert!(
        out.status.success(),
        "lora_families.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("")).expect("oracle JSON")
}

fn mean_ce(model: &Model) -> Array {
    mean_ce_with(model, None)
}

fn mean_ce_with(model: &Model, checkpoint_from: Option<usize>) -> Array {
    let ids = Array::from_slice(&TOKENS, &[1, TOKENS.len() as i32]);
    let fwd = TrainForward {
        decoder: &model.decoder,
        checkpoint_from,
    };
    let n = TOKENS.len() as i32;
    let (h, _) = fwd.hidden(&ids.index((.., ..n - 1)), None, false).unwrap();
    let logits = Head::of(&model.decoder).logits(&h).unwrap();
    let targets = expand_dims(ids.index((.., 1..)), -1).unwrap();
    let picked = logits.take_along_axis(&targets, -1).unwrap();
    let lse = logits.logsumexp_axis(-1, true).unwrap();
    (&lse - &picked).mean(None).unwrap()
}

fn greedy(model: &Model, tok: &Tokenizer) -> Vec<u32> {
    let mut caches = model.make_caches();
    let opts = GenerateOptions {
        max_tokens: 8,
        ..GenerateOptions::default()
    };
    generate(model, tok, &mut caches, &PROMPT, &opts, None, &mut |_| true)
        .unwrap()
        .token_ids
}

fn load_dir(dir: &Path) -> HashMap<String, Array> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            out.extend(Array::load_safetensors(&path).unwrap());
        }
    }
    out
}

fn max_abs(a: &Array) -> f32 {
    a.abs().unwrap().max(None).unwrap().item_cast::<f32>()
}

fn assert_close(ours: &Array, theirs: &Array, rel: f32, what: &str) {
    assert_eq!(ours.shape(), theirs.shape(), "{what}: shape");
    let diff = max_abs(&(ours - theirs));
    let tol = rel * max_abs(theirs) + 1e-6;
    assert!(diff <= tol, "{what}: max |ours - mlx-lm| = {diff} > {tol}");
}

fn write_data(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let rows: Vec<String> = [
        "t1 t17 t42 t99 t3 t250 t7 t7 t128",
        "t64 t5 t200 t9 t11 t17 t42 t99",
        "t3 t3 t250 t7 t1 t17 t42 t99 t64 t5",
    ]
    .iter()
    .map(|t| serde_json::json!({ "text": t }).to_string())
    .collect();
    for f in ["train.jsonl", "valid.jsonl"] {
        std::fs::write(dir.join(f), rows.join("\n") + "\n").unwrap();
    }
}

/// What both checks start from: a copy of the checkpoint, training data,
/// an adapter mlx-lm made for it (whose tensor names and shapes must be
/// ours), and our adapter trained for two steps from mlx-lm's.
struct Trained {
    work: tempfile::TempDir,
    dir: PathBuf,
    base: Model,
    layout: AdapterLayout,
    /// mlx-lm's adapter folder (also holds its gradients).
    init: PathBuf,
    /// Our trained adapter folder.
    ours: PathBuf,
}

fn train_from_mlx_lm_adapter(py: &Path, case: &str, num_layers: i64) -> Trained {
    let layers = num_layers.to_string();
    let work = tempfile::tempdir().unwrap();
    let dir = common::arch_with_tokenizer(case, work.path());
    // Naming the tokenizer class keeps transformers from reading the tiny
    // configs (some of which it rejects, e.g. a float `query_pre_attn_scalar`)
    // to pick one, and from picking the Qwen class for the Qwen3 families.
    let class = serde_json::json!({ "tokenizer_class": "PreTrainedTokenizerFast" });
    std::fs::write(dir.join("tokenizer_config.json"), class.to_string()).unwrap();
    satisfy_transformers_granite_checks(&dir);
    let d = dir.to_str().unwrap();
    let init = work.path().join("init");
    let ours = work.path().join("ours");
    let data = work.path().join("data");
    write_data(&data);

    // mlx-lm builds its adapter layers and writes a random adapter for them.
    let made = oracle(
        py,
        &[
            "init",
            "--model",
            d,
            "--adapter-path",
            init.to_str().unwrap(),
            "--num-layers",
            &layers,
            "--rank",
            "4",
            "--scale",
            "2",
        ],
    );
    let theirs: BTreeMap<String, Vec<i32>> =
        serde_json::from_value(made["shapes"].clone()).unwrap();
    let base = Model::load(&dir).unwrap();
    let params = LoraParameters {
        rank: 4,
        scale: 2.0,
        dropout: 0.0,
        keys: None,
    };
    let layout = AdapterLayout::new(&base, num_layers, &params).unwrap();
    let mine: BTreeMap<String, Vec<i32>> = layout
        .names()
        .into_iter()
        .zip(layout.shapes(&base))
        .collect();
    assert_eq!(mine, theirs, "{case}: adapter tensors (name → shape)");

    // We train from mlx-lm's adapter (it loads here), and write our own.
    let init_file = init.join("adapters.safetensors");
    common::run_ok(&[
        "train",
        "--model",
        d,
        "--data",
        data.to_str().unwrap(),
        "--iters",
        "2",
        "--batch-size",
        "1",
        "--num-layers",
        &layers,
        "--lora-rank",
        "4",
        "--lora-scale",
        "2",
        "--learning-rate",
        "0.01",
        "--resume-adapter-file",
        init_file.to_str().unwrap(),
        "--adapter-path",
        ours.to_str().unwrap(),
        "--json",
        "--no-db",
    ]);
    Trained {
        work,
        dir,
        base,
        layout,
        init,
        ours,
    }
}

/// Granite 4's tiny configs leave `mamba_expand` out and hold nulls (the
/// dense variant's experts), which neither side reads but transformers
/// checks while mlx-lm loads the tokenizer: the expansion is written as the
/// Mamba-2 heads' width implies, the nulls left out (both sides' default).
fn satisfy_transformers_granite_checks(dir: &Path) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    if config["model_type"] != "granitemoehybrid" {
        return;
    }
    let width = |k: &str| config[k].as_i64().unwrap();
    let expand = width("mamba_n_heads") * width("mamba_d_head") / width("hidden_size");
    let obj = config.as_object_mut().unwrap();
    obj.retain(|_, v| !v.is_null());
    obj.entry("mamba_expand").or_insert(expand.into());
    std::fs::write(&path, config.to_string()).unwrap();
}

fn check_family(case: &str) {
    check_family_layers(case, 2);
}

/// `check_family` with adapters on the last `num_layers` of mlx-lm's layers.
fn check_family_layers(case: &str, num_layers: i64) {
    let Some(py) = common::oracle_python() else {
        return;
    };
    let Trained {
        work,
        dir,
        base,
        layout,
        init,
        ours,
    } = train_from_mlx_lm_adapter(&py, case, num_layers);
    let d = dir.to_str().unwrap();
    let init_file = init.join("adapters.safetensors");
    let fused_theirs = work.path().join("fused-theirs");
    let fused_ours = work.path().join("fused-ours");
    common::run_ok(&[
        "train",
        "fuse",
        "--model",
        d,
        "--adapter-path",
        ours.to_str().unwrap(),
        "--output",
        fused_ours.to_str().unwrap(),
    ]);

    // mlx-lm loads both adapters, and fuses ours.
    let tokens: Vec<String> = TOKENS.iter().map(|t| t.to_string()).collect();
    let prompt: Vec<String> = PROMPT.iter().map(|t| t.to_string()).collect();
    let checked = oracle(
        &py,
        &[
            "check",
            "--model",
            d,
            "--adapters",
            init.to_str().unwrap(),
            ours.to_str().unwrap(),
            "--tokens",
            &tokens.join(","),
            "--prompt",
            &prompt.join(","),
            "--max-tokens",
            "8",
            "--fuse-to",
            fused_theirs.to_str().unwrap(),
        ],
    );
    let tok = Tokenizer::load(&dir).unwrap();
    for adapter in [&init, &ours] {
        let key = adapter.to_str().unwrap();
        let theirs = &checked["adapters"][key];
        let mut model = base.clone();
        adapters::apply(&mut model, adapter).unwrap();
        let loss = mean_ce(&model).item_cast::<f32>();
        let their_loss = theirs["loss"].as_f64().unwrap() as f32;
        assert!(
            (loss - their_loss).abs() <= 1e-4 * their_loss.abs(),
            "{case} {key}: loss {loss} vs mlx-lm {their_loss}"
        );
        let their_greedy: Vec<u32> = serde_json::from_value(theirs["greedy"].clone()).unwrap();
        assert_eq!(
            greedy(&model, &tok),
            their_greedy,
            "{case} {key}: greedy tokens"
        );
        eprintln!("{case} {key}: loss {loss} (mlx-lm {their_loss}), greedy {their_greedy:?}");
    }

    // Gradients of the loss with respect to every adapter array, from mlx-lm's adapter.
    let file = Array::load_safetensors(&init_file).unwrap();
    let p: Vec<Array> = layout.names().iter().map(|n| file[n].clone()).collect();
    // The command lines: `mlx_lm.generate --adapter-path` with our adapter and
    // `mlx-bun generate --adapter-path` print the same greedy text. (Not for
    // Qwen3.5, whose nested config gives transformers a tokenizer that
    // encodes this test vocabulary's prompt to nothing; the token-level
    // check above covers it.)
    if !case.starts_with("qwen3_5") {
        let prompt_text = PROMPT.map(|t| format!("t{t}")).join(" ");
        let a = ours.to_str().unwrap();
        let out = Command::new(&py)
            .args([
                "-m",
                "mlx_lm",
                "generate",
                "--model",
                d,
                "--adapter-path",
                a,
            ])
            .args(["--prompt", &prompt_text, "--max-tokens", "8", "--temp", "0"])
            .arg("--ignore-chat-template")
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let theirs_text = text
            .split("==========")
            .nth(1)
            .unwrap_or("")
            .trim()
            .to_string();
        let out = common::run_ok(&[
            "generate",
            "--model",
            d,
            "--adapter-path",
            a,
            "--prompt",
            &prompt_text,
            "--max-tokens",
            "8",
            "--temp",
            "0",
        ]);
        let ours_text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!ours_text.is_empty());
        assert_eq!(ours_text, theirs_text, "{case}: generate --adapter-path");
    }

    let grads_with = |checkpoint_from: Option<usize>| -> Vec<Array> {
        let closure = |p: &[Array]| -> Vec<Array> {
            let mut m = base.clone();
            layout.set_params(&mut m, p).unwrap();
            vec![mean_ce_with(&m, checkpoint_from)]
        };
        let argnums: Vec<i32> = (0..p.len() as i32).collect();
        let (_, grads) = value_and_grad_with_argnums(closure, &argnums[..])(&p[..]).unwrap();
        grads
    };
    let grads = grads_with(None);
    let their_grads = Array::load_safetensors(init.join("grads.safetensors")).unwrap();
    let mut worst = 0.0f32;
    for (name, g) in layout.names().iter().zip(&grads) {
        assert!(max_abs(g) > 0.0, "{case}: no gradient reaches {name}");
        let theirs = &their_grads[name];
        assert_close(g, theirs, 1e-3, &format!("{case}: gradient of {name}"));
        worst = worst.max(max_abs(&(g - theirs)) / max_abs(theirs));
    }
    eprintln!("{case}: largest relative gradient difference to mlx-lm {worst:e}");
    // The same through per-layer gradient checkpointing (`--grad-checkpoint`).
    for (name, (g, c)) in layout
        .names()
        .iter()
        .zip(grads.iter().zip(grads_with(Some(0))))
    {
        assert_close(
            &c,
            g,
            1e-5,
            &format!("{case}: checkpointed gradient of {name}"),
        );
    }

    assert_same_model(&fused_ours, &fused_theirs, case);
}

/// The tensors of two model directories: the same names, dtypes and values
/// (float tolerance; packed quantized weights exactly).
fn assert_same_model(ours: &Path, theirs: &Path, case: &str) {
    let a = load_dir(ours);
    let b = load_dir(theirs);
    let mut names_a: Vec<&String> = a.keys().collect();
    let mut names_b: Vec<&String> = b.keys().collect();
    names_a.sort();
    names_b.sort();
    assert_eq!(names_a, names_b, "{case}: fused tensor names");
    for (name, t) in &a {
        assert_eq!(t.dtype(), b[name].dtype(), "{case}: fused {name} dtype");
        if t.dtype() == mlx_rs::Dtype::Uint32 {
            let same = t
                .eq(&b[name])
                .unwrap()
                .all(None)
                .unwrap()
                .item_cast::<bool>();
            assert!(same, "{case}: fused {name} (packed) differs");
            continue;
        }
        let (x, y) = (
            t.as_dtype(mlx_rs::Dtype::Float32).unwrap(),
            b[name].as_dtype(mlx_rs::Dtype::Float32).unwrap(),
        );
        assert_close(&x, &y, 1e-5, &format!("{case}: fused {name}"));
    }
}

/// QLoRA: mlx-lm's adapter layout on a 4-bit model, our training from its
/// adapter, and `train fuse` against `mlx_lm.fuse` (which re-quantizes).
/// (mlx-lm cannot run quantized experts on MLX's CPU build, so only the
/// fuse is compared here.)
fn check_quantized_fuse(case: &str) {
    let Some(py) = common::oracle_python() else {
        return;
    };
    let Trained {
        work, dir, ours, ..
    } = train_from_mlx_lm_adapter(&py, case, 2);
    let d = dir.to_str().unwrap();
    let (fused_ours, fused_theirs) = (
        work.path().join("fused-ours"),
        work.path().join("fused-theirs"),
    );
    common::run_ok(&[
        "train",
        "fuse",
        "--model",
        d,
        "--adapter-path",
        ours.to_str().unwrap(),
        "--output",
        fused_ours.to_str().unwrap(),
    ]);
    oracle(
        &py,
        &[
            "fuse",
            "--model",
            d,
            "--adapter-path",
            ours.to_str().unwrap(),
            "--save-path",
            fused_theirs.to_str().unwrap(),
        ],
    );
    assert_same_model(&fused_ours, &fused_theirs, case);
}

#[test]
fn phi3_adapts_the_fused_projections_as_mlx_lm() {
    check_family("phi3");
}

#[test]
fn qwen3_moe_adapts_its_experts_as_mlx_lm() {
    check_family("qwen3_moe");
}

#[test]
fn mixtral_adapts_its_experts_as_mlx_lm() {
    check_family("mixtral");
}

#[test]
fn gpt_oss_adapts_its_experts_as_mlx_lm() {
    check_family("gpt_oss");
}

#[test]
fn qwen3_next_adapts_its_gated_deltanet_and_shared_expert_as_mlx_lm() {
    check_family("qwen3_next");
}

#[test]
fn qwen3_5_adapts_its_gated_deltanet_layers_as_mlx_lm() {
    check_family("qwen3_5");
}

#[test]
fn qwen3_5_moe_adapts_its_gated_deltanet_layers_and_experts_as_mlx_lm() {
    check_family("qwen3_5_moe");
}

#[test]
fn glm4_moe_adapts_its_shared_experts_not_its_router_as_mlx_lm() {
    check_family("glm4_moe");
}

#[test]
fn deepseek_v3_adapts_its_latent_attention_and_shared_experts_as_mlx_lm() {
    check_family("deepseek_v3");
    check_family("deepseek_v3_plain_q");
}

#[test]
fn gemma4_adapts_its_experts_router_and_per_layer_gates_as_mlx_lm() {
    check_family("gemma4_text");
    check_family("gemma4");
}

/// (Not exaone4, gemma2 and gemma3_text: transformers rejects their tiny
/// configs (a string `sliding_window_pattern`, a float
/// `query_pre_attn_scalar`), so mlx-lm's `load` fails while it loads their
/// tokenizer.)
#[test]
fn the_dense_attention_families_adapt_as_mlx_lm() {
    for case in [
        "llama4_text",
        "olmo3",
        "ministral3",
        "seed_oss",
        "granite",
        "smollm3",
    ] {
        check_family(case);
    }
}

/// The Mistral 3 wrapper: its text model's layers at `language_model.model.layers`.
#[test]
fn mistral3_adapts_its_text_model_as_mlx_lm() {
    check_family("mistral3");
    check_family("mistral3_llama");
}

#[test]
fn lfm2_adapts_its_short_convolutions_as_mlx_lm() {
    check_family("lfm2");
}

/// Nemotron-H's last four layers (attention, two MLP layers, Mamba-2),
/// which our blocks group around their mixers.
#[test]
fn nemotron_h_adapts_its_mamba2_attention_and_mlp_layers_as_mlx_lm() {
    check_family_layers("nemotron_h", 4);
}

/// Nemotron-H's experts layers: the routed experts (`switch_mlp.fc1` /
/// `fc2`, per expert), the shared experts, and the latent projections; every
/// layer of both cases (experts layers before and after the mixers).
#[test]
fn nemotron_h_adapts_its_experts_layers_as_mlx_lm() {
    check_family_layers("nemotron_h_moe", 5);
    check_family_layers("nemotron_h_moe_latent", 4);
}

#[test]
fn granitemoehybrid_adapts_its_mamba2_layers_experts_and_shared_mlp_as_mlx_lm() {
    check_family("granitemoehybrid");
    check_family("granitemoehybrid_dense");
}

#[test]
fn quantized_mamba2_families_fuse_as_mlx_lm() {
    check_quantized_fuse("nemotron_h_q4");
    check_quantized_fuse("nemotron_h_moe_q4");
    check_quantized_fuse("granitemoehybrid_q4");
}

#[test]
fn quantized_hybrid_families_fuse_as_mlx_lm() {
    check_quantized_fuse("qwen3_next_q4");
    check_quantized_fuse("qwen3_5_q4");
    check_quantized_fuse("lfm2_q4");
}

#[test]
fn quantized_phi3_and_qwen3_moe_fuse_as_mlx_lm() {
    check_quantized_fuse("phi3_q4");
    check_quantized_fuse("qwen3_moe_q4");
}

/// A checkpoint that keeps each expert apart (Hugging Face's
/// `mlp.experts.{e}.gate_proj`, Nemotron-H's `mixer.experts.{e}.up_proj`)
/// fuses to the same model as the stacked one.
#[test]
fn per_expert_checkpoints_fuse_like_stacked_ones() {
    check_per_expert_fuse(
        "qwen3_moe",
        |name, e| name.replace(".switch_mlp.", &format!(".experts.{e}.")),
        "model.layers.2.mlp.switch_mlp.gate_proj.weight",
        "model.layers.0.mlp.experts.3.up_proj.weight",
    );
    check_per_expert_fuse(
        "nemotron_h_moe",
        |name, e| {
            let each = name.replace(".switch_mlp.", &format!(".experts.{e}."));
            each.replace(".fc1.", ".up_proj.")
                .replace(".fc2.", ".down_proj.")
        },
        "backbone.layers.4.mixer.switch_mlp.fc1.weight",
        "backbone.layers.0.mixer.experts.3.up_proj.weight",
    );
}

/// Fuses an adapter on the last two layers of `case` and of its copy with
/// each expert apart (named by `per_expert_name`): the adapted experts come out
/// stacked (`adapted`), the others as the copy had them (`kept`), every
/// tensor equal to the stacked checkpoint's.
fn check_per_expert_fuse(
    case: &str,
    per_expert_name: fn(&str, i32) -> String,
    adapted: &str,
    kept: &str,
) {
    let work = tempfile::tempdir().unwrap();
    let stacked = common::arch_with_tokenizer(case, work.path());
    let per_expert = work.path().join("per-expert");
    std::fs::create_dir_all(&per_expert).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(stacked.join(f), per_expert.join(f)).unwrap();
    }
    let mut tensors = Array::load_safetensors(stacked.join("model.safetensors")).unwrap();
    let names: Vec<String> = tensors
        .keys()
        .filter(|k| k.contains(".switch_mlp."))
        .cloned()
        .collect();
    for name in names {
        let t = tensors.remove(&name).unwrap();
        for e in 0..t.shape()[0] {
            tensors.insert(per_expert_name(&name, e), t.index(e));
        }
    }
    Array::save_safetensors(&tensors, None, per_expert.join("model.safetensors")).unwrap();

    let base = Model::load(&stacked).unwrap();
    let params = LoraParameters {
        rank: 4,
        scale: 2.0,
        dropout: 0.0,
        keys: None,
    };
    let layout = AdapterLayout::new(&base, 2, &params).unwrap();
    let mut key = mlx_rs::random::key(5).unwrap();
    let arrays: Vec<Array> = layout
        .shapes(&base)
        .iter()
        .map(|s| {
            let (next, sub) = mlx_rs::random::split(&key, 2).unwrap();
            key = next;
            mlx_rs::random::uniform::<_, f32>(-0.05f32, 0.05f32, &s[..], &sub).unwrap()
        })
        .collect();
    let adapter = work.path().join("adapter");
    adapters::save_params(&layout, &arrays, &adapter.join("adapters.safetensors")).unwrap();
    let config = serde_json::json!({
        "fine_tune_type": "lora", "num_layers": 2,
        "lora_parameters": {"rank": 4, "scale": 2.0, "dropout": 0.0}
    });
    std::fs::write(adapter.join("adapter_config.json"), config.to_string()).unwrap();
    let a = adapter.to_str().unwrap();
    let outs = [work.path().join("fused-a"), work.path().join("fused-b")];
    for (model, out) in [&stacked, &per_expert].iter().zip(&outs) {
        common::run_ok(&[
            "train",
            "fuse",
            "--model",
            model.to_str().unwrap(),
            "--adapter-path",
            a,
            "--output",
            out.to_str().unwrap(),
        ]);
    }
    // The adapted layers come out stacked; the others as the checkpoint had them.
    let fused = load_dir(&outs[1]);
    assert!(fused.contains_key(adapted), "{case}: {adapted}");
    assert!(fused.contains_key(kept), "{case}: {kept}");
    let kept_layer = kept.split(".experts.").next().unwrap();
    let reference = load_dir(&outs[0]);
    for (name, t) in &reference {
        if let Some(ours) = fused.get(name) {
            assert_close(ours, t, 0.0, &format!("{case}: fused {name}"));
        } else {
            assert!(
                name.starts_with(&format!("{kept_layer}.switch_mlp.")),
                "{case}: {name} missing"
            );
        }
    }
}

/// A key the model does not have (a Phi-3 adapter on split `q_proj`, as
/// older versions wrote them) is an error that lists the keys it has.
#[test]
fn unknown_keys_name_the_model_keys() {
    let dir = common::repo_root().join("goldens/arch/phi3");
    let model = Model::load(&dir).unwrap();
    let params = LoraParameters {
        rank: 4,
        scale: 2.0,
        dropout: 0.0,
        keys: Some(vec!["self_attn.q_proj".into()]),
    };
    let err = format!("{:#}", AdapterLayout::new(&model, 2, &params).unwrap_err());
    assert!(
        err.contains("unsupported LoRA key \"self_attn.q_proj\" for this phi3 model")
            && err.contains("self_attn.qkv_proj")
            && err.contains("mlp.gate_up_proj"),
        "{err}"
    );
    // Experts' keys alone adapt only the sparse blocks among the last ones.
    let dir = common::repo_root().join("goldens/arch/qwen3_moe");
    let model = Model::load(&dir).unwrap();
    let params = LoraParameters {
        keys: Some(vec!["mlp.switch_mlp.down_proj".into()]),
        ..params
    };
    let layout = AdapterLayout::new(&model, -1, &params).unwrap();
    let layers: Vec<usize> = layout.sites.iter().map(|s| s.layer).collect();
    assert_eq!(layers, [0, 2]);
    assert_eq!(
        layout.shapes(&model),
        vec![
            vec![8, 4, 32],
            vec![8, 64, 4],
            vec![8, 4, 32],
            vec![8, 64, 4]
        ]
    );
}
