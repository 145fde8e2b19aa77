//! Every family in the dtype published checkpoints store: the tiny
//! checkpoints of goldens/arch/ cast to bfloat16, computed in bfloat16
//! (`--compute-dtype model`, as mlx-lm computes), alone and four rows in a
//! batch, give mlx-lm 0.32.2's greedy tokens (`scripts/oracle/gpu_families.py`,
//! which also runs on a GPU through `scripts/gpu-real-models.sh families`).
//!
//! The mixture-of-experts checkpoints are not here: mlx-lm's CPU build runs
//! their experts only in float32 (`GatherMM` and `gather_qmm` refuse
//! bfloat16), so on the CPU there is no oracle for them in this dtype.
//!
//! It also guards an exit crash it found: `generate --batch-file` returned
//! while the pass queued for rows that had just ended still ran, and the exit
//! handlers freed MLX's allocator under it (`malloc_consolidate(): unaligned
//! fastbin chunk detected` in 1 to 4 of these cases per run).

mod common;

use std::process::Command;

const CASES: &[&str] = &[
    "exaone4",
    "exaone4_q4",
    "gemma2",
    "gemma2_q4",
    "gemma3_text",
    "gemma3_text_q4",
    "gemma4",
    "granite",
    "granite_q4",
    "granitemoehybrid_dense",
    "lfm2",
    "lfm2_q4",
    "llama",
    "llama3_rope",
    "llama4_text",
    "llama4_text_q4",
    "llama_q4",
    "llama_sliding",
    "ministral3",
    "ministral3_q4",
    "mistral",
    "mistral3",
    "mistral3_llama",
    "nemotron_h",
    "nemotron_h_q4",
    "olmo3",
    "olmo3_q4",
    "phi3",
    "phi3_q4",
    "qwen2",
    "qwen3",
    "qwen3_5",
    "qwen3_5_q4",
    "seed_oss",
    "seed_oss_q4",
    "smollm3",
    "smollm3_q4",
];

#[test]
fn bfloat16_families_give_mlx_lm_tokens_alone_and_batched() {
    let Some(py) = common::oracle_python() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let report = work.path().join("report.json");
    let out = Command::new(py)
        .arg(common::repo_root().join("scripts/oracle/gpu_families.py"))
        .args(["--bin", env!("CARGO_BIN_EXE_mlx-bun")])
        .arg("--work")
        .arg(work.path())
        .arg("--out")
        .arg(&report)
        .args(["--dtype", "bfloat16", "--ours-flag=--compute-dtype=model"])
        .args(CASES)
        .output()
        .expect("running the oracle");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(doc["meta"]["dtype"], "bfloat16");
    for case in CASES {
        let entry = &doc["cases"][case];
        assert_eq!(entry["serial_equal"], true, "{case}: {entry}");
        assert_eq!(entry["batch_equal"], true, "{case}: {entry}");
        let rows = entry["mlx_bun_batch"].as_array().unwrap();
        assert_eq!(rows.len(), 4, "{case}");
        assert!(rows.iter().all(|r| r.as_array().unwrap().len() == 16));
    }
}
