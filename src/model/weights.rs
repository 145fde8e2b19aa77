//! The tensors of a model directory, consumed by the layers as they load.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::{Array, Dtype};

use super::config::ModelArgs;
use crate::mlx_ext::cast_float;
use crate::quant::{QuantMode, QuantSpec, Quantization};

/// Stacks per-expert tensors `{experts}.{e}.{name}.{weight,scales,biases,bias}`
/// for `e` below `count` into `{target}.*` `[experts, ...]`, when the
/// checkpoint stores its experts one by one (Hugging Face layout); a no-op
/// otherwise.
pub(crate) fn stack_expert_tensors(
    tensors: &mut HashMap<String, Array>,
    experts: &str,
    name: &str,
    target: &str,
    count: i32,
) -> Result<()> {
    for part in ["weight", "scales", "biases", "bias"] {
        if !tensors.contains_key(&format!("{experts}.0.{name}.{part}")) {
            continue;
        }
        let each = (0..count)
            .map(|e| {
                let key = format!("{experts}.{e}.{name}.{part}");
                tensors
                    .remove(&key)
                    .ok_or_else(|| anyhow!("missing tensor {key:?} in the model weights"))
            })
            .collect::<Result<Vec<_>>>()?;
        let stacked = mlx_rs::ops::stack(&each, 0)
            .with_context(|| format!("stacking the experts of {experts}.*.{name}"))?;
        tensors.insert(format!("{target}.{part}"), stacked);
    }
    Ok(())
}

/// The safetensors format caps its JSON header at 100 MB.
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// A checkpoint's tensors by name, cast to the compute dtype, that the
/// architectures take from as they build their layers (with the
/// `quantization` block saying which layers are quantized and how).
pub struct Weights {
    tensors: HashMap<String, Array>,
    quantization: Option<Quantization>,
    compute_dtype: Dtype,
    /// Random draws mlx-lm makes building the layers loaded so far.
    init_draws: usize,
}

impl Weights {
    /// Loads every `*.safetensors` file of `dir`, casting floating tensors to
    /// the dtype `compute` picks for the dtype they are stored in.
    pub(crate) fn load_dir(
        dir: &Path,
        quantization: Option<Quantization>,
        compute: crate::mlx_ext::ComputeDtype,
    ) -> Result<Self> {
        let files = weight_files(dir)?;
        let mut tensors = HashMap::new();
        for file in &files {
            check_safetensors_file(file)?;
            let loaded = Array::load_safetensors(file)
                .map_err(|e| anyhow!("loading {}: {e}", file.display()))?;
            tensors.extend(loaded);
        }
        let stored = crate::mlx_ext::stored_float_dtype(tensors.values().map(Array::dtype));
        Self::from_map(tensors, quantization, compute.resolve(stored))
    }

    pub(crate) fn from_map(
        tensors: HashMap<String, Array>,
        quantization: Option<Quantization>,
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
            init_draws: 0,
        })
    }

    pub(crate) fn compute_dtype(&self) -> Dtype {
        self.compute_dtype
    }

    /// Counts random draws that mlx-lm's constructor makes for a loaded
    /// layer: one per `nn.Linear`/`nn.Embedding` weight and `Linear` bias,
    /// one more per layer it quantizes (`to_quantized` builds a fresh,
    /// randomly initialised layer).
    pub(crate) fn count_init_draws(&mut self, draws: usize) {
        self.init_draws += draws;
    }

    pub(crate) fn init_draws(&self) -> usize {
        self.init_draws
    }

    /// Bytes of the tensors not yet taken.
    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.nbytes()).sum()
    }

    /// Whether tensor `name` is present (and not yet taken).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Removes and returns tensor `name`; errs when it is missing.
    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors
            .remove(name)
            .ok_or_else(|| anyhow!("missing tensor {name:?} in the model weights"))
    }

    pub(crate) fn take_opt(&mut self, name: &str) -> Result<Option<Array>> {
        Ok(self.tensors.remove(name))
    }

    /// The config's quantization, for layers renamed in place.
    pub(crate) fn quantization_mut(&mut self) -> Option<&mut Quantization> {
        self.quantization.as_mut()
    }

    /// The tensors not yet taken, for renames done in place.
    pub(crate) fn tensors_mut(&mut self) -> &mut HashMap<String, Array> {
        &mut self.tensors
    }

    /// Stacks the per-expert tensors of the MoE block at `prefix` when the
    /// checkpoint stores its experts one by one (Hugging Face layout).
    pub(crate) fn stack_moe_experts(
        &mut self,
        layout: &super::moe::MoeLayout,
        prefix: &str,
        count: i32,
    ) -> Result<()> {
        layout.stack_hugging_face_experts(&mut self.tensors, prefix, count)
    }

    pub(crate) fn quant_spec(&self, prefix: &str) -> Result<Option<QuantSpec>> {
        layer_quant_spec(&self.tensors, self.quantization.as_ref(), prefix)
    }

    /// Takes the `scales` of a quantized layer, and its `biases` when its
    /// mode has them (an error naming the tensor when they are missing).
    pub(crate) fn take_quant_params(
        &mut self,
        prefix: &str,
        spec: QuantSpec,
    ) -> Result<(Array, Option<Array>)> {
        let scales = self.take(&format!("{prefix}.scales"))?;
        let biases = if spec.mode.has_biases() {
            Some(self.take(&format!("{prefix}.biases"))?)
        } else {
            None
        };
        Ok((scales, biases))
    }

    /// Names left unconsumed (a sign of a mismatched architecture).
    pub(crate) fn remaining(&self) -> Vec<String> {
        let mut names: Vec<_> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }

    /// Checks every tensor the decoder takes against the shape `args`
    /// implies, so a config that disagrees with its weights is an error
    /// naming the tensor, the expected and the found shape (instead of a
    /// reshape failure deep in the first forward pass). Missing tensors are
    /// left to `take`, which names them.
    pub(crate) fn check_shapes(&self, args: &ModelArgs, qk_norm: bool) -> Result<()> {
        let hidden = args.hidden_size;
        let q_rows = args.num_attention_heads * args.head_dim();
        let kv_rows = args.kv_heads() * args.head_dim();
        let inter = args.intermediate_size;
        let linear = [
            (
                "self_attn.q_proj",
                [q_rows, hidden],
                "num_attention_heads × head_dim, hidden_size",
            ),
            (
                "self_attn.k_proj",
                [kv_rows, hidden],
                "num_key_value_heads × head_dim, hidden_size",
            ),
            (
                "self_attn.v_proj",
                [kv_rows, hidden],
                "num_key_value_heads × head_dim, hidden_size",
            ),
            (
                "self_attn.o_proj",
                [hidden, q_rows],
                "hidden_size, num_attention_heads × head_dim",
            ),
            (
                "mlp.gate_proj",
                [inter, hidden],
                "intermediate_size, hidden_size",
            ),
            (
                "mlp.up_proj",
                [inter, hidden],
                "intermediate_size, hidden_size",
            ),
            (
                "mlp.down_proj",
                [hidden, inter],
                "hidden_size, intermediate_size",
            ),
        ];
        let vocab = [args.vocab_size, hidden];
        self.check_matrix("model.embed_tokens", vocab, "vocab_size, hidden_size")?;
        self.check_matrix("lm_head", vocab, "vocab_size, hidden_size")?;
        self.check_vector("model.norm.weight", hidden, "hidden_size")?;
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            for (name, shape, fields) in &linear {
                self.check_matrix(&format!("{p}.{name}"), *shape, fields)?;
                let rows = shape[0];
                self.check_vector(&format!("{p}.{name}.bias"), rows, fields)?;
            }
            for norm in ["input_layernorm", "post_attention_layernorm"] {
                self.check_vector(&format!("{p}.{norm}.weight"), hidden, "hidden_size")?;
            }
            if qk_norm {
                for norm in ["q_norm", "k_norm"] {
                    let name = format!("{p}.self_attn.{norm}.weight");
                    self.check_vector(&name, args.head_dim(), "head_dim")?;
                }
            }
        }
        Ok(())
    }

    fn check_vector(&self, name: &str, len: i32, fields: &str) -> Result<()> {
        match self.tensors.get(name) {
            Some(t) if t.shape() != [len] => bail!(
                "tensor {name:?} has shape {:?}, but config.json ({fields}) implies [{len}]",
                t.shape()
            ),
            _ => Ok(()),
        }
    }

    /// A dense `[rows, cols]` weight, or a quantized triple whose unpacked
    /// shape is `[rows, cols]`.
    fn check_matrix(&self, prefix: &str, expected: [i32; 2], fields: &str) -> Result<()> {
        let name = format!("{prefix}.weight");
        let Some(weight) = self.tensors.get(&name) else {
            return Ok(());
        };
        let found = weight.shape();
        let mismatch = |shape: String| {
            anyhow!(
                "tensor {name:?} has shape {shape}, but config.json ({fields}) implies {expected:?}"
            )
        };
        if found.len() != 2 {
            return Err(mismatch(format!("{found:?}")));
        }
        let scales_name = format!("{prefix}.scales");
        let Some(scales) = self.tensors.get(&scales_name) else {
            if !crate::mlx_ext::is_float(weight.dtype()) {
                bail!(
                    "tensor {name:?} has dtype {:?} but no {scales_name:?}: a quantized weight \
                     needs its scales and biases",
                    weight.dtype()
                );
            }
            if found != expected {
                return Err(mismatch(format!("{found:?}")));
            }
            return Ok(());
        };
        if weight.dtype() != Dtype::Uint32 {
            bail!(
                "quantized weight {name:?} has dtype {:?}; packed weights are uint32",
                weight.dtype()
            );
        }
        let spec = self.quant_spec(prefix)?.ok_or_else(|| {
            anyhow!(
                "cannot tell the quantization of {prefix:?}: packed {:?}, scales {:?} ({:?}), \
                 and config.json gives no group_size/bits/mode that fits",
                found,
                scales.shape(),
                scales.dtype()
            )
        })?;
        let biases_name = format!("{prefix}.biases");
        match self.tensors.get(&biases_name) {
            Some(biases) if scales.shape() != biases.shape() => bail!(
                "{scales_name:?} {:?} and {biases_name:?} {:?} must be matrices of one shape",
                scales.shape(),
                biases.shape()
            ),
            None if spec.mode.has_biases() => {
                bail!("quantized weight {name:?} has scales but no {biases_name:?}")
            }
            _ => {}
        }
        if scales.ndim() != 2 {
            bail!(
                "{scales_name:?} has shape {:?}; scales are matrices",
                scales.shape()
            );
        }
        let cols = found[1] as i64 * 32 / spec.bits as i64;
        let rows = found[0];
        let groups = scales.shape()[1] as i64;
        if rows != expected[0]
            || cols != expected[1] as i64
            || scales.shape()[0] != rows
            || groups * spec.group_size as i64 != cols
        {
            return Err(mismatch(format!(
                "[{rows}, {cols}] once unpacked ({} {} bits, group {}; packed {found:?}, scales {:?})",
                spec.mode.name(),
                spec.bits,
                spec.group_size,
                scales.shape()
            )));
        }
        Ok(())
    }
}

/// The quantization of the layer at `prefix` among `tensors`, as mlx-lm's
/// `load_model` decides it: the layer's own config.json entry, else (when
/// it has `scales`) the model's spec if the packed shapes and scale dtype
/// agree with it, else what they imply. None for a dense layer.
pub(crate) fn layer_quant_spec(
    tensors: &HashMap<String, Array>,
    q: Option<&Quantization>,
    prefix: &str,
) -> Result<Option<QuantSpec>> {
    let packed = tensors.contains_key(&format!("{prefix}.scales"));
    if tensors.contains_key(&format!("{prefix}.global_scale")) {
        bail!(
            "{prefix:?} has a global_scale (nvfp4 with a per-tensor scale), which mlx-bun \
             does not load yet"
        );
    }
    match q.and_then(|q| q.named(prefix)) {
        Some(Some(spec)) if packed => return Ok(Some(spec)),
        Some(None) if packed => {
            bail!("config.json leaves {prefix:?} unquantized (false), but its weights are packed")
        }
        Some(Some(spec)) if tensors.contains_key(&format!("{prefix}.weight")) => bail!(
            "config.json quantizes {prefix:?} ({} bits, {}), but it has no {prefix}.scales",
            spec.bits,
            spec.mode.name()
        ),
        _ => {}
    }
    if !packed {
        return Ok(None);
    }
    let default = q.map(|q| q.default);
    if let Some(spec) = default.filter(|s| fits(tensors, prefix, *s)) {
        return Ok(Some(spec));
    }
    Ok(infer_spec(tensors, prefix, default.map(|s| s.bits)))
}

/// Whether the packed weight and scales of `prefix` can be `spec`.
fn fits(tensors: &HashMap<String, Array>, prefix: &str, spec: QuantSpec) -> bool {
    let (Some(packed), Some(groups), Some(dtype)) = packed_shape(tensors, prefix) else {
        return false;
    };
    let cols = packed as i64 * 32;
    cols % spec.bits as i64 == 0
        && cols / spec.bits as i64 == groups as i64 * spec.group_size as i64
        && QuantMode::infer(dtype, spec.group_size, spec.bits) == Some(spec.mode)
}

/// Packed columns, scale groups and the scales' dtype of `prefix`.
fn packed_shape(
    tensors: &HashMap<String, Array>,
    prefix: &str,
) -> (Option<i32>, Option<i32>, Option<Dtype>) {
    let last = |name: String| tensors.get(&name).and_then(|t| t.shape().last().copied());
    let scales = tensors.get(&format!("{prefix}.scales"));
    (
        last(format!("{prefix}.weight")),
        last(format!("{prefix}.scales")),
        scales.map(|s| s.dtype()),
    )
}

/// Infers the spec from the packed shapes (mlx-lm's `infer_quant_config`,
/// without the input width: the config's bits first, then the others;
/// group 64, 32, 128 for affine) and the mode from the scales' dtype.
fn infer_spec(
    tensors: &HashMap<String, Array>,
    prefix: &str,
    bits_first: Option<i32>,
) -> Option<QuantSpec> {
    let (Some(_), Some(groups), Some(dtype)) = packed_shape(tensors, prefix) else {
        return None;
    };
    if groups < 1 {
        return None;
    }
    let candidates: Vec<QuantSpec> = if dtype == Dtype::Uint8 {
        [QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8]
            .into_iter()
            .map(|m| {
                let (g, b) = m.defaults();
                QuantSpec {
                    group_size: g,
                    bits: b,
                    mode: m,
                }
            })
            .collect()
    } else {
        let bits = bits_first.into_iter().chain([2, 3, 4, 5, 6, 8]);
        bits.flat_map(|b| [64, 32, 128].map(|g| QuantSpec::affine(g, b)))
            .collect()
    };
    candidates.into_iter().find(|s| fits(tensors, prefix, *s))
}

/// The model's weight files in `dir` (`*.safetensors`, adapters excluded), sorted.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
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
    Ok(files)
}

/// Reads the header of a safetensors file and checks it against the file:
/// a corrupt or truncated file is an error naming it, before MLX reads it.
pub fn check_safetensors_file(path: &Path) -> Result<()> {
    let check = || -> Result<()> {
        let mut file = std::fs::File::open(path)?;
        let file_len = file.metadata()?.len();
        let mut len = [0u8; 8];
        file.read_exact(&mut len)
            .context("the file is too short to be safetensors")?;
        let header_len = header_len(len, file_len)?;
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header)?;
        check_safetensors_header(&header, file_len - 8 - header_len).map(|_| ())
    };
    check().with_context(|| format!("invalid safetensors file {}", path.display()))
}

/// The same checks on a whole safetensors file in memory.
pub fn check_safetensors_bytes(bytes: &[u8]) -> Result<Vec<TensorEntry>> {
    let (len, rest) = bytes
        .split_first_chunk::<8>()
        .ok_or_else(|| anyhow!("the file is too short to be safetensors"))?;
    let header_len = header_len(*len, bytes.len() as u64)? as usize;
    check_safetensors_header(&rest[..header_len], (rest.len() - header_len) as u64)
}

/// The header length the first 8 bytes give, checked against the file length.
fn header_len(prefix: [u8; 8], file_len: u64) -> Result<u64> {
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES || n > file_len.saturating_sub(8) {
        bail!("the header claims {n} bytes, but the file has {file_len}");
    }
    Ok(n)
}

/// One tensor entry of a safetensors header.
#[derive(Debug, PartialEq)]
pub struct TensorEntry {
    /// The tensor's name.
    pub name: String,
    /// Its dtype as the header spells it (`F32`, `BF16`, `U32`, ...).
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes, as offsets into the data after the header.
    pub data: std::ops::Range<u64>,
}

/// Parses a safetensors JSON header and checks each entry against
/// `data_len`, the bytes after the header: known dtype, shape, offsets inside
/// the data and of exactly the size the shape and dtype imply.
pub(crate) fn check_safetensors_header(header: &[u8], data_len: u64) -> Result<Vec<TensorEntry>> {
    let value: serde_json::Value =
        serde_json::from_slice(header).context("the header is not JSON")?;
    let map = value
        .as_object()
        .ok_or_else(|| anyhow!("the header is not a JSON object"))?;
    let mut entries = Vec::with_capacity(map.len());
    for (name, info) in map {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| anyhow!("tensor {name:?}: {what}");
        let dtype = info
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("no dtype"))?;
        let item_bits: u64 = match dtype {
            "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 8,
            "U16" | "I16" | "F16" | "BF16" => 16,
            "U32" | "I32" | "F32" => 32,
            "U64" | "I64" | "F64" => 64,
            other => return Err(bad(&format!("unsupported dtype {other:?}"))),
        };
        let shape = info
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| bad("shape entries must be whole numbers"))
            })
            .collect::<Result<Vec<u64>>>()?;
        if shape.len() > 8 {
            return Err(bad(&format!("{} dimensions", shape.len())));
        }
        let offsets = info
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| bad("data_offsets must be [start, end]"))?;
        let (start, end) = match (offsets[0].as_u64(), offsets[1].as_u64()) {
            (Some(s), Some(e)) if s <= e && e <= data_len => (s, e),
            _ => {
                return Err(bad(&format!(
                    "data_offsets {offsets:?} lie outside the {data_len} data bytes"
                )))
            }
        };
        shape
            .iter()
            .try_fold(item_bits, |acc, &d| acc.checked_mul(d))
            .map(|bits| bits.div_ceil(8))
            .filter(|&b| b == end - start)
            .ok_or_else(|| {
                bad(&format!(
                    "shape {shape:?} of {dtype} does not fit its {} data bytes",
                    end - start
                ))
            })?;
        entries.push(TensorEntry {
            name: name.clone(),
            dtype: dtype.to_string(),
            shape,
            data: start..end,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_headers_are_checked_against_the_data() {
        let ok = br#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"x":"y"}}"#;
        let entries = check_safetensors_header(ok, 24).unwrap();
        assert_eq!(entries[0].shape, vec![2, 3]);
        let err = check_safetensors_header(ok, 20).unwrap_err().to_string();
        assert!(err.contains("outside the 20 data bytes"), "{err}");
        let wrong = br#"{"a":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}}"#;
        let err = check_safetensors_header(wrong, 24).unwrap_err().to_string();
        assert!(err.contains("does not fit"), "{err}");
        let huge =
            br#"{"a":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
        assert!(check_safetensors_header(huge, 8).is_err());
        assert!(check_safetensors_header(b"[1]", 0).is_err());
    }
}
