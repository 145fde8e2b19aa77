//! Writing a model directory all at once: everything goes into a hidden
//! staging directory next to the target, which is renamed into place at the
//! end, so a failed or interrupted conversion leaves nothing half-written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::quantize::TensorSet;

/// A directory being filled; removed on drop unless committed.
pub(crate) struct StagingDir {
    path: PathBuf,
    target: PathBuf,
    committed: bool,
}

/// What `commit` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Commit {
    /// The staged directory is now the target.
    Placed,
    /// Another writer placed the target first; the staged copy was discarded.
    AlreadyThere,
}

impl StagingDir {
    pub fn new(target: &Path) -> Result<Self> {
        let name = target
            .file_name()
            .with_context(|| format!("{} is not a directory name", target.display()))?
            .to_string_lossy()
            .into_owned();
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!(".{name}.partial-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the staged directory to the target.
    pub fn commit(mut self) -> Result<Commit> {
        match std::fs::rename(&self.path, &self.target) {
            Ok(()) => {
                self.committed = true;
                Ok(Commit::Placed)
            }
            Err(_) if self.target.is_dir() => Ok(Commit::AlreadyThere),
            Err(e) => Err(anyhow!(e)).with_context(|| {
                format!(
                    "moving {} into place at {}",
                    self.path.display(),
                    self.target.display()
                )
            }),
        }
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Fails when `out` already exists (conversions never overwrite).
pub fn require_absent(out: &Path) -> Result<()> {
    if out.exists() {
        bail!(
            "the output {} already exists; remove it or choose another path",
            out.display()
        );
    }
    Ok(())
}

pub(crate) fn write_json(dir: &Path, name: &str, value: &Value) -> Result<()> {
    let path = dir.join(name);
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes the tensors as `model.safetensors` with mlx-lm's metadata.
pub(crate) fn write_weights(dir: &Path, set: &TensorSet) -> Result<()> {
    let path = dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "mlx".to_string())]);
    mlx_rs::Array::save_safetensors(set.tensors.iter(), &metadata, &path)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_is_removed_unless_committed_and_loses_races_cleanly() {
        let root = std::env::temp_dir().join(format!("mlx-bun-staging-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let target = root.join("model");

        let dropped = StagingDir::new(&target).unwrap();
        let dropped_path = dropped.path().to_path_buf();
        drop(dropped);
        assert!(!dropped_path.exists());

        let first = StagingDir::new(&target).unwrap();
        let second = StagingDir::new(&target).unwrap();
        std::fs::write(first.path().join("a"), "1").unwrap();
        std::fs::write(second.path().join("b"), "2").unwrap();
        let second_path = second.path().to_path_buf();
        assert_eq!(first.commit().unwrap(), Commit::Placed);
        assert_eq!(second.commit().unwrap(), Commit::AlreadyThere);
        assert!(!second_path.exists());
        assert!(target.join("a").is_file() && !target.join("b").exists());
        assert!(require_absent(&target).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
