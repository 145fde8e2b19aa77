//! Writing safetensors files one tensor at a time: the header is computed
//! from shapes and dtypes up front, then each tensor's bytes are appended as
//! soon as it is evaluated, so a file never has to be held in memory whole.
//! Sharding and the index file follow mlx-lm's `save_model`.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};

/// mlx-lm's shard limit (`MAX_FILE_SIZE_GB` = 5, in GiB).
pub(crate) const MAX_SHARD_BYTES: u64 = 5 << 30;

/// What a tensor will be, before it is computed.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The tensor's name in the safetensors file.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<i32>,
}

impl TensorInfo {
    /// The name, dtype and shape of `a`, without evaluating it.
    pub fn of(name: &str, a: &Array) -> Self {
        Self {
            name: name.to_string(),
            dtype: a.dtype(),
            shape: a.shape().to_vec(),
        }
    }

    /// The size of its data in bytes.
    pub fn nbytes(&self) -> u64 {
        let n: u64 = self.shape.iter().map(|&d| d as u64).product();
        n * dtype_size(self.dtype)
    }
}

fn dtype_size(dtype: Dtype) -> u64 {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        _ => 8,
    }
}

fn dtype_tag(dtype: Dtype) -> Result<&'static str> {
    Ok(match dtype {
        Dtype::Bool => "BOOL",
        Dtype::Uint8 => "U8",
        Dtype::Int8 => "I8",
        Dtype::Uint16 => "U16",
        Dtype::Int16 => "I16",
        Dtype::Uint32 => "U32",
        Dtype::Int32 => "I32",
        Dtype::Uint64 => "U64",
        Dtype::Int64 => "I64",
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        Dtype::Float32 => "F32",
        Dtype::Float64 => "F64",
        other => bail!("safetensors cannot store {other:?}"),
    })
}

/// Splits units of tensors into shards as mlx-lm's `make_shards` does: a new
/// shard starts when the next tensor would pass the limit.
pub(crate) fn plan_shards(units: &[Vec<TensorInfo>], limit: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut size = 0u64;
    for (i, unit) in units.iter().enumerate() {
        let bytes: u64 = unit.iter().map(TensorInfo::nbytes).sum();
        if shards.is_empty() || (size + bytes > limit && size > 0) {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("a shard").push(i);
        size += bytes;
    }
    shards
}

/// The file name of shard `i` of `n` (mlx-lm's names).
pub(crate) fn shard_name(i: usize, n: usize) -> String {
    if n > 1 {
        format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
    } else {
        "model.safetensors".to_string()
    }
}

/// One safetensors file being written in the order its header lists.
pub(crate) struct ShardWriter {
    out: BufWriter<std::fs::File>,
    expected: std::vec::IntoIter<TensorInfo>,
    path: std::path::PathBuf,
}

impl ShardWriter {
    /// Creates `path` and writes the header for `tensors`, in that order.
    pub fn create(path: &Path, tensors: Vec<TensorInfo>) -> Result<Self> {
        let mut header = Map::new();
        header.insert("__metadata__".into(), json!({"format": "mlx"}));
        let mut offset = 0u64;
        for t in &tensors {
            let end = offset + t.nbytes();
            header.insert(
                t.name.clone(),
                json!({"dtype": dtype_tag(t.dtype)?, "shape": t.shape, "data_offsets": [offset, end]}),
            );
            offset = end;
        }
        let mut text = serde_json::to_vec(&Value::Object(header))?;
        while text.len() % 8 != 0 {
            text.push(b' ');
        }
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(text.len() as u64).to_le_bytes())?;
        out.write_all(&text)?;
        Ok(Self {
            out,
            expected: tensors.into_iter(),
            path: path.to_path_buf(),
        })
    }

    /// Appends the next tensor; it must match the header entry.
    pub fn write(&mut self, name: &str, array: &Array) -> Result<()> {
        let want = self
            .expected
            .next()
            .with_context(|| format!("{name} is not in the header of {}", self.path.display()))?;
        let got = TensorInfo::of(name, array);
        if (want.name.as_str(), want.dtype, &want.shape) != (name, got.dtype, &got.shape) {
            bail!(
                "tensor {name} came out as {:?} {:?}, but the header of {} promised {} {:?} {:?}",
                got.dtype,
                got.shape,
                self.path.display(),
                want.name,
                want.dtype,
                want.shape
            );
        }
        let dense = array
            .contiguous()
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("laying out {name}"))?;
        dense.eval().with_context(|| format!("computing {name}"))?;
        let len = want.nbytes() as usize;
        // SAFETY: `dense` is evaluated and row-contiguous, so its data is
        // `len` readable bytes that live as long as `dense`.
        let bytes = unsafe {
            let ptr = mlx_sys::mlx_array_data_uint8(dense.as_ptr());
            if ptr.is_null() && len > 0 {
                bail!("MLX returned no data for {name}");
            }
            std::slice::from_raw_parts(ptr, len)
        };
        self.out
            .write_all(bytes)
            .with_context(|| format!("writing {name} to {}", self.path.display()))
    }

    pub fn finish(mut self) -> Result<()> {
        if let Some(left) = self.expected.next() {
            bail!("{} was never written to {}", left.name, self.path.display());
        }
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// `model.safetensors.index.json` as mlx-lm writes it.
pub(crate) fn index_json(
    weight_map: &[(String, String)],
    total_size: u64,
    total_parameters: u64,
) -> Value {
    let mut sorted = weight_map.to_vec();
    sorted.sort();
    let map: Map<String, Value> = sorted.into_iter().map(|(k, v)| (k, json!(v))).collect();
    json!({
        "metadata": {"total_size": total_size, "total_parameters": total_parameters},
        "weight_map": map,
    })
}
