//! Where models come from: a local directory, a Hugging Face repo id (cache
//! first, `HF_ENDPOINT` respected), or the embedded default model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The user cache folder of mlx-bun (the settings' `cache_dir`).
pub fn cache_dir() -> PathBuf {
    crate::settings::get().cache_dir.clone()
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

/// Resolves a model to a local directory, with the Hub repo id when it came
/// from the Hub (a converted model's `base_model`).
pub fn resolve_source(spec: &str) -> Result<(PathBuf, Option<String>)> {
    let dir = resolve_model(spec)?;
    let from_hub = !Path::new(spec).exists();
    Ok((dir, from_hub.then(|| spec.to_string())))
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
        // mlx-lm's download patterns.
        let wanted = (name.starts_with("model") && name.ends_with(".safetensors"))
            || name.ends_with(".json")
            || name.ends_with(".jinja")
            || name.ends_with(".py")
            || name.ends_with(".tiktoken")
            || name.ends_with(".txt")
            || name.ends_with(".jsonl")
            || name == "README.md"
            || name == "tokenizer.model"
            || name == "tiktoken.model";
        if wanted && !name.contains('/') {
            let local = repo
                .get(&name)
                .with_context(|| format!("downloading {name} of {repo_id}"))?;
            dir = local.parent().map(Path::to_path_buf);
        }
    }
    dir.with_context(|| format!("{repo_id} has no model files"))
}

/// The Hub's address: `HF_ENDPOINT`, else the default of the `hf-hub` client.
pub fn endpoint() -> Result<String> {
    if let Some(e) = std::env::var("HF_ENDPOINT").ok().filter(|s| !s.is_empty()) {
        return Ok(e.trim_end_matches('/').to_string());
    }
    let api = hf_hub::api::sync::ApiBuilder::new()
        .build()
        .context("setting up the Hugging Face client")?;
    let probe = api.model("o/r".to_string()).url("f");
    probe
        .strip_suffix("/o/r/resolve/main/f")
        .map(str::to_string)
        .context("cannot tell the Hub's address; set HF_ENDPOINT")
}

/// `HF_HOME`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    if let Some(h) = std::env::var_os("HF_HOME") {
        return PathBuf::from(h);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("huggingface")
}

/// The Hub token: `HF_TOKEN`, else the token file (`HF_TOKEN_PATH`, else
/// `$HF_HOME/token`). None when neither is set.
pub fn token() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Some(t.trim().to_string());
    }
    let path = std::env::var_os("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"));
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// The Hub cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`).
pub(crate) fn hub_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    hf_home().join("hub")
}

/// One repository in the Hub cache.
#[derive(Debug)]
pub struct CachedRepo {
    /// The repository id, such as `HuggingFaceTB/SmolLM2-135M-Instruct`.
    pub repo_id: String,
    /// `model`, `dataset` or `space`.
    pub repo_type: &'static str,
    /// Its directory in the cache.
    pub path: PathBuf,
    /// Bytes of its blobs.
    pub size: u64,
    /// Files across its snapshots.
    pub files: usize,
    /// The latest modification time among its files.
    pub last_modified: Option<std::time::SystemTime>,
    /// The latest access time among its files.
    pub last_accessed: Option<std::time::SystemTime>,
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path, &std::fs::Metadata)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, f);
        } else {
            f(&path, &meta);
        }
    }
}

/// Every repository in the Hub cache whose id contains `pattern`, sorted by path
/// (as `mlx_lm.manage --scan`).
pub fn scan_cache(pattern: &str) -> Result<Vec<CachedRepo>> {
    let root = hub_cache_dir();
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", root.display())),
    };
    let mut repos = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let (repo_type, rest) = match name.split_once("--") {
            Some(("models", r)) => ("model", r),
            Some(("datasets", r)) => ("dataset", r),
            Some(("spaces", r)) => ("space", r),
            _ => continue,
        };
        let repo_id = rest.replace("--", "/");
        if !repo_id.contains(pattern) {
            continue;
        }
        let path = entry.path();
        // As huggingface_hub counts: every file of every snapshot, and the
        // bytes of the distinct files they resolve to.
        let (mut size, mut files) = (0u64, 0usize);
        let (mut modified, mut accessed) = (None, None);
        let mut seen = std::collections::HashSet::new();
        walk(&path.join("snapshots"), &mut |file, _| {
            files += 1;
            let (Ok(real), Ok(meta)) = (std::fs::canonicalize(file), std::fs::metadata(file))
            else {
                return;
            };
            if !seen.insert(real) {
                return;
            }
            size += meta.len();
            let later = |a: Option<std::time::SystemTime>,
                         b: std::io::Result<std::time::SystemTime>| match (
                a,
                b.ok(),
            ) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            modified = later(modified, meta.modified());
            accessed = later(accessed, meta.accessed());
        });
        repos.push(CachedRepo {
            repo_id,
            repo_type,
            path,
            size,
            files,
            last_modified: modified,
            last_accessed: accessed,
        });
    }
    repos.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(repos)
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
