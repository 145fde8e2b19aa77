//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod cuda_emulation;
pub mod hub;
pub mod server;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The default model's directory, converted into the user cache on first use.
pub fn model_dir() -> PathBuf {
    mlx_bun::default_model::ensure().expect("preparing the default model")
}

/// The `mlx-bun` binary built for this test run.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mlx-bun"))
}

/// Runs the binary with `args`; panics with its stderr if it fails.
pub fn run_ok(args: &[&str]) -> Output {
    output_ok(bin().args(args))
}

/// Runs `command`; panics with its stderr if it fails.
pub fn output_ok(command: &mut Command) -> Output {
    let out = command.output().expect("running mlx-bun");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The oracle Python (mlx-lm on the same MLX): `MLX_BUN_ORACLE_PYTHON`, else
/// the environment `scripts/oracle/setup.sh` makes. A test that needs it
/// fails without it; `None` only when skipping is allowed (see `missing`).
pub fn oracle_python() -> Option<PathBuf> {
    let py = std::env::var_os("MLX_BUN_ORACLE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| mlx_bun::hub::cache_dir().join("oracle-venv/bin/python"));
    if py.is_file() {
        return Some(py);
    }
    missing(
        &format!("the oracle environment (mlx-lm) at {}", py.display()),
        "run scripts/oracle/setup.sh",
    );
    None
}

/// Runs an oracle script's `command` to completion. The oracle's own MLX
/// has crashed on the CPU with heap corruption (glibc's abort, once in many
/// runs of the float quantization modes): a run killed by a signal is run
/// once more, and its first crash is printed. Any other failure panics.
pub fn oracle_output(command: &mut Command) -> Output {
    use std::os::unix::process::ExitStatusExt;
    for attempt in 1..=2 {
        let out = command.output().expect("running the oracle");
        if out.status.success() {
            return out;
        }
        let crashed = out.status.signal().is_some();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            crashed && attempt == 1,
            "{command:?} failed ({}): {stderr}",
            out.status
        );
        eprintln!(
            "{command:?} crashed ({}), running it again: {stderr}",
            out.status
        );
    }
    unreachable!()
}

/// Whether `program --version` runs; a test that needs it fails without it
/// (`false` only when skipping is allowed).
pub fn require_tool(program: &str) -> bool {
    if Command::new(program).arg("--version").output().is_ok() {
        return true;
    }
    missing(program, &format!("install {program}"));
    false
}

/// Set to 1 for a local run on a machine without the oracle or a tool: the
/// tests that need them then pass as skipped. `.ci/run` refuses it.
pub const ALLOW_SKIP_VAR: &str = "MLX_BUN_ALLOW_SKIP";

/// A test's oracle or tool is missing: the test fails, unless
/// `MLX_BUN_ALLOW_SKIP=1`, when it says SKIPPED and the caller returns.
pub fn missing(what: &str, fix: &str) {
    if std::env::var(ALLOW_SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: {what} is missing ({ALLOW_SKIP_VAR}=1)");
        return;
    }
    panic!("{what} is missing: {fix} (or set {ALLOW_SKIP_VAR}=1 to skip such tests locally)");
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A float32 (dequantized) copy of the default model, converted once into
/// the user cache.
pub fn float32_model() -> PathBuf {
    let dir = mlx_bun::hub::cache_dir().join("test-models/smol-f32");
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    let gguf = mlx_bun::default_model::ensure_gguf().unwrap();
    run_ok(&[
        "convert",
        "--gguf",
        gguf.to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
        "-d",
    ]);
    dir
}

/// The clients' python, set up by the committed script; the test fails
/// (unless skipping is allowed) when it cannot be.
pub fn clients_python() -> Option<PathBuf> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/clients-setup.sh"))
        .output()
        .expect("running scripts/clients-setup.sh");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && path.is_file() {
        return Some(path);
    }
    missing(
        "the openai/anthropic client environment",
        &format!(
            "run scripts/clients-setup.sh ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    );
    None
}

/// A copy of the tiny checkpoint `goldens/arch/<case>` in `tmp`, with a
/// word-level tokenizer over its 256 ids (`t0` .. `t255`, unknown words read
/// as `t0`), so the text-level paths can run it.
pub fn arch_with_tokenizer(case: &str, tmp: &std::path::Path) -> PathBuf {
    let src = repo_root().join("goldens/arch").join(case);
    let dir = tmp.join(case);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..256).map(|i| (format!("t{i}"), i.into())).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    dir
}
