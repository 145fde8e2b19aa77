//! Training data: `train.jsonl` / `valid.jsonl` / `test.jsonl` in a directory,
//! one JSON object per line, each row tokenized by `dataset_rows` (SFT or
//! preference rows, as mlx-lm's datasets).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::dataset_rows::{preference_row, sft_row, PreferenceExample, SftExample};
use crate::tokenizer::Tokenizer;

/// The examples of one split file.
#[derive(Clone, Debug)]
pub enum Examples {
    /// Supervised fine-tuning rows (`text`, `prompt`/`completion` or `messages`).
    Sft(Vec<SftExample>),
    /// Preference rows (`prompt`, `chosen`, `rejected`), for ORPO.
    Preference(Vec<PreferenceExample>),
}

impl Examples {
    /// Number of examples.
    pub fn len(&self) -> usize {
        match self {
            Examples::Sft(v) => v.len(),
            Examples::Preference(v) => v.len(),
        }
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What kind of rows the training method needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// Supervised fine-tuning rows.
    Sft {
        /// Leave the prompt out of the loss (`--mask-prompt`).
        mask_prompt: bool,
    },
    /// Preference pairs (ORPO).
    Preference,
}

/// The tokenized splits of a data directory.
pub struct Splits {
    /// `train.jsonl`.
    pub train: Examples,
    /// `valid.jsonl`, if present.
    pub valid: Option<Examples>,
    /// `test.jsonl`, if present.
    pub test: Option<Examples>,
}

/// Loads `train.jsonl` (required), `valid.jsonl` and `test.jsonl` from `dir`.
pub fn load_splits(dir: &Path, tok: &Tokenizer, kind: RowKind) -> Result<Splits> {
    if !dir.is_dir() {
        bail!("data directory {} does not exist", dir.display());
    }
    let load = |name: &str| -> Result<Option<Examples>> {
        let path = dir.join(format!("{name}.jsonl"));
        if !path.is_file() {
            return Ok(None);
        }
        let ex = load_file(&path, tok, kind)?;
        Ok((!ex.is_empty()).then_some(ex))
    };
    let train = load("train")?.ok_or_else(|| {
        anyhow!(
            "no training examples: {} is missing or empty",
            dir.join("train.jsonl").display()
        )
    })?;
    Ok(Splits {
        train,
        valid: load("valid")?,
        test: load("test")?,
    })
}

/// Parses and tokenizes one JSONL file; errors name the file and line.
pub fn load_file(path: &Path, tok: &Tokenizer, kind: RowKind) -> Result<Examples> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut sft = Vec::new();
    let mut pref = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = Location {
            file: path.to_path_buf(),
            line: i + 1,
        };
        let row: Value =
            serde_json::from_str(line).map_err(|e| anyhow!("{at}: invalid JSON: {e}"))?;
        if !row.is_object() {
            bail!("{at}: each line must be a JSON object");
        }
        match kind {
            RowKind::Sft { mask_prompt } => {
                sft.push(sft_row(&row, tok, mask_prompt).map_err(|e| anyhow!("{at}: {e:#}"))?)
            }
            RowKind::Preference => {
                pref.push(preference_row(&row, tok).map_err(|e| anyhow!("{at}: {e:#}"))?)
            }
        }
    }
    Ok(match kind {
        RowKind::Sft { .. } => Examples::Sft(sft),
        RowKind::Preference => Examples::Preference(pref),
    })
}

struct Location {
    file: PathBuf,
    line: usize,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}", self.file.display(), self.line)
    }
}
