//! The shell completions in `completions/` must match the current CLI.
//! Regenerate with `MLX_BUN_UPDATE_COMPLETIONS=1 cargo test --release --test completions`.

mod common;

const SHELLS: [(&str, &str); 3] = [
    ("bash", "mlx-bun.bash"),
    ("zsh", "_mlx-bun"),
    ("fish", "mlx-bun.fish"),
];

#[test]
fn completions_are_fresh() {
    let update = std::env::var_os("MLX_BUN_UPDATE_COMPLETIONS").is_some();
    for (shell, file) in SHELLS {
        let out = common::run_ok(&["completions", shell]);
        assert!(!out.stdout.is_empty(), "no completions for {shell}");
        let path = common::repo_root().join("completions").join(file);
        if update {
            std::fs::write(&path, &out.stdout).unwrap();
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == out.stdout,
            "{} is stale: run MLX_BUN_UPDATE_COMPLETIONS=1 cargo test --release --test completions",
            path.display()
        );
    }
}
