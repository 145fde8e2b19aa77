//! Splitting a loaded model across the ranks of a [`Group`].
//!
//! Tensor parallel (as mlx-lm's `shard`): q/k/v and gate/up are split along
//! their output rows (column-parallel), o/down along their input columns
//! (row-parallel, an `all_sum` after them); quantized weights split with
//! their scales and biases along whole groups. Heads are split by key/value
//! head, each rank keeping the query heads that share its key/value heads, so
//! uneven counts (9 heads, 3 KV heads on 2 ranks) split as 6+3.
//!
//! Pipeline parallel (as mlx-lm's `PipelineMixin`): each rank keeps a
//! contiguous range of layers, rank 0 the last ones; activations go from rank
//! r+1 to rank r by send/recv, and rank 0's output is gathered by every rank
//! so every rank computes the same logits.
//!
//! Reading only each rank's share: `Model::load` leaves MLX's safetensors
//! arrays unevaluated (nothing is read yet); this pass reads the shard of
//! every split tensor straight from its byte ranges in the file and drops the
//! unread full arrays, and pipeline ranks drop the layers they do not run.
//! Tensors every rank needs (embeddings, norms, head) are read whole.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::Array;

use crate::collective::Group;
use crate::model::decoder::FeedForward;
use crate::model::layers::{Linear, LinearWeight};
use crate::model::pipeline::PipelineStage;
use crate::model::Model;
use crate::quant::QuantSpec;

/// How a model is split across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallelism {
    /// Heads and MLP columns split across ranks (the default, as mlx-lm).
    Tensor,
    /// Layers split across ranks (`--pipeline`).
    Pipeline,
}

/// Splits `model` (as loaded by `Model::load`, before anything was
/// evaluated) across `group`. A group of one leaves the model as it is.
pub fn shard_model(model: &mut Model, group: &Group, mode: Parallelism) -> Result<()> {
    if group.size() < 2 {
        return Ok(());
    }
    const SHARDABLE: &[&str] = &["llama", "mistral", "qwen2", "qwen3"];
    if !SHARDABLE.contains(&model.args.model_type.as_str()) {
        bail!(
            "sharding {} models is not supported yet (supported: {})",
            model.args.model_type,
            SHARDABLE.join(", ")
        );
    }
    let files = TensorFiles::open(&model.path)?;
    match mode {
        Parallelism::Tensor => shard_tensor(model, group, &files),
        Parallelism::Pipeline => shard_pipeline(model, group),
    }
    .with_context(|| {
        format!(
            "sharding {} across {} ranks ({mode:?} parallel)",
            model.path.display(),
            group.size()
        )
    })
}

/// The layer range rank `rank` of `size` runs: even split, lower ranks take
/// the extra layers, rank 0 the last layers.
pub(crate) fn pipeline_range(layers: usize, rank: usize, size: usize) -> Range<usize> {
    let split: Vec<usize> = (0..size)
        .map(|r| layers / size + usize::from(r < layers % size))
        .collect();
    let start: usize = split[rank + 1..].iter().sum();
    start..start + split[rank]
}

fn shard_pipeline(model: &mut Model, group: &Group) -> Result<()> {
    let n = model.decoder.layers.len();
    if n < group.size() {
        bail!("{n} layers cannot be split across {} ranks", group.size());
    }
    let range = pipeline_range(n, group.rank(), group.size());
    let kept: Vec<_> = model.decoder.layers.drain(..).collect();
    model.decoder.layers = kept
        .into_iter()
        .skip(range.start)
        .take(range.len())
        .collect();
    if !model.decoder.options.layer_windows.is_empty() {
        let windows = &model.decoder.options.layer_windows;
        model.decoder.options.layer_windows = windows[range].to_vec();
    }
    model.decoder.pipeline = Some(PipelineStage::new(group));
    Ok(())
}

/// Part `rank` of `n` units split in `size` near-equal contiguous parts.
fn part(n: i32, rank: usize, size: usize) -> Range<i32> {
    let (rank, size) = (rank as i64, size as i64);
    let start = (n as i64 * rank / size) as i32;
    let end = (n as i64 * (rank + 1) / size) as i32;
    start..end
}

fn scaled(r: &Range<i32>, k: i32) -> Range<i32> {
    r.start * k..r.end * k
}

fn shard_tensor(model: &mut Model, group: &Group, files: &TensorFiles) -> Result<()> {
    let (rank, size) = (group.rank(), group.size());
    let args = &model.args;
    let (heads, kv_heads) = (args.num_attention_heads, args.kv_heads());
    if kv_heads < size as i32 {
        bail!(
            "tensor parallelism splits key/value heads: {kv_heads} cannot be split across {size} \
             ranks (use --pipeline)"
        );
    }
    let head_dim = args.head_dim();
    let kv = part(kv_heads, rank, size);
    let q = scaled(&kv, heads / kv_heads);
    let dtype = model.dtype;
    for (i, layer) in model.decoder.layers.iter_mut().enumerate() {
        let p = format!("model.layers.{i}");
        let attn = &mut layer.self_attn;
        let cut = Cut { files, dtype };
        cut.rows(
            &mut attn.q_proj,
            &format!("{p}.self_attn.q_proj"),
            scaled(&q, head_dim),
        )?;
        cut.rows(
            &mut attn.k_proj,
            &format!("{p}.self_attn.k_proj"),
            scaled(&kv, head_dim),
        )?;
        cut.rows(
            &mut attn.v_proj,
            &format!("{p}.self_attn.v_proj"),
            scaled(&kv, head_dim),
        )?;
        cut.columns(
            &mut attn.o_proj,
            &format!("{p}.self_attn.o_proj"),
            scaled(&q, head_dim),
            group,
        )?;
        attn.n_heads = q.len() as i32;
        attn.n_kv_heads = kv.len() as i32;
        let mlp = match &mut layer.mlp {
            FeedForward::Dense(mlp) => mlp,
            FeedForward::Sparse(_) => {
                bail!("{p}: tensor parallelism does not split mixture-of-experts layers yet")
            }
        };
        let (hidden, _) = mlp.gate_proj.shape();
        let unit = match &mlp.down_proj.weight {
            LinearWeight::Quantized { spec, .. } => spec.group_size,
            LinearWeight::Dense(_) => 1,
        };
        if hidden % unit != 0 {
            bail!("{p}.mlp: {hidden} columns are not whole groups of {unit}");
        }
        let cols = scaled(&part(hidden / unit, rank, size), unit);
        cut.rows(
            &mut mlp.gate_proj,
            &format!("{p}.mlp.gate_proj"),
            cols.clone(),
        )?;
        cut.rows(&mut mlp.up_proj, &format!("{p}.mlp.up_proj"), cols.clone())?;
        cut.columns(
            &mut mlp.down_proj,
            &format!("{p}.mlp.down_proj"),
            cols,
            group,
        )?;
    }
    Ok(())
}

/// Replaces a Linear's tensors by this rank's slice, read from the files.
struct Cut<'a> {
    files: &'a TensorFiles,
    dtype: mlx_rs::Dtype,
}

impl Cut<'_> {
    fn read(
        &self,
        name: &str,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Array> {
        let a = self.files.read(name, rows, cols)?;
        crate::mlx_ext::cast_float(a, self.dtype)
    }

    /// The slice of `{prefix}.biases`, for the modes that store them.
    fn read_biases(
        &self,
        prefix: &str,
        spec: QuantSpec,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Option<Array>> {
        if !spec.mode.has_biases() {
            return Ok(None);
        }
        Ok(Some(self.read(&format!("{prefix}.biases"), rows, cols)?))
    }

    fn check_lora(linear: &Linear, prefix: &str) -> Result<()> {
        if linear.lora.is_some() {
            bail!("{prefix} has a LoRA adapter; fuse it first (adapters are not sharded)");
        }
        Ok(())
    }

    /// Column-parallel: output rows `rows` (weight, scales, biases, bias).
    fn rows(&self, linear: &mut Linear, prefix: &str, rows: Range<i32>) -> Result<()> {
        Self::check_lora(linear, prefix)?;
        let r = || Some(rows.clone());
        linear.weight = match &linear.weight {
            LinearWeight::Dense(_) => {
                LinearWeight::Dense(self.read(&format!("{prefix}.weight"), r(), None)?)
            }
            LinearWeight::Quantized { spec, .. } => LinearWeight::Quantized {
                weight: self.read(&format!("{prefix}.weight"), r(), None)?,
                scales: self.read(&format!("{prefix}.scales"), r(), None)?,
                biases: self.read_biases(prefix, *spec, r(), None)?,
                spec: *spec,
            },
        };
        if linear.bias.is_some() {
            linear.bias = Some(self.read(&format!("{prefix}.bias"), r(), None)?);
        }
        Ok(())
    }

    /// Row-parallel: input columns `cols`; the partial products are summed
    /// across ranks, and the bias is added once (by rank 0).
    fn columns(
        &self,
        linear: &mut Linear,
        prefix: &str,
        cols: Range<i32>,
        group: &Group,
    ) -> Result<()> {
        Self::check_lora(linear, prefix)?;
        linear.weight = match &linear.weight {
            LinearWeight::Dense(_) => {
                LinearWeight::Dense(self.read(&format!("{prefix}.weight"), None, Some(cols))?)
            }
            LinearWeight::Quantized { spec, .. } => {
                let (gs, per_word) = (spec.group_size, 32 / spec.bits);
                if cols.start % gs != 0 || cols.end % gs != 0 || 32 % spec.bits != 0 {
                    bail!(
                        "{prefix}: columns {cols:?} do not fall on quantization groups of {gs} \
                         ({} bits)",
                        spec.bits
                    );
                }
                let packed = cols.start / per_word..cols.end / per_word;
                let groups = cols.start / gs..cols.end / gs;
                LinearWeight::Quantized {
                    weight: self.read(&format!("{prefix}.weight"), None, Some(packed))?,
                    scales: self.read(&format!("{prefix}.scales"), None, Some(groups.clone()))?,
                    biases: self.read_biases(prefix, *spec, None, Some(groups))?,
                    spec: *spec,
                }
            }
        };
        if group.rank() != 0 {
            linear.bias = None;
        }
        linear.all_sum = Some(group.clone());
        Ok(())
    }
}

/// Where each tensor of a model directory lies in its safetensors files.
struct TensorFiles {
    tensors: HashMap<String, (PathBuf, TensorInfo)>,
}

#[derive(serde::Deserialize)]
struct TensorInfo {
    dtype: String,
    shape: Vec<i64>,
    data_offsets: [u64; 2],
    #[serde(skip)]
    data_start: u64,
}

impl TensorFiles {
    fn open(dir: &Path) -> Result<Self> {
        let mut tensors = HashMap::new();
        for path in crate::model::weights::weight_files(dir)? {
            let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            let mut len = [0u8; 8];
            file.read_exact_at(&mut len, 0)
                .with_context(|| format!("reading the header of {}", path.display()))?;
            let n = u64::from_le_bytes(len);
            if n > 100 << 20 {
                bail!("{}: safetensors header of {n} bytes", path.display());
            }
            let mut header = vec![0u8; n as usize];
            file.read_exact_at(&mut header, 8)
                .with_context(|| format!("reading the header of {}", path.display()))?;
            let mut map: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
                .with_context(|| format!("parsing the header of {}", path.display()))?;
            map.remove("__metadata__");
            for (name, v) in map {
                let mut info: TensorInfo = serde_json::from_value(v)
                    .with_context(|| format!("{}: tensor {name}", path.display()))?;
                info.data_start = 8 + n;
                tensors.insert(name, (path.clone(), info));
            }
        }
        Ok(Self { tensors })
    }

    /// Reads `rows` × `cols` of a 1- or 2-D tensor (`None`: all of that axis).
    fn read(
        &self,
        name: &str,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Array> {
        let (path, info) = self
            .tensors
            .get(name)
            .ok_or_else(|| anyhow!("tensor {name} is not in the weight files"))?;
        let (item, dtype) =
            dtype_of(&info.dtype).with_context(|| format!("{}: tensor {name}", path.display()))?;
        let (n_rows, n_cols) = match info.shape[..] {
            [r] => (r, 1),
            [r, c] => (r, c),
            _ => bail!("{}: tensor {name} is not 1- or 2-D", path.display()),
        };
        let rows = rows.map_or(0..n_rows, |r| r.start as i64..r.end as i64);
        let cols = cols.map_or(0..n_cols, |c| c.start as i64..c.end as i64);
        if rows.end > n_rows || cols.end > n_cols || rows.is_empty() || cols.is_empty() {
            bail!(
                "{}: tensor {name} {:?} has no slice rows {rows:?} × columns {cols:?}",
                path.display(),
                info.shape
            );
        }
        let expected = (n_rows * n_cols) as u64 * item as u64;
        if info.data_offsets[1] - info.data_offsets[0] != expected {
            bail!(
                "{}: tensor {name} has the wrong number of bytes",
                path.display()
            );
        }
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let base = info.data_start + info.data_offsets[0];
        let row_bytes = (cols.end - cols.start) as usize * item;
        let mut data = vec![0u8; (rows.end - rows.start) as usize * row_bytes];
        if cols.start == 0 && cols.end == n_cols {
            let at = base + (rows.start * n_cols) as u64 * item as u64;
            file.read_exact_at(&mut data, at)
        } else {
            data.chunks_mut(row_bytes)
                .zip(rows.clone())
                .try_for_each(|(out, r)| {
                    let at = base + (r * n_cols + cols.start) as u64 * item as u64;
                    file.read_exact_at(out, at)
                })
        }
        .with_context(|| format!("reading tensor {name} from {}", path.display()))?;
        let shape: Vec<i32> = if info.shape.len() == 1 {
            vec![(rows.end - rows.start) as i32]
        } else {
            vec![
                (rows.end - rows.start) as i32,
                (cols.end - cols.start) as i32,
            ]
        };
        // SAFETY: `data` holds exactly product(shape) elements of `dtype`;
        // MLX copies it into a new array.
        Ok(unsafe {
            Array::from_ptr(mlx_sys::mlx_array_new_data(
                data.as_ptr().cast(),
                shape.as_ptr(),
                shape.len() as i32,
                dtype,
            ))
        })
    }
}

fn dtype_of(name: &str) -> Result<(usize, mlx_sys::mlx_dtype)> {
    Ok(match name {
        "F32" => (4, mlx_sys::mlx_dtype__MLX_FLOAT32),
        "F16" => (2, mlx_sys::mlx_dtype__MLX_FLOAT16),
        "BF16" => (2, mlx_sys::mlx_dtype__MLX_BFLOAT16),
        "U32" => (4, mlx_sys::mlx_dtype__MLX_UINT32),
        "I32" => (4, mlx_sys::mlx_dtype__MLX_INT32),
        "U8" => (1, mlx_sys::mlx_dtype__MLX_UINT8),
        "I8" => (1, mlx_sys::mlx_dtype__MLX_INT8),
        other => bail!("dtype {other} cannot be sharded"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_ranges_cover_the_layers_with_rank_zero_last() {
        assert_eq!(pipeline_range(30, 0, 2), 15..30);
        assert_eq!(pipeline_range(30, 1, 2), 0..15);
        assert_eq!(pipeline_range(7, 0, 3), 4..7);
        assert_eq!(pipeline_range(7, 1, 3), 2..4);
        assert_eq!(pipeline_range(7, 2, 3), 0..2);
    }

    #[test]
    fn uneven_parts_are_contiguous() {
        assert_eq!(part(3, 0, 2), 0..1);
        assert_eq!(part(3, 1, 2), 1..3);
        assert_eq!(part(48, 1, 2), 24..48);
    }
}
