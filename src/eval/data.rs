//! Evaluation and distillation data: a local plain-text file (one
//! document), a JSONL or parquet file (one row per line or row), a folder of
//! such files, or a Hugging Face dataset repo holding them (its `train`
//! split, found as `datasets` finds it). Rows are read whole
//! ([`load_records`]: text, chat or prompt/completion rows, as mlx-lm's
//! datasets) or as their `text` field ([`load_documents`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One dataset row (a JSON object) and where it was read (`FILE line N`,
/// `FILE row N`, or the file for a whole plain-text document).
#[derive(Clone, Debug)]
pub struct Record {
    /// The row.
    pub value: Value,
    /// Where it was read, for error messages.
    pub at: String,
}

impl Record {
    /// A plain-text document as a `{"text": ...}` row.
    pub fn text(text: &str, at: &str) -> Self {
        Self {
            value: serde_json::json!({ "text": text }),
            at: at.to_string(),
        }
    }
}

/// The data files at `spec`: a local file or folder, else a Hub dataset id.
fn data_files(spec: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(spec);
    if path.exists() {
        local_files(path)
    } else if looks_like_repo_id(spec) {
        hub_files(spec)
    } else {
        bail!("data {spec:?} is neither a local file or folder nor a Hugging Face dataset id");
    }
}

/// The documents at `spec` (the `text` field of each row).
pub(crate) fn load_documents(spec: &str) -> Result<Vec<String>> {
    let mut docs = Vec::new();
    for file in &data_files(spec)? {
        docs.extend(read_file(file)?);
    }
    if docs.is_empty() {
        bail!("data {spec:?} holds no text");
    }
    Ok(docs)
}

/// Every row at `spec`, whole, in file order (files in the order
/// `datasets` reads them). A plain-text file is one `{"text"}` row.
pub fn load_records(spec: &str) -> Result<Vec<Record>> {
    let mut rows = Vec::new();
    for file in &data_files(spec)? {
        rows.extend(read_records(file)?);
    }
    if rows.is_empty() {
        bail!("data {spec:?} holds no rows");
    }
    Ok(rows)
}

/// The rows of one file: JSONL lines, parquet rows (every column), or the
/// whole file as one text row.
fn read_records(path: &Path) -> Result<Vec<Record>> {
    let ext = path.extension().and_then(|e| e.to_str());
    if ext == Some("parquet") {
        return read_parquet_rows(path);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if ext != Some("jsonl") {
        return Ok(if text.is_empty() {
            vec![]
        } else {
            vec![Record::text(&text, &path.display().to_string())]
        });
    }
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{} line {}", path.display(), i + 1);
        let value: Value = serde_json::from_str(line).with_context(|| format!("{at}: not JSON"))?;
        if !value.is_object() {
            bail!("{at}: not a JSON object");
        }
        rows.push(Record { value, at });
    }
    Ok(rows)
}

/// Every row of a parquet file, each column a JSON field (lists and
/// structs as JSON arrays and objects, as `datasets` gives them).
fn read_parquet_rows(path: &Path) -> Result<Vec<Record>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};

    let at = path.display();
    let file = std::fs::File::open(path).with_context(|| format!("opening {at}"))?;
    let reader =
        SerializedFileReader::new(file).with_context(|| format!("{at}: not a parquet file"))?;
    let rows = reader
        .get_row_iter(None)
        .with_context(|| format!("{at}: reading rows"))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.with_context(|| format!("{at}: row {i}"))?;
        out.push(Record {
            value: row.to_json_value(),
            at: format!("{at} row {i}"),
        });
    }
    Ok(out)
}

fn looks_like_repo_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2 && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
}

fn is_text_file(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("txt" | "jsonl" | "md" | "text" | "parquet")
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
        bail!(
            "folder {} has no .txt, .jsonl or .parquet files",
            path.display()
        );
    }
    Ok(files)
}

/// The file formats read from a Hub dataset, in the order a tie between
/// them is broken.
const HUB_FORMATS: [&str; 3] = ["parquet", "jsonl", "txt"];

/// The `train` split's data files of a Hub dataset repo, downloaded (with
/// progress bars) into the Hub cache. The split is found as the `datasets`
/// library finds it for `load_dataset(id, split="train")`, the call
/// `mlx_lm.perplexity` makes: the default config's `data_files` from the
/// README's `configs:` when it declares them, else files or folders named
/// by the split keywords (`train`, `training`), else every data file. Of
/// those, the most common format among parquet, JSONL and text is read.
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
    // Sorted, as `datasets` orders the files a pattern resolves to.
    let mut names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    names.sort();
    let configs = if names.iter().any(|n| n == "README.md") {
        let card = repo
            .get("README.md")
            .with_context(|| format!("downloading README.md of dataset {repo_id}"))?;
        let card = std::fs::read_to_string(&card)
            .with_context(|| format!("reading {}", card.display()))?;
        card_train_patterns(&card).with_context(|| format!("dataset {repo_id}: README.md"))?
    } else {
        None
    };
    let split = match configs {
        Some(patterns) => files_matching(&names, &patterns)?,
        None => train_split_files(&names),
    };
    let split = match split {
        Some(files) if !files.is_empty() => files,
        _ => bail!(
            "dataset {repo_id} has no train split (files: {})",
            names.join(", ")
        ),
    };
    let chosen = most_common_format(&split).with_context(|| {
        format!(
            "dataset {repo_id}: no parquet, JSONL or text files in its train split ({})",
            split.join(", ")
        )
    })?;
    chosen
        .into_iter()
        .map(|n| {
            repo.get(&n)
                .with_context(|| format!("downloading {n} of dataset {repo_id}"))
        })
        .collect()
}

/// The data format of a repo file (`None` for cards, configs and others).
fn data_format(name: &str) -> Option<&'static str> {
    let ext = Path::new(name).extension()?.to_str()?;
    HUB_FORMATS
        .into_iter()
        .find(|f| *f == ext || (*f == "txt" && ext == "text"))
}

/// The files of the format most of `files` have (ties: parquet first).
fn most_common_format(files: &[String]) -> Option<Vec<String>> {
    let count = |f: &str| files.iter().filter(|n| data_format(n) == Some(f)).count();
    let best = HUB_FORMATS
        .into_iter()
        .filter(|f| count(f) > 0)
        .max_by_key(|f| {
            (
                count(f),
                std::cmp::Reverse(HUB_FORMATS.iter().position(|x| x == f)),
            )
        })?;
    Some(
        files
            .iter()
            .filter(|n| data_format(n) == Some(best))
            .cloned()
            .collect(),
    )
}

/// The `train` data-file patterns of the default config a dataset card
/// declares (`configs:` in its YAML header): the config marked
/// `default: true`, else the one named `default`, else the only one.
/// `None` when the card declares no configs.
fn card_train_patterns(card: &str) -> Result<Option<Vec<String>>> {
    let Some(rest) = card.strip_prefix("---") else {
        return Ok(None);
    };
    let Some(end) = rest.find("\n---") else {
        return Ok(None);
    };
    let meta: serde_yaml::Value =
        serde_yaml::from_str(&rest[..end]).context("its YAML header does not parse")?;
    let Some(configs) = meta.get("configs").and_then(|c| c.as_sequence()) else {
        return Ok(None);
    };
    let name = |c: &serde_yaml::Value| {
        c.get("config_name")
            .and_then(|n| n.as_str())
            .unwrap_or("default")
            .to_string()
    };
    let config = configs
        .iter()
        .find(|c| c.get("default").and_then(|d| d.as_bool()) == Some(true))
        .or_else(|| configs.iter().find(|c| name(c) == "default"))
        .or(if configs.len() == 1 {
            configs.first()
        } else {
            None
        })
        .with_context(|| {
            let names: Vec<String> = configs.iter().map(name).collect();
            format!(
                "it declares several configs and none is the default ({})",
                names.join(", ")
            )
        })?;
    let as_list = |v: &serde_yaml::Value| -> Vec<String> {
        match v {
            serde_yaml::Value::String(s) => vec![s.clone()],
            serde_yaml::Value::Sequence(s) => s
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    };
    let patterns = match config.get("data_files") {
        None => return Ok(None),
        // A list of {split, path} entries: the train ones.
        Some(serde_yaml::Value::Sequence(items)) if items.iter().all(|i| i.is_mapping()) => items
            .iter()
            .filter(|i| i.get("split").and_then(|n| n.as_str()) == Some("train"))
            .flat_map(|i| i.get("path").map(as_list).unwrap_or_default())
            .collect(),
        Some(serde_yaml::Value::Mapping(m)) => m.get("train").map(as_list).unwrap_or_default(),
        // One pattern or a list of them: every file is the train split.
        Some(v) => as_list(v),
    };
    Ok(Some(patterns))
}

/// The repo files matching any of the card's glob `patterns`.
fn files_matching(names: &[String], patterns: &[String]) -> Result<Option<Vec<String>>> {
    let mut globs = Vec::new();
    for p in patterns {
        globs.push(glob::Pattern::new(p).with_context(|| format!("bad data_files pattern {p:?}"))?);
    }
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    Ok(Some(
        names
            .iter()
            .filter(|n| globs.iter().any(|g| g.matches_with(n, opts)))
            .cloned()
            .collect(),
    ))
}

/// `datasets`' split inference without a card: the split keywords in file
/// names (`data/train-00000-of-00001.parquet`, `train.jsonl`,
/// `my_training_set.txt`) or folder names (`train/part1.parquet`), each
/// keyword bounded by `-._ `, digits or `/`. When no file names any split
/// every data file is the train split; when some do but none names
/// `train`, there is no train split (`None`).
fn train_split_files(names: &[String]) -> Option<Vec<String>> {
    const TRAIN: [&str; 2] = ["train", "training"];
    const OTHERS: [&str; 8] = [
        "validation",
        "valid",
        "dev",
        "val",
        "test",
        "testing",
        "eval",
        "evaluation",
    ];
    let data: Vec<&String> = names.iter().filter(|n| !is_repo_metadata(n)).collect();
    for in_dirs in [false, true] {
        let names_split = |n: &str, words: &[&str]| {
            words.iter().any(|w| {
                if in_dirs {
                    keyword_in_dirs(n, w)
                } else {
                    keyword_in_file_name(n, w)
                }
            })
        };
        let train: Vec<String> = data
            .iter()
            .filter(|n| names_split(n, &TRAIN))
            .map(|n| n.to_string())
            .collect();
        if !train.is_empty() {
            return Some(train);
        }
        if data.iter().any(|n| names_split(n, &OTHERS)) {
            return None;
        }
    }
    Some(data.into_iter().cloned().collect())
}

/// Files of a dataset repo that are not data: dotfiles, cards, scripts.
fn is_repo_metadata(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with('.') || file.ends_with(".md") || file.ends_with(".py")
}

fn is_separator(c: char) -> bool {
    matches!(c, '-' | '.' | '_' | ' ') || c.is_ascii_digit()
}

/// `keyword` in the file-name part of `path`, preceded by a separator or
/// the start of a path component and followed by a separator.
fn keyword_in_file_name(path: &str, keyword: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.match_indices(keyword).any(|(i, _)| {
        let before_ok = i == 0 || file[..i].ends_with(is_separator);
        let after = &file[i + keyword.len()..];
        before_ok && after.starts_with(is_separator)
    })
}

/// `keyword` as a folder of `path`, alone or followed by separators.
fn keyword_in_dirs(path: &str, keyword: &str) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    parts.pop();
    parts.iter().any(|dir| {
        dir.match_indices(keyword).any(|(i, _)| {
            let before_ok = i == 0 || dir[..i].ends_with(is_separator);
            let after = &dir[i + keyword.len()..];
            before_ok && (after.is_empty() || after.starts_with(is_separator))
        })
    })
}

/// Documents of one file: parquet or JSONL rows' `text` fields, else the
/// whole file.
fn read_file(path: &Path) -> Result<Vec<String>> {
    if path.extension().and_then(|e| e.to_str()) == Some("parquet") {
        return read_parquet(path);
    }
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

/// The `text` column of a parquet file (the column `mlx_lm`'s text datasets
/// read), row by row. Only that column is decoded. Datasets of chat
/// `messages` or `prompt`/`completion` pairs are refused by name.
fn read_parquet(path: &Path) -> Result<Vec<String>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    let at = path.display();
    let file = std::fs::File::open(path).with_context(|| format!("opening {at}"))?;
    let reader =
        SerializedFileReader::new(file).with_context(|| format!("{at}: not a parquet file"))?;
    let schema = reader.metadata().file_metadata().schema();
    let columns: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
    let Some(text) = schema.get_fields().iter().find(|f| f.name() == "text") else {
        let kind = if columns.contains(&"messages") {
            " (a chat dataset: only text datasets are read)"
        } else if columns.contains(&"prompt") && columns.contains(&"completion") {
            " (a prompt/completion dataset: only text datasets are read)"
        } else {
            ""
        };
        bail!(
            "{at}: no column \"text\"{kind}; its columns: {}",
            columns.join(", ")
        );
    };
    if !text.is_primitive() {
        bail!("{at}: column \"text\" is not a string column");
    }
    let projection = parquet::schema::types::Type::group_type_builder(schema.name())
        .with_fields(vec![text.clone()])
        .build()
        .with_context(|| format!("{at}: selecting column \"text\""))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .with_context(|| format!("{at}: reading column \"text\""))?;
    let mut docs = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.with_context(|| format!("{at}: row {i}"))?;
        match row.get_column_iter().next().map(|(_, f)| f) {
            Some(Field::Str(s)) => docs.push(s.clone()),
            Some(Field::Bytes(b)) => docs.push(
                String::from_utf8(b.data().to_vec())
                    .with_context(|| format!("{at}: row {i}: \"text\" is not UTF-8"))?,
            ),
            Some(Field::Null) | None => bail!("{at}: row {i}: \"text\" is null"),
            Some(other) => bail!("{at}: row {i}: \"text\" is not a string ({other})"),
        }
    }
    Ok(docs)
}
