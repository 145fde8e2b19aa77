//! Shared helpers for the integration tests.
#![allow(dead_code)]

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
    let out = bin().args(args).output().expect("running mlx-bun");
    assert!(
        out.status.success(),
        "mlx-bun {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The oracle Python (mlx-lm on the same MLX), if its environment exists.
pub fn oracle_python() -> Option<PathBuf> {
    let py = std::env::var_os("MLX_BUN_ORACLE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| mlx_bun::hub::cache_dir().join("oracle-venv/bin/python"));
    py.is_file().then_some(py)
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
