//! Text documents for evaluation and distillation: a local plain-text file
//! (one document), a JSONL file (one document per line, its `text` field),
//! a folder of such files, or a Hugging Face dataset repo holding them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The documents at `spec`: a local file or folder, else a Hub dataset id.
pub fn load_documents(spec: &str) -> Result<Vec<String>> {
    let path = Path::new(spec);
    let files = if path.exists() {
        local_files(path)?
    } else if looks_like_repo_id(spec) {
        hub_files(spec)?
    } else {
        bail!("data {spec:?} is neither a local file or folder nor a Hugging Face dataset id");
    };
    let mut docs = Vec::new();
    for file in &files {
        docs.extend(read_file(file)?);
    }
    if docs.is_empty() {
        bail!("data {spec:?} holds no text");
    }
    Ok(docs)
}

fn looks_like_repo_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2 && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
}

fn is_text_file(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("txt" | "jsonl" | "md" | "text")
    )
}

/// A file, or a folder's data files: `train.jsonl` when it has one (the
/// layout `mlx_lm.lora` reads), else every text/JSONL file in name order.
fn local_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let train = path.join("train.jsonl");
    if train.is_file() {
        return Ok(vec![train]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading folder {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_text_file(p))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("folder {} has no .txt or .jsonl files", path.display());
    }
    Ok(files)
}

/// The train-split text/JSONL files of a Hub dataset repo (parquet-only
/// datasets are refused: no parquet reader is built in).
fn hub_files(repo_id: &str) -> Result<Vec<PathBuf>> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .context("setting up the Hugging Face client")?;
    let repo = api.repo(hf_hub::Repo::new(
        repo_id.to_string(),
        hf_hub::RepoType::Dataset,
    ));
    let info = repo.info().with_context(|| {
        format!("dataset {repo_id:?} is neither a local path nor reachable on the Hub")
    })?;
    let names: Vec<String> = info
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .filter(|n| is_text_file(Path::new(n)))
        .collect();
    let train: Vec<&String> = names.iter().filter(|n| n.contains("train")).collect();
    let chosen: Vec<&String> = if train.is_empty() {
        names.iter().collect()
    } else {
        train
    };
    if chosen.is_empty() {
        bail!("dataset {repo_id} has no .txt or .jsonl files (parquet is not supported)");
    }
    chosen
        .into_iter()
        .map(|n| {
            repo.get(n)
                .with_context(|| format!("downloading {n} of dataset {repo_id}"))
        })
        .collect()
}

/// Documents of one file: JSONL rows' `text` fields, else the whole file.
fn read_file(path: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
        return Ok(if text.is_empty() { vec![] } else { vec![text] });
    }
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let t = row.get("text").and_then(|t| t.as_str()).with_context(|| {
            format!(
                "{} line {}: no string field \"text\"",
                path.display(),
                i + 1
            )
        })?;
        docs.push(t.to_string());
    }
    Ok(docs)
}
