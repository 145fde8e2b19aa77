//! Prompt-cache files: a model's KV cache saved after a prompt, in the file
//! layout of mlx-lm's `save_prompt_cache`, so files move freely between
//! `mlx_lm.cache_prompt`/`mlx_lm.generate` and `mlx-bun`.
//!
//! The layout (a safetensors file):
//! - tensors `"{layer}.{k}"` hold element `k` of the layer's `state`
//!   (`KVCache`: keys, values, offset; `RotatingKVCache`: keys, values,
//!   offset, keep, max_size, idx; `QuantizedKVCache`: `{layer}.0.{0,1,2}`
//!   packed keys/scales/biases, `{layer}.1.*` values, offset, group_size,
//!   bits). Integers are 0-d int32 tensors.
//! - metadata `"0.{key}"` is free metadata (`model`, `tokenizer_config`, and
//!   our fingerprints), `"1.{layer}"` the cache class, `"2.0"` an empty
//!   string and `"2.{j}.0"`/`"2.{j}.1"` the tensor name and kind of each
//!   integer (`scalar`).
//!
//! Keys of a `KVCache` are stored padded to a multiple of 256 positions as
//! mlx-lm's buffer is; the live length is `offset`. Files are parsed and
//! checked here (never handed unchecked to MLX), so a truncated or corrupt
//! file is an error, not a crash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};
use safetensors::SafeTensors;

use crate::cache::{
    cast_state, KvCache, QuantizedCache, QuantizedState, RotatingCache, StandardCache, StateCache,
};
use crate::chat_template::Message;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// Metadata keys we add (mlx-lm ignores unknown keys).
pub(crate) const MODEL_FINGERPRINT_KEY: &str = "mlx_bun_model_fingerprint";
pub(crate) const TOKENIZER_FINGERPRINT_KEY: &str = "mlx_bun_tokenizer_fingerprint";
/// Token ids the cache holds, comma-separated (our files only).
pub(crate) const TOKENS_KEY: &str = "mlx_bun_tokens";

const PAD_STEP: i32 = 256;

/// A loaded cache file.
pub struct CacheFile {
    /// One cache per layer, as the file holds them.
    pub caches: Vec<Box<dyn KvCache>>,
    /// The free metadata (`model`, `tokenizer_config`, fingerprints…).
    pub metadata: BTreeMap<String, String>,
}

impl CacheFile {
    /// Positions the cache holds.
    pub fn offset(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset())
    }

    /// The token ids, when the file records them.
    pub fn tokens(&self) -> Option<Vec<u32>> {
        let s = self.metadata.get(TOKENS_KEY)?;
        if s.is_empty() {
            return Some(Vec::new());
        }
        s.split(',').map(|t| t.parse().ok()).collect()
    }
}

// ---------------------------------------------------------------- writing

fn int_array(v: usize) -> Array {
    Array::from_int(v as i32)
}

fn pad_positions(a: &Array, offset: i32) -> Result<Array> {
    let live = a.index((.., .., ..offset, ..));
    let padded = (offset + PAD_STEP - 1) / PAD_STEP * PAD_STEP;
    if padded == offset {
        return Ok(live);
    }
    let s = a.shape();
    let zeros = zeros_dtype(&[s[0], s[1], padded - offset, s[3]], a.dtype())?;
    Ok(concatenate(&[live, zeros], 2)?)
}

/// Tensors and metadata of `caches` in mlx-lm's layout (`metadata` goes
/// under `0.`): what [`save`] writes. `pad` pads dense keys and values to a
/// multiple of 256 positions as mlx-lm's buffer is (readers need not).
pub(crate) fn layout(
    caches: &[Box<dyn KvCache>],
    metadata: &BTreeMap<String, String>,
    pad: bool,
) -> Result<(BTreeMap<String, Array>, BTreeMap<String, String>)> {
    let mut tensors: BTreeMap<String, Array> = BTreeMap::new();
    let mut meta: BTreeMap<String, String> = BTreeMap::new();
    // Non-array entries of the states: their tensor name and kind
    // (`scalar`, or `none` for mlx-lm's absent values, stored empty).
    let mut scalars: Vec<(String, &str)> = Vec::new();
    for (k, v) in metadata {
        meta.insert(format!("0.{k}"), v.clone());
    }
    for (i, cache) in caches.iter().enumerate() {
        let kind = cache.kind();
        meta.insert(format!("1.{i}"), kind.to_string());
        let mut scalar = |name: String, v: usize, tensors: &mut BTreeMap<String, Array>| {
            tensors.insert(name.clone(), int_array(v));
            scalars.push((name, "scalar"));
        };
        match kind {
            "KVCache" => {
                let (k, v) = cache
                    .state()
                    .ok_or_else(|| anyhow!("layer {i}: the cache is empty"))?;
                let off = cache.offset() as i32;
                let (k, v) = if pad {
                    (pad_positions(&k, off)?, pad_positions(&v, off)?)
                } else {
                    (k, v)
                };
                tensors.insert(format!("{i}.0"), k);
                tensors.insert(format!("{i}.1"), v);
                scalar(format!("{i}.2"), cache.offset(), &mut tensors);
            }
            "RotatingKVCache" => {
                let (k, v) = cache
                    .state()
                    .ok_or_else(|| anyhow!("layer {i}: the cache is empty"))?;
                // Stored in temporal order: mlx-lm's index is the length.
                let idx = k.shape()[2] as usize;
                tensors.insert(format!("{i}.0"), k);
                tensors.insert(format!("{i}.1"), v);
                scalar(format!("{i}.2"), cache.offset(), &mut tensors);
                scalar(format!("{i}.3"), cache.keep(), &mut tensors);
                scalar(
                    format!("{i}.4"),
                    cache.max_size().unwrap_or(0),
                    &mut tensors,
                );
                scalar(format!("{i}.5"), idx, &mut tensors);
            }
            "QuantizedKVCache" => {
                let q = cache
                    .quantized_state()
                    .ok_or_else(|| anyhow!("layer {i}: the cache is empty"))?;
                for (j, part) in [&q.keys, &q.values].into_iter().enumerate() {
                    for (m, a) in part.iter().enumerate() {
                        tensors.insert(format!("{i}.{j}.{m}"), a.clone());
                    }
                }
                scalar(format!("{i}.2"), cache.offset(), &mut tensors);
                scalar(format!("{i}.3"), q.group_size as usize, &mut tensors);
                scalar(format!("{i}.4"), q.bits as usize, &mut tensors);
            }
            "ArraysCache" => {
                // mlx-lm's state: ([conv, recurrent] or [conv] for a layer
                // keeping no recurrent state, left_padding, lengths), the
                // last two absent for a single sequence.
                let arrays = cache.arrays();
                if arrays.is_empty() {
                    bail!("layer {i}: the state is empty");
                }
                for (j, a) in arrays.into_iter().enumerate() {
                    tensors.insert(format!("{i}.0.{j}"), a);
                }
                for slot in 1..=2 {
                    let name = format!("{i}.{slot}");
                    tensors.insert(name.clone(), Array::from_slice::<f32>(&[], &[0]));
                    scalars.push((name, "none"));
                }
            }
            other => bail!("layer {i}: a {other} cache cannot be saved"),
        }
    }
    meta.insert("2.0".into(), String::new());
    for (j, (name, kind)) in scalars.iter().enumerate() {
        meta.insert(format!("2.{}.0", j + 1), name.clone());
        meta.insert(format!("2.{}.1", j + 1), kind.to_string());
    }
    Ok((tensors, meta))
}

/// Writes `caches` to `path` in mlx-lm's layout, atomically (a temporary
/// file renamed into place). As MLX does, `.safetensors` is appended when
/// the name lacks it; returns the path written.
pub fn save(
    path: &Path,
    caches: &[Box<dyn KvCache>],
    metadata: &BTreeMap<String, String>,
) -> Result<PathBuf> {
    let (tensors, meta) = layout(caches, metadata, true)?;
    let mut target = path.to_path_buf();
    if !path.to_string_lossy().ends_with(".safetensors") {
        target = PathBuf::from(format!("{}.safetensors", path.display()));
    }
    let dir = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .ok_or_else(|| anyhow!("{} is not a file name", target.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp.safetensors",
        name.to_string_lossy(),
        std::process::id()
    ));
    let meta: std::collections::HashMap<String, String> = meta.into_iter().collect();
    let result = Array::save_safetensors(tensors.iter(), &meta, &tmp)
        .map_err(|e| anyhow!("{e}"))
        .and_then(|()| {
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &target)?;
            Ok(())
        });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", target.display()));
    }
    Ok(target)
}

// ---------------------------------------------------------------- reading

struct Parsed<'a> {
    st: SafeTensors<'a>,
    path: &'a Path,
}

impl Parsed<'_> {
    fn array(&self, name: &str) -> Result<Array> {
        let t = self
            .st
            .tensor(name)
            .map_err(|_| anyhow!("{}: tensor {name} is missing", self.path.display()))?;
        let shape: Vec<i32> = t.shape().iter().map(|&d| d as i32).collect();
        let data = t.data();
        use safetensors::Dtype as D;
        // Aligned little-endian data (a memory-mapped file) is copied once.
        if let Some(a) = match t.dtype() {
            D::F32 => in_place::<f32>(data).map(|v| Array::from_slice(v, &shape)),
            D::U32 => in_place::<u32>(data).map(|v| Array::from_slice(v, &shape)),
            D::I32 => in_place::<i32>(data).map(|v| Array::from_slice(v, &shape)),
            _ => None,
        } {
            return Ok(a);
        }
        let a = match t.dtype() {
            D::F32 => Array::from_slice(&le::<4, f32>(data, f32::from_le_bytes), &shape),
            D::F16 => {
                Array::from_slice(&le::<2, half::f16>(data, half::f16::from_le_bytes), &shape)
            }
            D::BF16 => Array::from_slice(
                &le::<2, half::bf16>(data, half::bf16::from_le_bytes),
                &shape,
            ),
            D::U32 => Array::from_slice(&le::<4, u32>(data, u32::from_le_bytes), &shape),
            D::I32 => Array::from_slice(&le::<4, i32>(data, i32::from_le_bytes), &shape),
            other => bail!(
                "{}: tensor {name} has unsupported dtype {other:?}",
                self.path.display()
            ),
        };
        Ok(a)
    }

    fn scalar(&self, name: &str) -> Result<usize> {
        let t = self
            .st
            .tensor(name)
            .map_err(|_| anyhow!("{}: value {name} is missing", self.path.display()))?;
        use safetensors::Dtype as D;
        let v: i64 = match (t.dtype(), t.data().len()) {
            (D::I32, 4) => i32::from_le_bytes(t.data().try_into().unwrap()) as i64,
            (D::I64, 8) => i64::from_le_bytes(t.data().try_into().unwrap()),
            (D::U32, 4) => u32::from_le_bytes(t.data().try_into().unwrap()) as i64,
            _ => bail!(
                "{}: value {name} is not an integer scalar",
                self.path.display()
            ),
        };
        usize::try_from(v).map_err(|_| anyhow!("{}: value {name} is negative", self.path.display()))
    }
}

/// `data` as a slice of `T` when it is aligned for it and the host is
/// little-endian (as the file is).
fn in_place<T: Copy>(data: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    let aligned = (data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>());
    if !cfg!(target_endian = "little") || !aligned || !data.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: alignment and length are checked above, so the `len / size`
    // elements lie within `data` and borrow it; the only callers pass f32, u32
    // and i32, for which every bit pattern is a valid value.
    Some(unsafe { std::slice::from_raw_parts(data.as_ptr() as *const T, data.len() / size) })
}

fn le<const N: usize, T>(data: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    data.chunks_exact(N)
        .map(|c| f(c.try_into().unwrap()))
        .collect()
}

fn check_4d(path: &Path, name: &str, a: &Array) -> Result<()> {
    if a.ndim() != 4 {
        bail!(
            "{}: tensor {name} has shape {:?}, expected [batch, kv_heads, positions, dim]",
            path.display(),
            a.shape()
        );
    }
    Ok(())
}

/// Reads a prompt-cache file written by mlx-lm or by us.
pub fn load(path: &Path) -> Result<CacheFile> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&bytes, path)
}

/// Reads a prompt-cache file from its bytes; `path` names it in errors.
pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<CacheFile> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| {
        anyhow!(
            "{} is not a valid safetensors file ({e:?}): truncated or corrupt",
            path.display()
        )
    })?;
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| anyhow!("{}: bad header ({e:?})", path.display()))?;
    let raw = header.metadata().clone().unwrap_or_default();
    let p = Parsed { st, path };
    let mut metadata = BTreeMap::new();
    let mut classes: BTreeMap<usize, String> = BTreeMap::new();
    for (k, v) in &raw {
        if let Some(key) = k.strip_prefix("0.") {
            metadata.insert(key.to_string(), v.clone());
        } else if let Some(i) = k.strip_prefix("1.") {
            let i: usize = i
                .parse()
                .map_err(|_| anyhow!("{}: bad metadata key {k}", path.display()))?;
            classes.insert(i, v.clone());
        }
    }
    if classes.is_empty() {
        bail!(
            "{} is not a prompt-cache file (no cache classes in its metadata)",
            path.display()
        );
    }
    if classes.keys().copied().ne(0..classes.len()) {
        bail!("{}: the layer list has gaps", path.display());
    }
    let mut caches: Vec<Box<dyn KvCache>> = Vec::new();
    for (&i, class) in &classes {
        let layer = load_layer(&p, i, class)
            .with_context(|| format!("{}: layer {i} ({class})", path.display()))?;
        caches.push(layer);
    }
    // A state layer stores no length: the attention layers give it.
    let offsets: Vec<usize> = caches
        .iter_mut()
        .filter_map(|c| c.as_state_mut().is_none().then(|| c.offset()))
        .collect();
    let Some(&offset) = offsets.first() else {
        bail!(
            "{}: no layer records the cached length (recurrent states only)",
            path.display()
        );
    };
    if offsets.iter().any(|&o| o != offset) {
        bail!("{}: layers disagree on the cached length", path.display());
    }
    for c in caches.iter_mut() {
        if let Some(state) = c.as_state_mut() {
            state.set_length(offset);
        }
    }
    Ok(CacheFile { caches, metadata })
}

fn load_layer(p: &Parsed, i: usize, class: &str) -> Result<Box<dyn KvCache>> {
    let path = p.path;
    match class {
        "KVCache" => {
            let (k, v) = (p.array(&format!("{i}.0"))?, p.array(&format!("{i}.1"))?);
            check_4d(path, "keys", &k)?;
            check_4d(path, "values", &v)?;
            let len = k.shape()[2] as usize;
            // Old mlx-lm files stored only keys and values.
            let offset = match p.st.tensor(&format!("{i}.2")) {
                Ok(_) => p.scalar(&format!("{i}.2"))?,
                Err(_) => len,
            };
            if offset > len || v.shape()[2] as usize != len || offset == 0 {
                bail!(
                    "offset {offset} does not fit {len} stored positions (values {:?})",
                    v.shape()
                );
            }
            let end = offset as i32;
            let mut c = StandardCache::new();
            c.set_state(
                k.index((.., .., ..end, ..)),
                v.index((.., .., ..end, ..)),
                offset,
            )?;
            Ok(Box::new(c))
        }
        "RotatingKVCache" => {
            let (k, v) = (p.array(&format!("{i}.0"))?, p.array(&format!("{i}.1"))?);
            check_4d(path, "keys", &k)?;
            check_4d(path, "values", &v)?;
            let offset = p.scalar(&format!("{i}.2"))?;
            let keep = p.scalar(&format!("{i}.3"))?;
            let max_size = p.scalar(&format!("{i}.4"))?;
            let idx = p.scalar(&format!("{i}.5"))?;
            let len = k.shape()[2] as usize;
            let ring = idx != len && idx < offset;
            if idx > len || keep > max_size || len > max_size.max(offset) || (ring && idx < keep) {
                bail!("inconsistent ring (len {len}, idx {idx}, keep {keep}, max {max_size})");
            }
            // mlx-lm's `_temporal_order`.
            let order = |a: &Array| -> Result<Array> {
                let (kp, ix) = (keep as i32, idx as i32);
                Ok(if idx == len {
                    a.clone()
                } else if idx < offset {
                    concatenate(
                        &[
                            a.index((.., .., ..kp, ..)),
                            a.index((.., .., ix.., ..)),
                            a.index((.., .., kp..ix, ..)),
                        ],
                        2,
                    )?
                } else {
                    a.index((.., .., ..ix, ..))
                })
            };
            let mut c = RotatingCache::new(max_size, keep);
            c.set_state(order(&k)?, order(&v)?, offset)?;
            Ok(Box::new(c))
        }
        "QuantizedKVCache" => {
            let part = |j: usize| -> Result<[Array; 3]> {
                Ok([
                    p.array(&format!("{i}.{j}.0"))?,
                    p.array(&format!("{i}.{j}.1"))?,
                    p.array(&format!("{i}.{j}.2"))?,
                ])
            };
            let (keys, values) = (part(0)?, part(1)?);
            for a in keys.iter().chain(values.iter()) {
                check_4d(path, "quantized keys/values", a)?;
            }
            let offset = p.scalar(&format!("{i}.2"))?;
            let group_size = p.scalar(&format!("{i}.3"))? as i32;
            let bits = p.scalar(&format!("{i}.4"))? as i32;
            if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) || !matches!(group_size, 32 | 64 | 128) {
                bail!("unsupported KV quantization: {bits} bits, group size {group_size}");
            }
            let len = keys[0].shape()[2] as usize;
            if offset == 0 || offset > len || keys.iter().any(|a| a.shape()[2] as usize != len) {
                bail!("offset {offset} does not fit {len} stored positions");
            }
            let end = offset as i32;
            let cut = |a: &[Array; 3]| a.clone().map(|x| x.index((.., .., ..end, ..)));
            let state = QuantizedState {
                keys: cut(&keys),
                values: cut(&values),
                group_size,
                bits,
                buffers: None,
            };
            Ok(Box::new(QuantizedCache::from_state(state, offset)?))
        }
        "ArraysCache" => {
            let conv = p.array(&format!("{i}.0.0"))?;
            let name = format!("{i}.0.1");
            let recurrent = match p.st.tensor(&name) {
                Ok(_) => Some(p.array(&name)?),
                Err(_) => None,
            };
            let recurrent_shape = recurrent.as_ref().map(|r| r.shape().to_vec());
            if conv.ndim() != 3
                || conv.shape()[0] != 1
                || recurrent_shape.as_ref().is_some_and(|s| s.len() != 4)
            {
                bail!(
                    "a state of shapes {:?} and {recurrent_shape:?}, expected [1, kernel - 1, \
                     channels] and (for a recurrent layer) [1, heads, value dim, key dim]",
                    conv.shape(),
                );
            }
            Ok(Box::new(StateCache::from_arrays(conv, recurrent, 0)))
        }
        other => bail!("cache class {other} is not supported"),
    }
}

// ---------------------------------------------------------------- checks

/// Refuses a file whose layers or shapes disagree with `model`, or whose
/// fingerprints (when present) name another model or tokenizer.
pub fn check_compatible(file: &CacheFile, model: &Model, path: &Path) -> Result<()> {
    let p = path.display();
    if file.caches.len() != model.decoder.cache_count() {
        bail!(
            "{p} holds {} layers but the model has {}",
            file.caches.len(),
            model.decoder.cache_count()
        );
    }
    let (heads, dim) = (model.args.kv_heads(), model.args.head_dim());
    let fresh = model.make_caches();
    for (i, (c, own)) in file.caches.iter().zip(&fresh).enumerate() {
        let state_layer = own.kind() == "ArraysCache";
        if state_layer != (c.kind() == "ArraysCache") {
            let want = if state_layer {
                "a recurrent state"
            } else {
                "keys and values"
            };
            bail!(
                "{p}: layer {i} holds a {}, the model keeps {want} there",
                c.kind()
            );
        }
        if state_layer {
            continue;
        }
        // Gemma 4's global layers have their own KV heads and head size.
        let (heads, dim) =
            crate::model::gemma4_text::cache_shape(&model.decoder, i).unwrap_or((heads, dim));
        let (k_heads, k_dim) = match c.quantized_state() {
            Some(q) => {
                let packed = q.keys[0].shape()[3];
                (q.keys[0].shape()[1], packed * 32 / q.bits)
            }
            None => {
                let (k, _) = c
                    .state()
                    .ok_or_else(|| anyhow!("{p}: layer {i} is empty"))?;
                (k.shape()[1], k.shape()[3])
            }
        };
        if k_heads != heads {
            bail!("{p}: layer {i} has {k_heads} KV heads, the model has {heads}");
        }
        if k_dim != dim {
            bail!("{p}: layer {i} has head size {k_dim}, the model has {dim}");
        }
    }
    if let Some(want) = file.metadata.get(MODEL_FINGERPRINT_KEY) {
        let have = model_fingerprint(&model.path)?;
        if *want != have {
            bail!("{p} was made with other model weights (fingerprint {want}, this model {have})");
        }
    }
    if let Some(want) = file.metadata.get(TOKENIZER_FINGERPRINT_KEY) {
        let have = tokenizer_fingerprint(&model.path)?;
        if *want != have {
            bail!("{p} was made with another tokenizer (fingerprint {want}, this one {have})");
        }
    }
    Ok(())
}

/// The KV quantization of a loaded file: `(bits, group_size)`.
pub fn kv_quantization(file: &CacheFile) -> Option<(i32, i32)> {
    file.caches
        .iter()
        .find_map(|c| c.quantized_state().map(|q| (q.bits, q.group_size)))
}

/// Casts every float tensor of the caches to `dtype` (a file written on
/// another device may hold another float type).
pub fn cast_to(caches: &mut [Box<dyn KvCache>], dtype: Dtype) -> Result<()> {
    for c in caches.iter_mut() {
        if let Some(state) = c.as_state_mut() {
            state.cast_conv(dtype)?;
            continue;
        }
        if let Some(q) = c.quantized_state() {
            if q.keys[1].dtype() != dtype {
                let off = c.offset();
                *c = Box::new(QuantizedCache::from_state(cast_state(q, dtype)?, off)?);
            }
            continue;
        }
        if let Some((k, v)) = c.state() {
            if k.dtype() != dtype {
                let off = c.offset();
                c.set_state(k.as_dtype(dtype)?, v.as_dtype(dtype)?, off)?;
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------ fingerprints

fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= *b as u64;
        *hash = hash.wrapping_mul(0x100000001b3);
    }
}

const FNV_OFFSET: u64 = 0xcbf29ce484222325;

/// A cheap fingerprint of a model's weights: its config, every safetensors
/// header and 64 KiB samples at 16 evenly spaced places of each file.
pub(crate) fn model_fingerprint(dir: &Path) -> Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut h = FNV_OFFSET;
    let config = dir.join("config.json");
    fnv1a(
        &mut h,
        &std::fs::read(&config).with_context(|| format!("reading {}", config.display()))?,
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    let mut buf = vec![0u8; 64 * 1024];
    for f in files {
        let mut file =
            std::fs::File::open(&f).with_context(|| format!("reading {}", f.display()))?;
        let len = file.metadata()?.len();
        fnv1a(&mut h, &len.to_le_bytes());
        for s in 0..16u64 {
            let at = len.saturating_sub(buf.len() as u64) * s / 15;
            file.seek(SeekFrom::Start(at))?;
            let n = file.read(&mut buf)?;
            fnv1a(&mut h, &buf[..n]);
        }
    }
    Ok(format!("{h:016x}"))
}

/// A fingerprint of the tokenizer files (vocabulary and chat template).
pub(crate) fn tokenizer_fingerprint(dir: &Path) -> Result<String> {
    let mut h = FNV_OFFSET;
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        if let Ok(bytes) = std::fs::read(dir.join(name)) {
            fnv1a(&mut h, name.as_bytes());
            fnv1a(&mut h, &bytes);
        }
    }
    Ok(format!("{h:016x}"))
}

/// The metadata our files carry: mlx-lm's keys and our fingerprints.
pub fn file_metadata(
    model_arg: &str,
    model: &Model,
    tokens: &[u32],
) -> Result<BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    m.insert("model".into(), model_arg.to_string());
    m.insert(
        "tokenizer_config".into(),
        r#"{"trust_remote_code": false}"#.to_string(),
    );
    m.insert(
        MODEL_FINGERPRINT_KEY.into(),
        model_fingerprint(&model.path)?,
    );
    m.insert(
        TOKENIZER_FINGERPRINT_KEY.into(),
        tokenizer_fingerprint(&model.path)?,
    );
    let ids: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    m.insert(TOKENS_KEY.into(), ids.join(","));
    Ok(m)
}

// ------------------------------------------------------------ cached text

/// The text `mlx_lm.cache_prompt` caches for `prompt`: the chat template
/// rendered over one user turn left open (HF's `continue_final_message`),
/// or the prompt itself when the model has no template.
pub fn cache_prompt_text(tok: &Tokenizer, messages: &[Message]) -> Result<String> {
    let Some(template) = &tok.chat_template else {
        return Ok(messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join(""));
    };
    let rendered = template.render(messages, false)?;
    let last = messages
        .last()
        .ok_or_else(|| anyhow!("no message to cache"))?
        .content
        .as_str();
    continue_final_message(&rendered, last)
}

/// Cuts a rendered chat right after the final message's content, as HF's
/// `apply_chat_template(continue_final_message=True)` does.
fn continue_final_message(rendered: &str, last: &str) -> Result<String> {
    let stripped = last.trim();
    let at = rendered.rfind(stripped).ok_or_else(|| {
        anyhow!("the chat template does not reproduce the final message; it cannot be continued")
    })?;
    let lstripped = last.trim_start();
    let end = if rendered[at..].starts_with(lstripped) {
        at + lstripped.len()
    } else {
        at + stripped.len()
    };
    Ok(rendered[..end].to_string())
}

/// The text `mlx_lm.generate --prompt-cache-file` sends after a cache: the
/// templated turn for `prompt`, from where the user's content begins (the
/// cached text already holds the turn's opening).
pub fn prompt_after_cache(
    tok: &Tokenizer,
    prompt: &str,
    system: Option<&str>,
    use_chat_template: bool,
) -> Result<String> {
    let Some(template) = tok.chat_template.as_ref().filter(|_| use_chat_template) else {
        return Ok(prompt.to_string());
    };
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(Message::new("system", s));
    }
    messages.push(Message::new("user", prompt));
    let full = template.render(&messages, true)?;
    messages.last_mut().unwrap().content = "<query>".into();
    let probe = template.render(&messages, true)?;
    let at = probe
        .find("<query>")
        .ok_or_else(|| anyhow!("the chat template drops the user's message"))?;
    full.get(at..)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("the chat template renders the prompt unexpectedly"))
}

/// Processes `tokens` into `caches` as `mlx_lm.cache_prompt` does: all but
/// the last in chunks of `step`, then the last on its own. `progress` sees
/// the tokens processed so far and the total.
pub fn fill(
    model: &Model,
    caches: &mut [Box<dyn KvCache>],
    tokens: &[u32],
    step: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let Some((last, rest)) = tokens.split_last() else {
        bail!("the prompt is empty");
    };
    crate::generate::prefill_with_progress(model, caches, rest, step, progress)?;
    let input = Array::from_slice(&[*last as i32], &[1, 1]);
    model.decoder.hidden(&input, caches)?;
    crate::generate::eval_caches(caches)?;
    progress(tokens.len(), tokens.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_final_message_cuts_after_the_content() {
        let r = "<|im_start|>user\nHello there<|im_end|>\n";
        assert_eq!(
            continue_final_message(r, "Hello there").unwrap(),
            "<|im_start|>user\nHello there"
        );
        // Trailing space trimmed by the template: cut after the stripped text.
        let r = "<|im_start|>user\nHi<|im_end|>\n";
        assert_eq!(
            continue_final_message(r, "Hi  ").unwrap(),
            "<|im_start|>user\nHi"
        );
        assert!(continue_final_message(r, "absent").is_err());
    }
}
