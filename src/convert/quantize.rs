//! A model's tensors as a conversion handles them: a name → array map plus
//! the affine quantization of each quantized layer, with the transforms
//! `convert` applies (cast, dequantize, quantize) and the `quantization`
//! entry of `config.json` they imply.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use mlx_rs::ops::{dequantize, quantize};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};

use crate::mlx_ext::cast_float;
use crate::quant::{QuantMode, QuantSpec};

/// Checks an affine group size and bit width.
pub fn validate_spec(spec: QuantSpec) -> Result<()> {
    QuantMode::Affine.validate(spec.group_size, spec.bits)
}

/// `mx.quantize(w, group_size, bits, mode=mode)`: `[weight, scales]` plus
/// `biases` for affine.
pub(crate) fn quantize_with_mode(
    w: &Array,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Vec<Array>> {
    crate::quant::quantize(
        w,
        QuantSpec {
            group_size,
            bits,
            mode,
        },
    )
}

/// `mx.dequantize` for any mode; `biases` is None for the float modes.
pub(crate) fn dequantize_with_mode(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    crate::quant::dequantize(
        w,
        scales,
        biases,
        QuantSpec {
            group_size,
            bits,
            mode,
        },
    )
}

/// Tensors by name; `quantized` maps a layer prefix (`model.layers.0.mlp.up_proj`)
/// to the spec of its `weight`/`scales`/`biases` triple.
#[derive(Default)]
pub(crate) struct TensorSet {
    pub tensors: BTreeMap<String, Array>,
    pub quantized: BTreeMap<String, QuantSpec>,
}

impl TensorSet {
    pub fn insert(&mut self, name: String, array: Array) {
        self.tensors.insert(name, array);
    }

    /// Casts every floating tensor (norms, scales, biases, dense weights) to `dtype`.
    pub(crate) fn cast(&mut self, dtype: Dtype) -> Result<()> {
        for array in self.tensors.values_mut() {
            *array = cast_float(array.clone(), dtype)?;
        }
        Ok(())
    }

    fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors
            .remove(name)
            .with_context(|| format!("tensor {name:?} is missing"))
    }

    /// The dense weight of a quantized layer, in `dtype`; removes its triple.
    fn dequantize_layer(&mut self, prefix: &str, dtype: Dtype) -> Result<Array> {
        let spec = self
            .quantized
            .remove(prefix)
            .with_context(|| format!("{prefix} is not quantized"))?;
        let weight = self.take(&format!("{prefix}.weight"))?;
        // Dequantizing in float32 keeps float16 scales from rounding the result.
        let scales = self
            .take(&format!("{prefix}.scales"))?
            .as_dtype(Dtype::Float32)?;
        let biases = self
            .take(&format!("{prefix}.biases"))?
            .as_dtype(Dtype::Float32)?;
        let dense = dequantize(&weight, &scales, &biases, spec.group_size, spec.bits)
            .with_context(|| format!("dequantizing {prefix}"))?;
        Ok(dense.as_dtype(dtype)?)
    }

    /// Replaces every quantized layer by its dense weight in `dtype`.
    pub(crate) fn dequantize_all(&mut self, dtype: Dtype) -> Result<()> {
        let prefixes: Vec<String> = self.quantized.keys().cloned().collect();
        for prefix in prefixes {
            let dense = self.dequantize_layer(&prefix, dtype)?;
            self.tensors.insert(format!("{prefix}.weight"), dense);
        }
        Ok(())
    }

    /// Layer prefixes whose weight is a matrix (packed or dense): the linear
    /// layers and embeddings.
    pub(crate) fn matrix_layers(&self) -> Vec<String> {
        self.tensors
            .iter()
            .filter(|(_, a)| a.ndim() == 2)
            .filter_map(|(name, _)| name.strip_suffix(".weight").map(str::to_string))
            .collect()
    }

    /// Quantizes the layer at `prefix` (dequantizing it first when it already
    /// is). Returns false, leaving it dense, when its input dimension is not a
    /// multiple of the group size.
    pub(crate) fn quantize_layer(
        &mut self,
        prefix: &str,
        spec: QuantSpec,
        dtype: Dtype,
    ) -> Result<bool> {
        let name = format!("{prefix}.weight");
        let dense = if self.quantized.contains_key(prefix) {
            self.dequantize_layer(prefix, Dtype::Float32)?
        } else {
            self.take(&name)?.as_dtype(Dtype::Float32)?
        };
        if dense.shape()[1] % spec.group_size != 0 {
            self.tensors.insert(name, dense.as_dtype(dtype)?);
            return Ok(false);
        }
        let (weight, scales, biases) = quantize(&dense, spec.group_size, spec.bits)
            .with_context(|| format!("quantizing {prefix}"))?;
        self.tensors.insert(name, weight);
        self.tensors
            .insert(format!("{prefix}.scales"), scales.as_dtype(dtype)?);
        self.tensors
            .insert(format!("{prefix}.biases"), biases.as_dtype(dtype)?);
        self.quantized.insert(prefix.to_string(), spec);
        Ok(true)
    }

    /// The `quantization` entry of `config.json`: the most common spec, with
    /// per-layer overrides for the layers that differ. None when nothing is quantized.
    pub fn quantization_config(&self) -> Option<Value> {
        let mut counts: BTreeMap<(i32, i32), usize> = BTreeMap::new();
        for spec in self.quantized.values() {
            *counts.entry((spec.group_size, spec.bits)).or_default() += 1;
        }
        let (&(group_size, bits), _) = counts.iter().max_by_key(|(key, n)| (**n, key.1))?;
        let mut q = Map::new();
        q.insert("group_size".into(), json!(group_size));
        q.insert("bits".into(), json!(bits));
        for (prefix, spec) in &self.quantized {
            if (spec.group_size, spec.bits) != (group_size, bits) {
                q.insert(
                    prefix.clone(),
                    json!({"group_size": spec.group_size, "bits": spec.bits}),
                );
            }
        }
        Some(Value::Object(q))
    }

    /// Bytes the tensors take once evaluated.
    pub fn nbytes(&self) -> usize {
        self.tensors.values().map(|a| a.nbytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(rows: i32, cols: i32) -> Array {
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        Array::from_slice(&data, &[rows, cols])
    }

    #[test]
    fn quantize_round_trip_and_config() {
        let mut set = TensorSet::default();
        set.insert("a.weight".into(), dense(8, 64));
        set.insert("b.weight".into(), dense(8, 64));
        set.insert("c.weight".into(), dense(8, 64));
        set.insert("odd.weight".into(), dense(4, 48));
        set.insert("norm.weight".into(), Array::from_slice(&[1f32; 64], &[64]));
        let spec = QuantSpec::affine(64, 4);
        assert_eq!(set.matrix_layers(), ["a", "b", "c", "odd"]);
        assert!(set.quantize_layer("a", spec, Dtype::Float32).unwrap());
        assert!(set.quantize_layer("b", spec, Dtype::Float32).unwrap());
        assert!(set.quantize_layer("c", spec, Dtype::Float32).unwrap());
        assert!(!set.quantize_layer("odd", spec, Dtype::Float32).unwrap());
        let eight = QuantSpec::affine(32, 8);
        assert!(set.quantize_layer("b", eight, Dtype::Float32).unwrap());
        let q = set.quantization_config().unwrap();
        assert_eq!(q["bits"], 4);
        assert_eq!(q["group_size"], 64);
        assert_eq!(q["b"], json!({"group_size": 32, "bits": 8}));
        assert!(q.get("odd").is_none());

        set.dequantize_all(Dtype::Float32).unwrap();
        assert!(set.quantized.is_empty());
        let back = &set.tensors["a.weight"];
        assert_eq!(back.shape(), &[8, 64]);
        let err = (back - dense(8, 64)).abs().unwrap().max(None).unwrap();
        assert!(
            // One 4-bit step over the data's range [-1, 1].
            err.item_cast::<f32>() <= 2.0 / 15.0,
            "4-bit error {}",
            err.item_cast::<f32>()
        );
    }
}
