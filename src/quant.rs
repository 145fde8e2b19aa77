//! Quantization as MLX knows it, on the ground floor: the modes
//! ([`QuantMode`]), how one layer is quantized ([`QuantSpec`]), mlx-lm's
//! `quantization` block of config.json ([`Quantization`]), and MLX's
//! quantized ops called through mlx-c in every mode (mlx-rs 0.33 passes
//! `affine` only). Plain data and MLX calls, naming nothing above them:
//! the model, convert, train and upload stand on it.

use std::collections::BTreeMap;
use std::ffi::CString;

use anyhow::{bail, Result};
use mlx_rs::{Array, Dtype, Stream};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// MLX's quantization modes (`mx.quantize(..., mode=)`): `affine` stores a
/// scale and a bias per group in the float dtype; the microscaling float
/// formats store one 8-bit scale per group and no bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantMode {
    /// A float scale and bias per group, 2 to 8 bits.
    Affine,
    /// OCP microscaling 4-bit floats, groups of 32.
    Mxfp4,
    /// NVIDIA's 4-bit floats, groups of 16.
    Nvfp4,
    /// OCP microscaling 8-bit floats, groups of 32.
    Mxfp8,
}

/// Group sizes and bit widths MLX's affine quantization accepts.
const GROUP_SIZES: [i32; 3] = [32, 64, 128];
const BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];

impl QuantMode {
    /// The mode MLX names `name` (`affine`, `mxfp4`, `nvfp4`, `mxfp8`).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "affine" => Self::Affine,
            "mxfp4" => Self::Mxfp4,
            "nvfp4" => Self::Nvfp4,
            "mxfp8" => Self::Mxfp8,
            other => {
                bail!("unknown quantization mode {other:?} (choose affine, mxfp4, nvfp4 or mxfp8)")
            }
        })
    }

    /// MLX's name of the mode, as config.json and `mx.quantize` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Affine => "affine",
            Self::Mxfp4 => "mxfp4",
            Self::Nvfp4 => "nvfp4",
            Self::Mxfp8 => "mxfp8",
        }
    }

    /// MLX's `(group_size, bits)` when neither is given.
    pub fn defaults(self) -> (i32, i32) {
        match self {
            Self::Affine => (64, 4),
            Self::Mxfp4 => (32, 4),
            Self::Nvfp4 => (16, 4),
            Self::Mxfp8 => (32, 8),
        }
    }

    /// Whether the layer stores `biases` (affine only).
    pub(crate) fn has_biases(self) -> bool {
        self == Self::Affine
    }

    /// Checks a `(group_size, bits)` pair against what the mode allows.
    pub fn validate(self, group_size: i32, bits: i32) -> Result<()> {
        if self == Self::Affine {
            if !GROUP_SIZES.contains(&group_size) {
                bail!(
                    "quantization group size {group_size} is not supported (choose 32, 64 or 128)"
                );
            }
            if !BITS.contains(&bits) {
                bail!("{bits} quantization bits are not supported (choose 2, 3, 4, 5, 6 or 8)");
            }
            return Ok(());
        }
        if (group_size, bits) != self.defaults() {
            let (g, b) = self.defaults();
            bail!(
                "{} quantization takes exactly {b} bits with group size {g} (got {bits} bits, group size {group_size})",
                self.name()
            );
        }
        Ok(())
    }

    /// The mode of a packed layer from its shapes and scale dtype, as mlx-lm
    /// infers it: affine keeps float scales; each other mode has one
    /// `(bits, group_size)` pair.
    pub fn infer(scales_dtype: Dtype, group_size: i32, bits: i32) -> Option<Self> {
        if scales_dtype != Dtype::Uint8 {
            return Some(Self::Affine);
        }
        [Self::Nvfp4, Self::Mxfp4, Self::Mxfp8]
            .into_iter()
            .find(|m| m.defaults() == (group_size, bits))
    }
}

impl<'de> Deserialize<'de> for QuantMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name).map_err(de::Error::custom)
    }
}

/// How one layer is quantized: MLX mode, group size, bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// Weights sharing one scale (and bias, in affine mode).
    pub group_size: i32,
    /// Bits per weight.
    pub bits: i32,
    /// The MLX mode.
    pub mode: QuantMode,
}

impl QuantSpec {
    /// Affine quantization (a float scale and bias per group).
    pub const fn affine(group_size: i32, bits: i32) -> Self {
        Self {
            group_size,
            bits,
            mode: QuantMode::Affine,
        }
    }
}

/// mlx-lm's `quantization` block of config.json, parsed once: the model's
/// `group_size`/`bits`/`mode`, and per-layer entries keyed by the layer's
/// path (`model.layers.0.mlp.down_proj`) holding their own
/// `{group_size, bits, mode}`, or `false` for a layer left dense.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantization {
    /// The model's spec: every quantized layer not named on its own.
    pub default: QuantSpec,
    /// `None`: the layer is not quantized.
    pub layers: BTreeMap<String, Option<QuantSpec>>,
}

impl Quantization {
    /// Parses the block found at `field` of config.json; errors name the
    /// field inside it (`quantization.lm_head.bits: invalid type: ...`).
    pub fn parse(block: serde_json::Value, field: &str) -> Result<Self> {
        serde_path_to_error::deserialize(block).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                anyhow::anyhow!("{field}: {}", e.inner())
            } else {
                anyhow::anyhow!("{field}.{path}: {}", e.inner())
            }
        })
    }

    /// Every layer quantized with `spec`.
    pub fn uniform(spec: QuantSpec) -> Self {
        Self {
            default: spec,
            layers: BTreeMap::new(),
        }
    }

    /// What config.json says about the layer at `prefix`: `Some(None)` for
    /// a layer named `false`, `None` when it is not named on its own.
    pub fn named(&self, prefix: &str) -> Option<Option<QuantSpec>> {
        self.layers.get(prefix).copied()
    }

    /// Names the layers without `root` (a wrapper's `language_model.`), for
    /// a model whose tensors were renamed the same way.
    pub(crate) fn strip_layer_prefix(&mut self, root: &str) {
        self.layers = std::mem::take(&mut self.layers)
            .into_iter()
            .map(|(name, spec)| match name.strip_prefix(root) {
                Some(rest) => (rest.to_string(), spec),
                None => (name, spec),
            })
            .collect();
    }

    /// Checks every `(group_size, bits)` against its mode, naming the field.
    pub fn validate(&self) -> Result<()> {
        let check = |path: &str, s: &QuantSpec| {
            s.mode
                .validate(s.group_size, s.bits)
                .map_err(|e| anyhow::anyhow!("{path}: {e}"))
        };
        check("quantization", &self.default)?;
        for (name, spec) in &self.layers {
            if let Some(s) = spec {
                check(&format!("quantization.{name:?}"), s)?;
            }
        }
        Ok(())
    }
}

/// One per-layer entry: `{group_size, bits, mode}` (absent ones take the
/// mode's defaults, as MLX's `to_quantized`), `true` for the model's spec,
/// or `false`.
enum LayerEntry {
    Flag(bool),
    Spec(QuantSpec),
}

#[derive(Deserialize)]
struct LayerParams {
    #[serde(default)]
    group_size: Option<i32>,
    #[serde(default)]
    bits: Option<i32>,
    #[serde(default)]
    mode: Option<QuantMode>,
}

impl LayerParams {
    fn spec(self) -> QuantSpec {
        let mode = self.mode.unwrap_or(QuantMode::Affine);
        let (g, b) = mode.defaults();
        QuantSpec {
            group_size: self.group_size.unwrap_or(g),
            bits: self.bits.unwrap_or(b),
            mode,
        }
    }
}

impl<'de> Deserialize<'de> for LayerEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LayerEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object {group_size, bits, mode} or false")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<LayerEntry, E> {
                Ok(LayerEntry::Flag(b))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LayerEntry, A::Error> {
                let p = LayerParams::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(LayerEntry::Spec(p.spec()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Quantization {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Quantization;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object {group_size, bits, mode, <layer path>: {...} or false}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Quantization, A::Error> {
                let (mut group_size, mut bits, mut mode) = (None, None, None);
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "group_size" => group_size = Some(map.next_value::<i32>()?),
                        "bits" => bits = Some(map.next_value::<i32>()?),
                        "mode" => mode = Some(map.next_value::<QuantMode>()?),
                        _ => {
                            let entry: LayerEntry = map.next_value()?;
                            entries.push((key, entry));
                        }
                    }
                }
                let default = QuantSpec {
                    group_size: group_size.ok_or_else(|| de::Error::missing_field("group_size"))?,
                    bits: bits.ok_or_else(|| de::Error::missing_field("bits"))?,
                    mode: mode.unwrap_or(QuantMode::Affine),
                };
                let layers = entries
                    .into_iter()
                    .map(|(k, e)| {
                        let spec = match e {
                            LayerEntry::Flag(true) => Some(default),
                            LayerEntry::Flag(false) => None,
                            LayerEntry::Spec(s) => Some(s),
                        };
                        (k, spec)
                    })
                    .collect();
                Ok(Quantization { default, layers })
            }
        }
        d.deserialize_map(V)
    }
}

// MLX's quantized ops for every mode (`affine`, `mxfp4`, `nvfp4`, `mxfp8`):
// mlx-rs 0.33 passes `affine` only, so these call mlx-c with the mode of the
// layer's `QuantSpec`. `biases` is None for the float modes.

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

/// Runs one mlx-c op writing an array; `what` names it in the error.
pub(crate) fn call(
    what: impl FnOnce() -> String,
    f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    // SAFETY: `none` is an empty handle standing for an absent optional
    // array, freed here; `res` is owned by the returned Array on success
    // and freed on failure; the stream outlives the call.
    unsafe {
        let none = mlx_sys::mlx_array_new();
        let mut res = mlx_sys::mlx_array_new();
        let rc = f(&mut res, none, stream.as_ptr());
        mlx_sys::mlx_array_free(none);
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            bail!("MLX could not {}", what());
        }
        Ok(Array::from_ptr(res))
    }
}

fn mode_name(spec: QuantSpec) -> CString {
    CString::new(spec.mode.name()).expect("mode names have no NUL")
}

/// `mx.quantize(w, group_size, bits, mode)`: `[weight, scales]`, plus
/// `biases` in affine mode.
pub(crate) fn quantize(w: &Array, spec: QuantSpec) -> Result<Vec<Array>> {
    let mode = mode_name(spec);
    let stream = Stream::thread_local_or_default();
    // SAFETY: every handle passed is valid for the call; the output
    // vector is created here, read into owned Arrays, and freed once.
    unsafe {
        let none = mlx_sys::mlx_array_new();
        let mut out = mlx_sys::mlx_vector_array_new();
        let rc = mlx_sys::mlx_quantize(
            &mut out,
            w.as_ptr(),
            optional_int(spec.group_size),
            optional_int(spec.bits),
            mode.as_ptr(),
            none,
            stream.as_ptr(),
        );
        mlx_sys::mlx_array_free(none);
        if rc != 0 {
            mlx_sys::mlx_vector_array_free(out);
            bail!(
                "MLX could not quantize a {:?} array with mode {}, {} bits, group size {}",
                w.shape(),
                spec.mode.name(),
                spec.bits,
                spec.group_size
            );
        }
        let n = mlx_sys::mlx_vector_array_size(out);
        let arrays = (0..n)
            .map(|i| {
                let mut a = mlx_sys::mlx_array_new();
                mlx_sys::mlx_vector_array_get(&mut a, out, i);
                Array::from_ptr(a)
            })
            .collect();
        mlx_sys::mlx_vector_array_free(out);
        Ok(arrays)
    }
}

/// `mx.quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode)`.
pub(crate) fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    spec: QuantSpec,
) -> Result<Array> {
    let mode = mode_name(spec);
    let what = || {
        format!(
            "multiply {:?} by a {:?} {} matrix ({} bits, group size {})",
            x.shape(),
            w.shape(),
            spec.mode.name(),
            spec.bits,
            spec.group_size
        )
    };
    // SAFETY (inside `call`): valid handles owned by the caller.
    call(what, |res, none, s| unsafe {
        mlx_sys::mlx_quantized_matmul(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.map_or(none, |b| b.as_ptr()),
            transpose,
            optional_int(spec.group_size),
            optional_int(spec.bits),
            mode.as_ptr(),
            s,
        )
    })
}

/// `mx.dequantize(w, scales, biases, group_size, bits, mode)`.
pub(crate) fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> Result<Array> {
    let mode = mode_name(spec);
    let what = || {
        format!(
            "dequantize a {:?} {} matrix ({} bits, group size {})",
            w.shape(),
            spec.mode.name(),
            spec.bits,
            spec.group_size
        )
    };
    // SAFETY (inside `call`): valid handles owned by the caller; a
    // zeroed optional dtype is "none".
    call(what, |res, none, s| unsafe {
        let no_dtype: mlx_sys::mlx_optional_dtype = std::mem::zeroed();
        mlx_sys::mlx_dequantize(
            res,
            w.as_ptr(),
            scales.as_ptr(),
            biases.map_or(none, |b| b.as_ptr()),
            optional_int(spec.group_size),
            optional_int(spec.bits),
            mode.as_ptr(),
            none,
            no_dtype,
            s,
        )
    })
}

/// `mx.gather_qmm(x, w, scales, biases, rhs_indices=indices, transpose=True, ...)`.
pub(crate) fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    indices: &Array,
    sorted: bool,
    spec: QuantSpec,
) -> Result<Array> {
    let mode = mode_name(spec);
    let what = || {
        format!(
            "multiply {:?} by the {:?} {} experts ({} bits, group size {})",
            x.shape(),
            w.shape(),
            spec.mode.name(),
            spec.bits,
            spec.group_size
        )
    };
    // SAFETY (inside `call`): valid handles owned by the caller.
    call(what, |res, none, s| unsafe {
        mlx_sys::mlx_gather_qmm(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.map_or(none, |b| b.as_ptr()),
            none,
            indices.as_ptr(),
            true,
            optional_int(spec.group_size),
            optional_int(spec.bits),
            mode.as_ptr(),
            sorted,
            s,
        )
    })
}

#[cfg(test)]
mod tests {
    use mlx_rs::ops::indexing::IndexOp;
    use serde_json::json;

    use super::*;

    /// A `quantization` block as the config reader takes it: parsed, then checked.
    fn block(value: serde_json::Value) -> Result<Quantization> {
        let q = Quantization::parse(value, "quantization")?;
        q.validate()?;
        Ok(q)
    }

    #[test]
    fn the_block_is_typed_with_per_layer_entries() {
        let q = block(json!({
            "group_size": 32, "bits": 4, "mode": "mxfp4",
            "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8, "mode": "affine"},
            "model.layers.1.mlp.down_proj": {"bits": 6},
            "lm_head": false,
            "model.embed_tokens": true,
        }))
        .unwrap();
        let mxfp4 = QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Mxfp4,
        };
        assert_eq!(q.default, mxfp4);
        // A layer's spec: its own entry, else the model's.
        let spec_of = |prefix| q.named(prefix).unwrap_or(Some(q.default));
        assert_eq!(
            spec_of("model.layers.0.mlp.down_proj"),
            Some(QuantSpec::affine(64, 8))
        );
        // As MLX's `to_quantized`: missing keys take the entry's mode defaults.
        assert_eq!(
            spec_of("model.layers.1.mlp.down_proj"),
            Some(QuantSpec::affine(64, 6))
        );
        assert_eq!(q.named("lm_head"), Some(None));
        assert_eq!(spec_of("model.embed_tokens"), Some(mxfp4));
        assert_eq!(spec_of("model.layers.0.mlp.up_proj"), Some(mxfp4));
        // Without `mode`, affine.
        let plain = block(json!({"group_size": 64, "bits": 4})).unwrap();
        assert_eq!(plain.default, QuantSpec::affine(64, 4));
    }

    #[test]
    fn a_malformed_block_names_the_field() {
        let cases = [
            (
                json!({"group_size": "64", "bits": 4}),
                "quantization.group_size: invalid type: string",
            ),
            (
                json!({"bits": 4}),
                "quantization: missing field `group_size`",
            ),
            (
                json!({"group_size": 64, "bits": 4, "mode": "fp3"}),
                "quantization.mode: unknown quantization mode \"fp3\"",
            ),
            (
                json!({"group_size": 64, "bits": 4, "model.layers.0.mlp": 3}),
                "quantization.model.layers.0.mlp: invalid type: integer `3`, expected an object",
            ),
            (
                json!({"group_size": 64, "bits": 4, "lm_head": {"group_size": 64, "bits": "8"}}),
                "quantization.lm_head.bits: invalid type: string",
            ),
            (
                json!({"group_size": 64, "bits": 4, "lm_head": {"bits": 7}}),
                "quantization.\"lm_head\": 7 quantization bits are not supported",
            ),
            (
                json!([64, 4]),
                "quantization: invalid type: sequence, expected an object",
            ),
            (
                json!({"group_size": 48, "bits": 4}),
                "quantization: quantization group size 48",
            ),
            (
                json!({"group_size": 32, "bits": 8, "mode": "mxfp4"}),
                "mxfp4 quantization takes exactly 4 bits",
            ),
        ];
        for (value, want) in cases {
            let got = format!("{:#}", block(value.clone()).unwrap_err());
            assert!(got.contains(want), "{value}: {got}");
        }
    }

    #[test]
    fn modes_parse_check_and_infer_as_mlx() {
        for mode in [
            QuantMode::Affine,
            QuantMode::Mxfp4,
            QuantMode::Nvfp4,
            QuantMode::Mxfp8,
        ] {
            assert_eq!(QuantMode::parse(mode.name()).unwrap(), mode);
            let (g, b) = mode.defaults();
            mode.validate(g, b).unwrap();
            let scales = if mode.has_biases() {
                Dtype::Float16
            } else {
                Dtype::Uint8
            };
            assert_eq!(QuantMode::infer(scales, g, b), Some(mode));
        }
        assert!(QuantMode::Affine.validate(64, 7).is_err());
        assert!(QuantMode::Nvfp4.validate(32, 4).is_err());
        assert_eq!(QuantMode::infer(Dtype::Uint8, 64, 4), None);
    }

    /// Every mode through the three ops: `gather_qmm` over stacked experts
    /// equals `quantized_matmul` with each row's expert, which equals a
    /// matmul with the dequantized weight.
    #[test]
    fn every_mode_runs_the_quantized_ops() {
        let w = mlx_rs::random::normal::<f32>(&[2, 64, 128], None, None, None).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[3, 1, 128], None, None, None).unwrap();
        let experts = Array::from_slice(&[1u32, 0, 1], &[3]);
        for mode in [
            QuantMode::Affine,
            QuantMode::Mxfp4,
            QuantMode::Nvfp4,
            QuantMode::Mxfp8,
        ] {
            let (group_size, bits) = mode.defaults();
            let spec = QuantSpec {
                group_size,
                bits,
                mode,
            };
            let parts = quantize(&w, spec).unwrap();
            assert_eq!(parts.len(), if mode.has_biases() { 3 } else { 2 });
            let (q, s, b) = (&parts[0], &parts[1], parts.get(2));
            let gathered = gather_qmm(&x, q, s, b, &experts, false, spec).unwrap();
            assert_eq!(gathered.shape(), &[3, 1, 64]);
            for (row, e) in [1, 0, 1].into_iter().enumerate() {
                let row = row as i32;
                let (qe, se) = (q.index(e), s.index(e));
                let be = b.map(|b| b.index(e));
                let xr = x.index(row);
                let one = quantized_matmul(&xr, &qe, &se, be.as_ref(), true, spec).unwrap();
                let dense = dequantize(&qe, &se, be.as_ref(), spec).unwrap();
                let reference = mlx_rs::ops::matmul(&xr, dense.t()).unwrap();
                let diff = |a: &Array, b: &Array| {
                    (a - b).abs().unwrap().max(None).unwrap().item_cast::<f32>()
                };
                assert!(diff(&gathered.index(row), &one) < 1e-4, "{mode:?}");
                assert!(diff(&one, &reference) < 1e-3, "{mode:?}");
            }
        }
    }
}
