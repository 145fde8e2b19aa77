//! Where models come from: a local directory, a Hugging Face repo id (cache
//! first, `HF_ENDPOINT` respected), or the embedded default model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The user cache folder of mlx-bun (`MLX_BUN_CACHE`, else `~/.cache/mlx-bun`).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MLX_BUN_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("mlx-bun")
}

fn looks_like_repo_id(s: &str) -> bool {
    let parts: Vec<_> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

/// Resolves `--model` to a local model directory.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.exists() {
        bail!("{spec} is not a model directory");
    }
    if !looks_like_repo_id(spec) || spec.starts_with('.') || spec.starts_with('/') {
        bail!("model directory {spec} does not exist");
    }
    download_repo(spec)
}

/// The local folder of a Hugging Face repo id already in the cache, without
/// any download; `None` when it is not a repo id or not cached whole.
pub fn cached_repo(repo_id: &str) -> Option<PathBuf> {
    cached_repo_in(&hf_hub::Cache::from_env(), repo_id)
}

fn cached_repo_in(cache: &hf_hub::Cache, repo_id: &str) -> Option<PathBuf> {
    if !looks_like_repo_id(repo_id) || repo_id.starts_with('.') {
        return None;
    }
    let cached = cache.model(repo_id.to_string());
    let dir = cached.get("config.json")?.parent()?.to_path_buf();
    dir.join("tokenizer.json").is_file().then_some(dir)
}

/// The Hugging Face repo ids whose model files are all in the cache, sorted.
pub fn cached_repos() -> Vec<String> {
    cached_repos_in(&hf_hub::Cache::from_env())
}

fn cached_repos_in(cache: &hf_hub::Cache) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(cache.path())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (org, repo) = name.strip_prefix("models--")?.split_once("--")?;
            Some(format!("{org}/{repo}"))
        })
        .filter(|id| cached_repo_in(cache, id).is_some())
        .collect();
    ids.sort();
    ids
}

fn download_repo(repo_id: &str) -> Result<PathBuf> {
    if let Some(dir) = cached_repo(repo_id) {
        return Ok(dir);
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .context("setting up the Hugging Face client")?;
    let repo = api.model(repo_id.to_string());
    let info = repo.info().with_context(|| {
        format!("model {repo_id:?} is neither a local directory nor reachable on the Hub")
    })?;
    let mut dir = None;
    for sibling in info.siblings {
        let name = sibling.rfilename;
        let wanted = name.ends_with(".safetensors")
            || name.ends_with(".json")
            || name.ends_with(".jinja")
            || name == "tokenizer.model";
        if wanted && !name.contains('/') {
            let local = repo
                .get(&name)
                .with_context(|| format!("downloading {name} of {repo_id}"))?;
            dir = local.parent().map(Path::to_path_buf);
        }
    }
    dir.with_context(|| format!("{repo_id} has no model files"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(root: &Path, repo: &str, files: &[&str]) -> PathBuf {
        let dir = root.join(format!("models--{repo}/snapshots/abc"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in files {
            std::fs::write(dir.join(f), "{}").unwrap();
        }
        std::fs::create_dir_all(root.join(format!("models--{repo}/refs"))).unwrap();
        std::fs::write(root.join(format!("models--{repo}/refs/main")), "abc").unwrap();
        dir
    }

    #[test]
    fn cached_repos_are_those_whose_model_files_are_all_there() {
        let tmp = tempfile::tempdir().unwrap();
        let tiny = snapshot(tmp.path(), "org--tiny", &["config.json", "tokenizer.json"]);
        snapshot(tmp.path(), "org--partial", &["config.json"]);
        std::fs::create_dir_all(tmp.path().join("datasets--org--data")).unwrap();
        let cache = hf_hub::Cache::new(tmp.path().to_path_buf());
        assert_eq!(cached_repos_in(&cache), vec!["org/tiny"]);
        assert_eq!(cached_repo_in(&cache, "org/tiny"), Some(tiny));
        assert_eq!(cached_repo_in(&cache, "org/partial"), None);
        assert_eq!(cached_repo_in(&cache, "../x"), None);
    }
}
