//! `mlx-bun manage --scan | --delete` on a Hub cache laid out as
//! `huggingface_hub` writes it, compared with `mlx_lm.manage --scan`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{bin, oracle_python};

/// A cached repo: a blob, a snapshot file linking to it, a ref.
fn cached_repo(cache: &Path, folder: &str, size: usize) {
    let repo = cache.join(folder);
    let blob = repo.join("blobs/0123abcd");
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, vec![7u8; size]).unwrap();
    let snap = repo.join("snapshots/c0ffee");
    std::fs::create_dir_all(&snap).unwrap();
    std::os::unix::fs::symlink("../../blobs/0123abcd", snap.join("model.safetensors")).unwrap();
    std::fs::write(snap.join("config.json"), "{}").unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "c0ffee").unwrap();
}

fn manage(cache: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = bin()
        .arg("manage")
        .args(args)
        .env("HF_HUB_CACHE", cache)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn repo_ids(table: &str) -> Vec<String> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("REPO ID"))
        .skip(2)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn scan_lists_what_mlx_lm_lists_and_delete_asks_then_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    cached_repo(&cache, "models--mlx-community--Tiny-4bit", 5000);
    cached_repo(&cache, "models--someone--tiny-mlx-8bit", 700);
    cached_repo(&cache, "models--someone--plain-model", 100);
    cached_repo(&cache, "datasets--someone--mlx-data", 10);

    let (ok, ours) = manage(&cache, &["--scan"], "");
    assert!(ok, "{ours}");
    let py = oracle_python().expect("the oracle is required");
    let theirs = Command::new(py)
        .args(["-m", "mlx_lm", "manage", "--scan"])
        .env("HF_HUB_CACHE", &cache)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let theirs = String::from_utf8_lossy(&theirs.stdout).into_owned();
    assert_eq!(
        repo_ids(&ours),
        repo_ids(&theirs),
        "ours:\n{ours}\ntheirs:\n{theirs}"
    );
    assert!(
        ours.contains("5.0K") && ours.contains("models--mlx-community--Tiny-4bit"),
        "{ours}"
    );
    let line = ours
        .lines()
        .find(|l| l.starts_with("mlx-community/Tiny-4bit"))
        .unwrap();
    let theirs_line = theirs
        .lines()
        .find(|l| l.starts_with("mlx-community/Tiny-4bit"))
        .unwrap();
    let cols = |l: &str| {
        l.split_whitespace()
            .take(4)
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(cols(line), cols(theirs_line), "repo, type, size, files");

    let (ok, out) = manage(&cache, &["--delete", "tiny"], "n\n");
    assert!(ok && out.contains("Deletion cancelled"), "{out}");
    assert!(cache.join("models--someone--tiny-mlx-8bit").is_dir());

    let (ok, out) = manage(&cache, &["--delete", "tiny"], "y\n");
    assert!(ok && out.contains("deleted successfully"), "{out}");
    assert!(!cache.join("models--someone--tiny-mlx-8bit").exists());
    assert!(
        cache.join("models--mlx-community--Tiny-4bit").is_dir(),
        "the match is case-sensitive, as mlx-lm's"
    );
    assert!(cache.join("models--someone--plain-model").is_dir());

    let (ok, out) = manage(&cache, &["--delete", "nothing-like-this"], "");
    assert!(ok && out.contains("No models found"), "{out}");
}
