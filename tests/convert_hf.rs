//! `mlx-bun convert --hf-path` against `mlx_lm.convert` on tiny random
//! Hugging Face checkpoints (one per family convert knows; two shards with an index):
//! every option set must give the same tensors (bit for bit), the same config,
//! index and model card. Plus the refusals.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{bin, model_dir, oracle_python, repo_root};
use mlx_rs::Array;
use serde_json::{json, Value};

/// The tiny checkpoints, made once per test binary by the committed script.
fn tiny() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let py = oracle_python().expect("the oracle is required");
        let out = Command::new(py)
            .arg(repo_root().join("scripts/oracle/make_tiny_hf.py"))
            .arg(dir.path().join("hf"))
            .arg(model_dir())
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "make_tiny_hf.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .path()
}

fn family(name: &str) -> PathBuf {
    tiny().join("hf").join(name)
}

/// The families past llama and qwen, each converted plain, 4-bit and with a
/// mixed recipe.
const MORE_FAMILIES: &[&str] = &[
    "mistral",
    "gemma2",
    "gemma3_text",
    "smollm3",
    "granite",
    "seed_oss",
    "olmo3",
    "exaone4",
    "ministral3",
    "phi3",
    "llama4_text",
    "mixtral",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "glm4_moe",
    "deepseek_v3",
    "kimi_k2",
    "lfm2",
    "granitemoehybrid",
    "granitemoehybrid_dense",
    "nemotron_h",
    // The vision-language wrapper, its vision tensors dropped: Ministral 3 in
    // Hugging Face's model.language_model.* layout, a tied LLaMA-style one
    // in the older language_model.* layout.
    "mistral3",
    "mistral3_llama",
];

/// Families whose Hugging Face checkpoints come quantized (MXFP4 experts):
/// converted as they are and dequantized, never quantized again.
const QUANTIZED_FAMILIES: &[&str] = &["gpt_oss"];

/// Families without `down_proj` layers, which mlx-lm's mixed recipes refuse.
const NO_MIXED: &[&str] = &["lfm2"];

/// Families also converted to mxfp4 (their routers and per-head projections
/// under the fp4 modes).
const MXFP4_FAMILIES: &[&str] = &[
    "glm4_moe",
    "deepseek_v3",
    "lfm2",
    "granitemoehybrid",
    "nemotron_h",
];

struct Case {
    name: String,
    family: &'static str,
    ours: Vec<&'static str>,
    theirs: Value,
}

fn cases() -> Vec<Case> {
    let c = |name: &str, family, ours: &[&'static str], theirs| Case {
        name: name.to_string(),
        family,
        ours: ours.to_vec(),
        theirs,
    };
    let mut cases = vec![
        c("llama-plain", "llama", &[], json!({})),
        c(
            "llama-f32",
            "llama",
            &["--dtype", "float32"],
            json!({"dtype": "float32"}),
        ),
        c(
            "llama-q2g32",
            "llama",
            &["-q", "--q-bits", "2", "--q-group-size", "32"],
            json!({"quantize": true, "q_bits": 2, "q_group_size": 32}),
        ),
        c(
            "llama-q3",
            "llama",
            &["-q", "--q-bits", "3"],
            json!({"quantize": true, "q_bits": 3}),
        ),
        c("llama-q4", "llama", &["-q"], json!({"quantize": true})),
        c(
            "llama-q5g128",
            "llama",
            &["-q", "--q-bits", "5", "--q-group-size", "128"],
            json!({"quantize": true, "q_bits": 5, "q_group_size": 128}),
        ),
        c(
            "llama-q6",
            "llama",
            &["-q", "--q-bits", "6"],
            json!({"quantize": true, "q_bits": 6}),
        ),
        c(
            "llama-q8g32",
            "llama",
            &["-q", "--q-bits", "8", "--q-group-size", "32"],
            json!({"quantize": true, "q_bits": 8, "q_group_size": 32}),
        ),
        c("qwen2-plain", "qwen2", &[], json!({})),
        c(
            "qwen2-bf16",
            "qwen2",
            &["--dtype", "bfloat16"],
            json!({"dtype": "bfloat16"}),
        ),
        c(
            "qwen2-mxfp4",
            "qwen2",
            &["-q", "--q-mode", "mxfp4"],
            json!({"quantize": true, "q_mode": "mxfp4"}),
        ),
        c(
            "qwen2-nvfp4",
            "qwen2",
            &["-q", "--q-mode", "nvfp4"],
            json!({"quantize": true, "q_mode": "nvfp4"}),
        ),
        c(
            "qwen2-mxfp8",
            "qwen2",
            &["-q", "--q-mode", "mxfp8"],
            json!({"quantize": true, "q_mode": "mxfp8"}),
        ),
        c(
            "qwen3-q4",
            "qwen3",
            &["-q", "--dtype", "float32"],
            json!({"quantize": true, "dtype": "float32"}),
        ),
        c(
            "qwen3-mixed_2_6",
            "qwen3",
            &["-q", "--quant-predicate", "mixed_2_6"],
            json!({"quantize": true, "quant_predicate": "mixed_2_6"}),
        ),
        c(
            "qwen3-mixed_3_4",
            "qwen3",
            &[
                "-q",
                "--quant-predicate",
                "mixed_3_4",
                "--q-group-size",
                "32",
            ],
            json!({"quantize": true, "quant_predicate": "mixed_3_4", "q_group_size": 32}),
        ),
        c(
            "qwen3-mixed_3_6",
            "qwen3",
            &["-q", "--quant-predicate", "mixed_3_6"],
            json!({"quantize": true, "quant_predicate": "mixed_3_6"}),
        ),
        c(
            "llama-mixed_4_6",
            "llama",
            &[
                "-q",
                "--quant-predicate",
                "mixed_4_6",
                "--q-group-size",
                "64",
            ],
            json!({"quantize": true, "quant_predicate": "mixed_4_6", "q_group_size": 64}),
        ),
        // granite's own predicate keeps some layers affine 8-bit under mxfp4.
        c(
            "granite-mxfp4",
            "granite",
            &["-q", "--q-mode", "mxfp4"],
            json!({"quantize": true, "q_mode": "mxfp4"}),
        ),
    ];
    let recipes = ["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"];
    for (i, &f) in MORE_FAMILIES.iter().enumerate() {
        let recipe = recipes[i % recipes.len()];
        cases.push(c(&format!("{f}-plain"), f, &[], json!({})));
        cases.push(c(&format!("{f}-q4"), f, &["-q"], json!({"quantize": true})));
        if NO_MIXED.contains(&f) {
            continue;
        }
        cases.push(c(
            &format!("{f}-{recipe}"),
            f,
            &["-q", "--quant-predicate", recipe],
            json!({"quantize": true, "quant_predicate": recipe}),
        ));
    }
    for &f in QUANTIZED_FAMILIES {
        cases.push(c(&format!("{f}-plain"), f, &[], json!({})));
        cases.push(c(
            &format!("{f}-dequantized"),
            f,
            &["-d"],
            json!({"dequantize": true}),
        ));
    }
    for &f in MXFP4_FAMILIES {
        cases.push(c(
            &format!("{f}-mxfp4"),
            f,
            &["-q", "--q-mode", "mxfp4"],
            json!({"quantize": true, "q_mode": "mxfp4"}),
        ));
    }
    cases
}

fn convert(args: &[&str]) -> std::process::Output {
    bin()
        .arg("convert")
        .args(args)
        .output()
        .expect("running mlx-bun")
}

fn convert_ok(from: &Path, to: &Path, extra: &[&str]) {
    let mut args = vec![
        "--hf-path",
        from.to_str().unwrap(),
        "--mlx-path",
        to.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = convert(&args);
    assert!(
        out.status.success(),
        "convert {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the oracle on `(from, to, kwargs)` conversions in one process.
fn oracle_convert(jobs: &[(PathBuf, PathBuf, Value)]) {
    let py = oracle_python().expect("the oracle is required");
    let list: Vec<Value> = jobs
        .iter()
        .map(|(from, to, args)| json!({"hf_path": from, "mlx_path": to, "args": args}))
        .collect();
    // One file per call: tests run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = tiny().join(format!("cases-{call}.json"));
    std::fs::write(&file, serde_json::to_string(&list).unwrap()).unwrap();
    let out = Command::new(py)
        .arg(repo_root().join("scripts/oracle/convert_cases.py"))
        .arg(&file)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mlx_lm.convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn load_all(dir: &Path) -> HashMap<String, Array> {
    let index = read_json(&dir.join("model.safetensors.index.json"));
    let mut files: Vec<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    files.sort();
    files.dedup();
    let mut all = HashMap::new();
    for f in files {
        all.extend(Array::load_safetensors(dir.join(f)).unwrap());
    }
    all
}

/// mlx-lm writes `"group_size": null` per layer for a mixed recipe without
/// --q-group-size; we write the group size it means (64).
fn normalize(mut config: Value) -> Value {
    if let Some(q) = config
        .get_mut("quantization")
        .and_then(Value::as_object_mut)
    {
        for v in q.values_mut() {
            if v.get("group_size") == Some(&Value::Null) {
                v["group_size"] = json!(64);
            }
        }
    }
    config["quantization_config"] = config.get("quantization").cloned().unwrap_or(Value::Null);
    config.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    config
}

fn assert_same_model(ours: &Path, theirs: &Path, what: &str) {
    let (a, b) = (load_all(ours), load_all(theirs));
    let mut names: Vec<_> = b.keys().cloned().collect();
    names.sort();
    let mut ours_names: Vec<_> = a.keys().cloned().collect();
    ours_names.sort();
    assert_eq!(ours_names, names, "{what}: tensor names");
    for name in &names {
        let (x, y) = (&a[name], &b[name]);
        assert_eq!(
            (x.dtype(), x.shape()),
            (y.dtype(), y.shape()),
            "{what}: {name} dtype/shape"
        );
        let same = x.eq_values(y).unwrap();
        assert!(same, "{what}: {name} differs from mlx-lm's");
    }
    let (ia, ib) = (
        read_json(&ours.join("model.safetensors.index.json")),
        read_json(&theirs.join("model.safetensors.index.json")),
    );
    assert_eq!(ia, ib, "{what}: model.safetensors.index.json");
    let (ca, cb) = (
        normalize(read_json(&ours.join("config.json"))),
        normalize(read_json(&theirs.join("config.json"))),
    );
    // mlx-lm keeps the source's torch_dtype after --dtype; we record the new one.
    let mut cb = cb;
    if let Some(dtype) = ca.get("torch_dtype") {
        cb["torch_dtype"] = dtype.clone();
    }
    assert_eq!(ca, cb, "{what}: config.json");
    assert_eq!(
        std::fs::read_to_string(ours.join("README.md")).unwrap(),
        std::fs::read_to_string(theirs.join("README.md")).unwrap(),
        "{what}: model card"
    );
    for f in ["tokenizer.json", "generation_config.json"] {
        assert!(ours.join(f).is_file(), "{what}: {f} was not copied");
    }
}

#[test]
fn every_option_set_matches_mlx_lm_tensor_for_tensor() {
    let work = tempfile::tempdir().unwrap();
    let cases = cases();
    let jobs: Vec<_> = cases
        .iter()
        .map(|c| {
            (
                family(c.family),
                work.path().join(format!("theirs-{}", c.name)),
                c.theirs.clone(),
            )
        })
        .collect();
    oracle_convert(&jobs);
    for case in &cases {
        let ours = work.path().join(format!("ours-{}", case.name));
        convert_ok(&family(case.family), &ours, &case.ours);
        assert_same_model(
            &ours,
            &work.path().join(format!("theirs-{}", case.name)),
            &case.name,
        );
    }
    // The quantized configs say what mlx-lm's loader needs.
    let q = read_json(&work.path().join("ours-qwen2-nvfp4/config.json"));
    assert_eq!(
        q["quantization"],
        json!({"group_size": 16, "bits": 4, "mode": "nvfp4"})
    );
    let mixed = read_json(&work.path().join("ours-qwen3-mixed_3_6/config.json"));
    // Four layers: layers 2 and 3 get the high bits on v_proj and down_proj.
    assert_eq!(
        mixed["quantization"]["model.layers.0.mlp.down_proj"]["bits"],
        3
    );
    assert_eq!(
        mixed["quantization"]["model.layers.2.mlp.down_proj"]["bits"],
        6
    );
    assert_eq!(
        mixed["quantization"]["model.layers.3.self_attn.v_proj"]["bits"],
        6
    );
    assert_eq!(
        mixed["quantization"]["model.layers.3.self_attn.q_proj"]["bits"],
        3
    );
    assert_eq!(mixed["quantization"]["lm_head"]["bits"], 6);
    // granite's predicate: o_proj, down_proj and the untied head at 8 bits.
    let granite = read_json(&work.path().join("ours-granite-q4/config.json"));
    for layer in [
        "model.layers.1.self_attn.o_proj",
        "model.layers.3.mlp.down_proj",
        "lm_head",
    ] {
        assert_eq!(
            granite["quantization"][layer],
            json!({"group_size": 64, "bits": 8}),
            "{layer}"
        );
    }
    assert!(granite["quantization"]
        .get("model.layers.1.self_attn.q_proj")
        .is_none());
    // gemma3_text keeps an lm_head.weight the config calls tied.
    let gemma3 = load_all(&work.path().join("ours-gemma3_text-plain"));
    assert!(gemma3.contains_key("lm_head.weight"));
    let smol = load_all(&work.path().join("ours-smollm3-plain"));
    assert!(!smol.contains_key("lm_head.weight"));
    assert!(!smol.keys().any(|k| k.contains("rotary_emb")));
}

#[test]
fn dequantize_and_cast_of_quantized_models_match_mlx_lm() {
    let work = tempfile::tempdir().unwrap();
    // The same quantized input for both sides: mlx-lm's own 4-bit and mxfp4 outputs.
    let q4 = work.path().join("q4");
    let fp4 = work.path().join("fp4");
    oracle_convert(&[
        (family("llama"), q4.clone(), json!({"quantize": true})),
        (
            family("qwen2"),
            fp4.clone(),
            json!({"quantize": true, "q_mode": "mxfp4"}),
        ),
    ]);
    let jobs = vec![
        (
            q4.clone(),
            work.path().join("theirs-d"),
            json!({"dequantize": true}),
        ),
        (
            fp4.clone(),
            work.path().join("theirs-fp4-d"),
            json!({"dequantize": true}),
        ),
        (
            q4.clone(),
            work.path().join("theirs-f32"),
            json!({"dtype": "float32"}),
        ),
    ];
    oracle_convert(&jobs);
    convert_ok(&q4, &work.path().join("ours-d"), &["-d"]);
    convert_ok(&fp4, &work.path().join("ours-fp4-d"), &["-d"]);
    convert_ok(&q4, &work.path().join("ours-f32"), &["--dtype", "float32"]);
    for name in ["d", "fp4-d", "f32"] {
        assert_same_model(
            &work.path().join(format!("ours-{name}")),
            &work.path().join(format!("theirs-{name}")),
            name,
        );
    }
    // GPT-OSS's MXFP4 experts, dequantized by mlx-lm, then quantized again:
    // the routers at 8 bits, the experts under mlp.experts.
    let gpt_oss = work.path().join("gpt_oss-d");
    oracle_convert(&[(
        family("gpt_oss"),
        gpt_oss.clone(),
        json!({"dequantize": true}),
    )]);
    let requantized = [
        ("gpt_oss-q4", vec!["-q"], json!({"quantize": true})),
        (
            "gpt_oss-mixed_3_6",
            vec!["-q", "--quant-predicate", "mixed_3_6"],
            json!({"quantize": true, "quant_predicate": "mixed_3_6"}),
        ),
    ];
    let jobs: Vec<_> = requantized
        .iter()
        .map(|(name, _, theirs)| {
            (
                gpt_oss.clone(),
                work.path().join(format!("theirs-{name}")),
                theirs.clone(),
            )
        })
        .collect();
    oracle_convert(&jobs);
    for (name, ours, _) in &requantized {
        convert_ok(&gpt_oss, &work.path().join(format!("ours-{name}")), ours);
        assert_same_model(
            &work.path().join(format!("ours-{name}")),
            &work.path().join(format!("theirs-{name}")),
            name,
        );
    }
    let q4 = read_json(&work.path().join("ours-gpt_oss-q4/config.json"));
    assert_eq!(
        q4["quantization"]["model.layers.1.mlp.router"],
        json!({"group_size": 64, "bits": 8})
    );
    let dense = read_json(&work.path().join("ours-d/config.json"));
    assert!(dense.get("quantization").is_none() && dense.get("quantization_config").is_none());
}

/// Float8 checkpoints of families whose mlx-lm 0.32.2 `sanitize` does not
/// read them right: Ministral 3 as Mistral publishes it (per-tensor scales;
/// mlx-lm multiplies the float8 bytes, which MLX loads as uint8, by the
/// scales), and Qwen3 and GLM-4.5 as Qwen and Z.ai publish them (128×128
/// block scales, experts one by one in GLM's, which mlx-lm does not read).
/// The reference is mlx-lm's conversion of the same
/// weights read as float8 and scaled (`<case>_dequantized`), plain and
/// quantized.
#[test]
fn fp8_checkpoints_convert_as_their_float_weights() {
    let work = tempfile::tempdir().unwrap();
    let variants: [(&str, &[&str], Value); 3] = [
        ("plain", &[], json!({})),
        ("q4", &["-q"], json!({"quantize": true})),
        ("f32", &["--dtype", "float32"], json!({"dtype": "float32"})),
    ];
    let cases = ["ministral3_fp8", "qwen3_fp8", "glm4_moe_fp8"];
    let theirs = |case: &str, name: &str| work.path().join(format!("theirs-{case}-{name}"));
    let jobs: Vec<_> = cases
        .iter()
        .flat_map(|case| variants.iter().map(move |v| (case, v)))
        .map(|(case, (name, _, args))| {
            (
                family(&format!("{case}_dequantized")),
                theirs(case, name),
                args.clone(),
            )
        })
        .collect();
    oracle_convert(&jobs);
    for case in cases {
        for (name, flags, _) in &variants {
            let ours = work.path().join(format!("ours-{case}-{name}"));
            convert_ok(&family(case), &ours, flags);
            assert_same_model(&ours, &theirs(case, name), &format!("{case} {name}"));
            let config = read_json(&ours.join("config.json"));
            assert_ne!(config["quantization_config"]["quant_method"], json!("fp8"));
            generates(&ours);
        }
    }
}

/// DeepSeek-V3 as DeepSeek publishes it: float8 weights with a float32
/// scale per 128×128 block, partial blocks at the edges. mlx-lm's
/// `sanitize` reads these itself, so the reference is its conversion of the
/// same checkpoint, plain, quantized and in float32.
#[test]
fn block_fp8_checkpoints_convert_as_mlx_lm_reads_them() {
    let work = tempfile::tempdir().unwrap();
    let variants: [(&str, &[&str], Value); 3] = [
        ("plain", &[], json!({})),
        ("q4", &["-q"], json!({"quantize": true})),
        ("f32", &["--dtype", "float32"], json!({"dtype": "float32"})),
    ];
    let theirs = |name: &str| work.path().join(format!("theirs-{name}"));
    let jobs: Vec<_> = variants
        .iter()
        .map(|(name, _, args)| (family("deepseek_v3_fp8"), theirs(name), args.clone()))
        .collect();
    oracle_convert(&jobs);
    for (name, flags, _) in &variants {
        let ours = work.path().join(format!("ours-{name}"));
        convert_ok(&family("deepseek_v3_fp8"), &ours, flags);
        assert_same_model(&ours, &theirs(name), &format!("deepseek_v3_fp8 {name}"));
        let config = read_json(&ours.join("config.json"));
        assert_ne!(config["quantization_config"]["quant_method"], json!("fp8"));
        generates(&ours);
    }
}

/// The same for Ministral 3 in the Mistral 3 wrapper (its text model under
/// `model.language_model.`): the float8 weights folded whatever their
/// prefix, the vision tower dropped.
#[test]
fn mistral3_fp8_checkpoints_convert_as_their_float_weights() {
    let work = tempfile::tempdir().unwrap();
    let variants: [(&str, &[&str], Value); 2] = [
        ("plain", &[], json!({})),
        ("q4", &["-q"], json!({"quantize": true})),
    ];
    let theirs = |name: &str| work.path().join(format!("theirs-{name}"));
    let jobs: Vec<_> = variants
        .iter()
        .map(|(name, _, args)| {
            (
                family("mistral3_fp8_dequantized"),
                theirs(name),
                args.clone(),
            )
        })
        .collect();
    oracle_convert(&jobs);
    for (name, flags, _) in &variants {
        let ours = work.path().join(format!("ours-{name}"));
        convert_ok(&family("mistral3_fp8"), &ours, flags);
        assert_same_model(&ours, &theirs(name), &format!("mistral3_fp8 {name}"));
        let tensors = load_all(&ours);
        assert!(tensors.keys().all(|k| k.starts_with("language_model.")));
        generates(&ours);
    }

    // Mistral Small 4 shares the wrapper's model_type, not its decoder.
    let mistral4 = work.path().join("mistral4");
    copy_dir(&family("mistral3"), &mistral4);
    let mut config = read_json(&mistral4.join("config.json"));
    config["text_config"]["model_type"] = json!("mistral4");
    std::fs::write(mistral4.join("config.json"), config.to_string()).unwrap();
    let out = work.path().join("out-mistral4");
    assert_fails(
        &[
            "--hf-path",
            mistral4.to_str().unwrap(),
            "--mlx-path",
            out.to_str().unwrap(),
        ],
        "\"mistral4\"",
    );
}

fn assert_fails(args: &[&str], expect: &str) {
    let out = convert(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "convert {args:?} should fail");
    assert!(
        err.contains(expect),
        "convert {args:?}: expected {expect:?} in {err}"
    );
    assert!(
        !err.contains("panicked"),
        "convert {args:?} panicked: {err}"
    );
}

#[test]
fn quantized_input_is_never_quantized_again_and_bad_options_are_refused() {
    let work = tempfile::tempdir().unwrap();
    let q4 = work.path().join("q4");
    convert_ok(&family("llama"), &q4, &["-q"]);
    let out = work.path().join("out");
    let (q4s, outs, llama) = (
        q4.to_str().unwrap(),
        out.to_str().unwrap(),
        family("llama").to_str().unwrap().to_string(),
    );
    assert_fails(
        &["--hf-path", q4s, "--mlx-path", outs, "-q"],
        "already quantized",
    );
    assert_fails(
        &[
            "--hf-path",
            &llama,
            "--mlx-path",
            outs,
            "-q",
            "--q-mode",
            "nvfp4",
            "--q-bits",
            "8",
        ],
        "nvfp4 quantization takes exactly 4 bits",
    );
    assert_fails(
        &[
            "--hf-path",
            &llama,
            "--mlx-path",
            outs,
            "-q",
            "--q-mode",
            "mxfp4",
            "--quant-predicate",
            "mixed_3_6",
        ],
        "only use affine",
    );
    assert_fails(
        &["--hf-path", &llama, "--mlx-path", outs, "--q-bits", "4"],
        "need -q",
    );
    assert_fails(&["--hf-path", &llama, "--mlx-path", q4s], "already exists");
    assert_fails(
        &["--hf-path", "/nonexistent/model", "--mlx-path", outs],
        "does not exist",
    );
    for f in QUANTIZED_FAMILIES {
        assert_fails(
            &[
                "--hf-path",
                family(f).to_str().unwrap(),
                "--mlx-path",
                outs,
                "-q",
            ],
            "already quantized",
        );
    }
    for f in NO_MIXED {
        assert_fails(
            &[
                "--hf-path",
                family(f).to_str().unwrap(),
                "--mlx-path",
                outs,
                "-q",
                "--quant-predicate",
                "mixed_3_6",
            ],
            "no down_proj layers",
        );
    }
    // fp8 scales in a DeepSeek-V3 checkpoint: refused when the config does
    // not say fp8, and when they do not tile their weight in its blocks.
    let fp8 = work.path().join("fp8");
    copy_dir(&family("deepseek_v3"), &fp8);
    let scale = Array::from_slice(&[1.0f32], &[1, 1]);
    Array::save_safetensors(
        [("model.layers.0.self_attn.o_proj.weight_scale_inv", &scale)],
        None,
        fp8.join("model-scales.safetensors"),
    )
    .unwrap();
    assert_fails(
        &["--hf-path", fp8.to_str().unwrap(), "--mlx-path", outs],
        "fp8 scales, but config.json's quantization_config does not say",
    );
    let mut config = read_json(&fp8.join("config.json"));
    config["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
    std::fs::write(fp8.join("config.json"), config.to_string()).unwrap();
    assert_fails(
        &["--hf-path", fp8.to_str().unwrap(), "--mlx-path", outs],
        "do not tile a weight [128, 256] in 128×128 blocks (expected [1, 2])",
    );
    let mamba = work.path().join("mamba");
    std::fs::create_dir(&mamba).unwrap();
    std::fs::write(mamba.join("config.json"), r#"{"model_type": "mamba"}"#).unwrap();
    assert_fails(
        &["--hf-path", mamba.to_str().unwrap(), "--mlx-path", outs],
        "does not know model_type \"mamba\"",
    );
    let awq = work.path().join("awq");
    std::fs::create_dir(&awq).unwrap();
    std::fs::write(
        awq.join("config.json"),
        r#"{"model_type": "llama", "quantization_config": {"quant_method": "awq"}}"#,
    )
    .unwrap();
    assert_fails(
        &["--hf-path", awq.to_str().unwrap(), "--mlx-path", outs],
        "quantized with \"awq\"",
    );
    assert!(!out.exists());
    let leftovers: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "failed conversions left staging folders"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

/// A prompt whose token ids (97, 43, 106, 19, 20, 21 in the default model's
/// tokenizer, which the tiny checkpoints carry) lie inside their vocabulary
/// of 256.
const TINY_PROMPT: &str = "q;z#$%";

fn generates(model: &Path) {
    let gen = common::run_ok(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        TINY_PROMPT,
        "--ignore-chat-template",
        "-n",
        "3",
        // The tiny checkpoints' end-of-text ids (random weights may pick them).
        "--logit-bias",
        r#"{"2": -100, "3": -100}"#,
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&gen.stdout).unwrap();
    assert_eq!(
        v["token_ids"].as_array().map(Vec::len),
        Some(3),
        "{}: {v}",
        model.display()
    );
}

#[test]
fn a_prompt_past_the_models_vocabulary_is_refused() {
    // The chat template's ids run to 49151; the tiny model embeds 256.
    let out = common::bin()
        .args(["generate", "--model"])
        .arg(family("llama"))
        .args(["--prompt", "hi", "-n", "3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("outside the model's vocabulary of 256"),
        "{stderr}"
    );
}

#[test]
fn a_converted_tiny_model_generates() {
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("q8");
    convert_ok(
        &family("qwen3"),
        &out,
        &["-q", "--q-bits", "8", "--dtype", "float32"],
    );
    generates(&out);
}

#[test]
fn converted_models_of_every_family_generate() {
    let work = tempfile::tempdir().unwrap();
    for f in MORE_FAMILIES {
        let out = work.path().join(f);
        convert_ok(&family(f), &out, &["-q"]);
        generates(&out);
    }
    for f in QUANTIZED_FAMILIES {
        let out = work.path().join(f);
        convert_ok(&family(f), &out, &[]);
        generates(&out);
    }
}
