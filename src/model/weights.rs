//! The tensors of a model directory, consumed by the layers as they load.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::{Array, Dtype};

use super::layers::QuantSpec;
use crate::mlx_ext::cast_float;

pub struct Weights {
    tensors: HashMap<String, Array>,
    quantization: Option<serde_json::Value>,
    compute_dtype: Dtype,
}

impl Weights {
    /// Loads every `*.safetensors` file of `dir`, casting floating tensors to
    /// `compute_dtype`.
    pub fn load_dir(
        dir: &Path,
        quantization: Option<serde_json::Value>,
        compute_dtype: Dtype,
    ) -> Result<Self> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|e| e == "safetensors")
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("adapters"))
            })
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("no *.safetensors weights in {}", dir.display());
        }
        let mut tensors = HashMap::new();
        for file in &files {
            let loaded = Array::load_safetensors(file)
                .map_err(|e| anyhow!("loading {}: {e}", file.display()))?;
            tensors.extend(loaded);
        }
        Self::from_map(tensors, quantization, compute_dtype)
    }

    pub fn from_map(
        tensors: HashMap<String, Array>,
        quantization: Option<serde_json::Value>,
        compute_dtype: Dtype,
    ) -> Result<Self> {
        let tensors = tensors
            .into_iter()
            .map(|(k, v)| Ok((k, cast_float(v, compute_dtype)?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            tensors,
            quantization,
            compute_dtype,
        })
    }

    pub fn compute_dtype(&self) -> Dtype {
        self.compute_dtype
    }

    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.nbytes()).sum()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors
            .remove(name)
            .ok_or_else(|| anyhow!("missing tensor {name:?} in the model weights"))
    }

    pub fn take_opt(&mut self, name: &str) -> Result<Option<Array>> {
        Ok(self.tensors.remove(name))
    }

    /// The quantization of the layer at `prefix`, if its weights are quantized.
    pub fn quant_spec(&self, prefix: &str) -> Option<QuantSpec> {
        if !self.tensors.contains_key(&format!("{prefix}.scales")) {
            return None;
        }
        let q = self.quantization.as_ref();
        let read = |v: &serde_json::Value| -> Option<QuantSpec> {
            Some(QuantSpec {
                group_size: v.get("group_size")?.as_i64()? as i32,
                bits: v.get("bits")?.as_i64()? as i32,
            })
        };
        q.and_then(|q| q.get(prefix).and_then(read))
            .or_else(|| q.and_then(read))
            .or_else(|| self.infer_spec(prefix))
    }

    /// Infers group size and bits from the packed shapes (group 32 or 64).
    fn infer_spec(&self, prefix: &str) -> Option<QuantSpec> {
        let packed = self.tensors.get(&format!("{prefix}.weight"))?.shape()[1];
        let groups = self.tensors.get(&format!("{prefix}.scales"))?.shape()[1];
        for group_size in [64, 32, 128] {
            let cols = groups * group_size;
            if (packed * 32) % cols == 0 {
                let bits = packed * 32 / cols;
                if [2, 3, 4, 5, 6, 8].contains(&bits) {
                    return Some(QuantSpec { group_size, bits });
                }
            }
        }
        None
    }

    /// Names left unconsumed (a sign of a mismatched architecture).
    pub fn remaining(&self) -> Vec<String> {
        let mut names: Vec<_> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }
}
