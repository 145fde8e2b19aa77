//! The header of a GGUF file: its metadata and the name, shape and type of
//! each tensor. The tensor data itself is read by MLX's loader.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};

const MAGIC: &[u8; 4] = b"GGUF";
/// Upper bound for one string or array length, against corrupt headers.
/// Every length is also capped by the bytes left in the file.
const MAX_LEN: u64 = 1 << 31;
/// Tensor data starts at a multiple of this unless `general.alignment` says otherwise.
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Any of GGUF's integer types, widened.
    Int(i64),
    /// A `float32` or `float64`.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            MetaValue::Int(v) => Some(*v),
            MetaValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// The value as a float (integers converted); None for other kinds.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            MetaValue::Float(v) => Some(*v),
            MetaValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The value as a boolean (integers: nonzero is true); None for other kinds.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            MetaValue::Bool(b) => Some(*b),
            MetaValue::Int(v) => Some(*v != 0),
            _ => None,
        }
    }

    /// The string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The element type of a GGUF tensor (ggml's type numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// 32-bit float.
    pub const F32: Self = Self(0);
    /// 16-bit float.
    pub const F16: Self = Self(1);
    /// 4-bit blocks of 32 with a float16 scale.
    pub const Q4_0: Self = Self(2);
    /// 4-bit blocks of 32 with a float16 scale and minimum.
    pub const Q4_1: Self = Self(3);
    /// 8-bit blocks of 32 with a float16 scale.
    pub const Q8_0: Self = Self(8);

    /// ggml's name of the type (`Q4_K`, `BF16`, ...), or `type N` for unknown numbers.
    pub fn name(self) -> String {
        const NAMES: [&str; 31] = [
            "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
            "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
            "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
            "BF16",
        ];
        NAMES
            .get(self.0 as usize)
            .map(|s| s.to_string())
            .unwrap_or_else(|| format!("type {}", self.0))
    }
}

/// Name, shape (outermost first, as MLX loads it) and type of one tensor.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The tensor's name in the GGUF file (such as `blk.0.attn_q.weight`).
    pub name: String,
    /// Its shape, outermost dimension first.
    pub shape: Vec<u64>,
    /// Its element type.
    pub ggml_type: GgmlType,
    /// Start of its data, relative to `GgufHeader::data_offset`.
    pub offset: u64,
}

impl TensorInfo {
    /// Bytes of its data, for the types convert reads (`None` for others or
    /// on overflow).
    pub(crate) fn data_bytes(&self) -> Option<u64> {
        let (block, block_bytes) = match self.ggml_type {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
            _ => return None,
        };
        let elements = self
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        if elements % block != 0 {
            return None;
        }
        (elements / block).checked_mul(block_bytes)
    }
}

/// Everything before the tensor data.
#[derive(Debug)]
pub struct GgufHeader {
    /// The GGUF format version (2 or 3).
    pub version: u32,
    /// The key/value metadata, by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// The tensors, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Where the tensor data begins in the file (aligned).
    pub data_offset: u64,
}

impl GgufHeader {
    /// Reads the header of `path` and checks that the data of every tensor of
    /// a type convert reads lies inside the file (MLX's loader trusts it).
    pub fn read(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        let mut r = Reader::new(BufReader::new(file), len);
        Self::parse(&mut r)
            .and_then(|h| h.check_data(len).map(|()| h))
            .with_context(|| format!("reading the GGUF header of {}", path.display()))
    }

    /// Parses and checks a whole GGUF file held in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let h = Self::parse(&mut Reader::new(bytes, bytes.len() as u64))?;
        h.check_data(bytes.len() as u64)?;
        Ok(h)
    }

    /// Checks each tensor's data range against a file of `file_len` bytes.
    pub(crate) fn check_data(&self, file_len: u64) -> Result<()> {
        for t in &self.tensors {
            let Some(bytes) = t.data_bytes() else {
                if [
                    GgmlType::F32,
                    GgmlType::F16,
                    GgmlType::Q4_0,
                    GgmlType::Q4_1,
                    GgmlType::Q8_0,
                ]
                .contains(&t.ggml_type)
                {
                    bail!(
                        "tensor {:?}: shape {:?} does not fit type {}",
                        t.name,
                        t.shape,
                        t.ggml_type.name()
                    );
                }
                continue;
            };
            let end = self
                .data_offset
                .checked_add(t.offset)
                .and_then(|start| start.checked_add(bytes));
            if end.is_none_or(|end| end > file_len) {
                bail!(
                    "tensor {:?} ({} bytes at offset {}) lies beyond the end of the file ({file_len} bytes; truncated?)",
                    t.name,
                    bytes,
                    t.offset
                );
            }
        }
        Ok(())
    }

    fn parse<R: Read>(r: &mut Reader<R>) -> Result<Self> {
        let magic: [u8; 4] = r
            .bytes()
            .context("the file is too short to be a GGUF file")?;
        if &magic != MAGIC {
            bail!("not a GGUF file (it does not start with the GGUF magic bytes)");
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            bail!("unsupported GGUF version {version} (supported: 2 and 3)");
        }
        let n_tensors = r.len()?;
        let n_kv = r.len()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let kind = r.u32()?;
            let value = r.value(kind).with_context(|| format!("metadata {key:?}"))?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims > 8 {
                bail!("tensor {name:?} claims {n_dims} dimensions");
            }
            let mut shape = (0..n_dims).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            shape.reverse();
            let ggml_type = GgmlType(r.u32()?);
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                shape,
                ggml_type,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_i64()
                .filter(|&a| a > 0 && (a as u64).is_power_of_two())
                .map(|a| a as u64)
                .with_context(|| format!("general.alignment must be a power of two, got {v:?}"))?,
        };
        let data_offset = r.pos.div_ceil(alignment) * alignment;
        Ok(Self {
            version,
            metadata,
            tensors,
            data_offset,
        })
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The metadata string under `key`.
    pub fn string(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetaValue::as_str)
    }

    pub(crate) fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(MetaValue::as_i64)
    }

    /// The metadata number under `key`, as a float.
    pub fn float(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(MetaValue::as_f64)
    }

    pub(crate) fn require_int(&self, key: &str) -> Result<i64> {
        self.int(key)
            .with_context(|| format!("the GGUF metadata lacks the integer {key:?}"))
    }

    /// A list of strings, e.g. `tokenizer.ggml.tokens`.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .with_context(|| format!("GGUF metadata {key:?} is not a list"))?;
        items
            .iter()
            .map(|v| {
                v.as_str()
                    .with_context(|| format!("GGUF metadata {key:?} is not a list of strings"))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A list of integers, e.g. `tokenizer.ggml.token_type`.
    pub fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .with_context(|| format!("GGUF metadata {key:?} is not a list"))?;
        items
            .iter()
            .map(|v| {
                v.as_i64()
                    .with_context(|| format!("GGUF metadata {key:?} is not a list of integers"))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// Reads the header, counting bytes so that no length can claim more than
/// the file holds (a corrupt length never turns into a huge allocation).
struct Reader<R> {
    inner: R,
    pos: u64,
    file_len: u64,
}

impl<R: Read> Reader<R> {
    fn new(inner: R, file_len: u64) -> Self {
        Self {
            inner,
            pos: 0,
            file_len,
        }
    }

    fn remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos)
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.inner
            .read_exact(&mut buf)
            .context("the GGUF header ends early")?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A count of strings, values or bytes: each takes at least a byte, so
    /// it cannot exceed what is left of the file.
    fn len(&mut self) -> Result<u64> {
        let n = self.u64()?;
        if n > MAX_LEN || n > self.remaining() {
            bail!(
                "implausible length {n} in the GGUF header at byte {} (only {} bytes follow; corrupt file?)",
                self.pos - 8,
                self.remaining()
            );
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .context("the GGUF header ends early")?;
        self.pos += n;
        String::from_utf8(buf).context("a GGUF string is not valid UTF-8")
    }

    fn value(&mut self, kind: u32) -> Result<MetaValue> {
        Ok(match kind {
            0 => MetaValue::Int(u8::from_le_bytes(self.bytes()?) as i64),
            1 => MetaValue::Int(i8::from_le_bytes(self.bytes()?) as i64),
            2 => MetaValue::Int(u16::from_le_bytes(self.bytes()?) as i64),
            3 => MetaValue::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => MetaValue::Int(self.u32()? as i64),
            5 => MetaValue::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => MetaValue::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => MetaValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => MetaValue::Str(self.string()?),
            9 => {
                let item_kind = self.u32()?;
                if item_kind == 9 {
                    bail!("nested metadata arrays are not supported");
                }
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    items.push(self.value(item_kind)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::Int(self.u64()? as i64),
            11 => MetaValue::Int(i64::from_le_bytes(self.bytes()?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.bytes()?)),
            other => bail!("unknown metadata value type {other}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(bytes: &[u8]) -> Result<GgufHeader> {
        GgufHeader::parse(&mut Reader::new(bytes, bytes.len() as u64))
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = (s.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn parses_metadata_and_tensor_infos() {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(string("general.architecture"));
        b.extend(8u32.to_le_bytes());
        b.extend(string("llama"));
        b.extend(string("ids"));
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(7i32.to_le_bytes());
        b.extend((-1i32).to_le_bytes());
        b.extend(string("w.weight"));
        b.extend(2u32.to_le_bytes());
        b.extend(64u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let h = header(&b).unwrap();
        assert_eq!(h.string("general.architecture"), Some("llama"));
        assert_eq!(h.ints("ids").unwrap(), Some(vec![7, -1]));
        assert_eq!(h.tensors[0].shape, vec![3, 64]);
        assert_eq!(h.tensors[0].ggml_type, GgmlType::Q4_1);
    }

    #[test]
    fn lengths_are_capped_by_the_file_and_data_must_fit() {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend((1u64 << 30).to_le_bytes());
        let err = format!("{:#}", header(&b).unwrap_err());
        assert!(err.contains("implausible length"), "{err}");

        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(string("w.weight"));
        b.extend(1u32.to_le_bytes());
        b.extend(64u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let err = format!("{:#}", GgufHeader::from_bytes(&b).unwrap_err());
        assert!(err.contains("beyond the end of the file"), "{err}");
        let data_offset = b.len().div_ceil(32) * 32;
        b.resize(data_offset + 256, 0);
        let h = GgufHeader::from_bytes(&b).unwrap();
        assert_eq!(h.data_offset, data_offset as u64);
    }

    #[test]
    fn rejects_non_gguf_and_truncated_input() {
        let err = header(b"PK\x03\x04 something else").unwrap_err();
        assert!(err.to_string().contains("not a GGUF file"), "{err}");
        let err = header(b"GGUF\x03\0\0\0\x01").unwrap_err();
        assert!(format!("{err:#}").contains("ends early"), "{err:#}");
    }
}
