//! Checkpoints whose linear weights are float8 (`quant_method: fp8`, as
//! Mistral publishes Ministral 3): e4m3 weights, each with a
//! `weight_scale_inv`, and `activation_scale`s no MLX layer uses. As mlx-lm's
//! Ministral 3 `sanitize`: every weight times its scale, the activation
//! scales dropped. MLX loads the e4m3 bytes as uint8; they are read as
//! float8 in bfloat16 first (as mlx-lm's other fp8 `sanitize`s do), so the
//! weights keep their values.

use anyhow::{anyhow, bail, Result};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use super::family::Tensors;
use crate::mlx_ext::from_fp8;

/// Whether `quantization_config` describes float8 weights with scales of
/// their own, which convert folds into float weights. Power-of-two scales
/// over 32×32 blocks (`scale_fmt: ue8m0`) are mxfp8 to mlx-lm, which keeps
/// them packed; convert does not read those.
pub(crate) fn is_scaled_fp8(quantization_config: &Value) -> bool {
    let q = quantization_config;
    let mxfp8 = q.get("scale_fmt").and_then(Value::as_str) == Some("ue8m0")
        && q.get("weight_block_size") == Some(&serde_json::json!([32, 32]));
    q.get("quant_method").and_then(Value::as_str) == Some("fp8") && !mxfp8
}

/// Multiplies every weight by its `weight_scale_inv` and drops the scales
/// and the activation scales.
pub(crate) fn fold_scales(tensors: &mut Tensors) -> Result<()> {
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in &names {
        if name.contains("activation_scale") {
            tensors.remove(name);
        } else if let Some(base) = name.strip_suffix("_scale_inv") {
            let scale = tensors.remove(name).expect("listed above");
            let weight = tensors
                .remove(base)
                .ok_or_else(|| anyhow!("{name} has no weight {base} to scale"))?;
            tensors.insert(base.to_string(), scaled(base, &weight, &scale)?);
        } else if name.ends_with(".weight_scale") {
            bail!(
                "{name}: fp8 scales stored as weight_scale are not read \
                 (mlx-lm reads weight_scale_inv only)"
            );
        }
    }
    if let Some(name) = tensors.iter().find_map(|(n, a)| fp8_bytes(a).then_some(n)) {
        bail!("{name} holds float8 bytes without a weight_scale_inv");
    }
    Ok(())
}

fn fp8_bytes(a: &Array) -> bool {
    a.dtype() == Dtype::Uint8
}

/// `weight` (float8 bytes, or floats) times `scale`, which must broadcast
/// to it (one per tensor, row or column); block scales are refused.
fn scaled(name: &str, weight: &Array, scale: &Array) -> Result<Array> {
    if !broadcasts(scale.shape(), weight.shape()) {
        bail!(
            "{name}: fp8 scales {:?} for a weight {:?} are block scales, which are not read \
             (only per-tensor, per-row or per-column scales)",
            scale.shape(),
            weight.shape()
        );
    }
    let values = match fp8_bytes(weight) {
        true => from_fp8(weight, Dtype::Bfloat16)?,
        false => weight.clone(),
    };
    Ok(values.multiply(scale)?)
}

/// Whether `scale` broadcasts to `weight` (numpy's rules).
fn broadcasts(scale: &[i32], weight: &[i32]) -> bool {
    scale.len() <= weight.len()
        && scale
            .iter()
            .rev()
            .zip(weight.iter().rev())
            .all(|(&s, &w)| s == 1 || s == w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_fold_into_their_weights_and_activation_scales_go() {
        // e4m3 bytes of 1, 2, -1, 448.
        let bytes = Array::from_slice(&[0x38u8, 0x40, 0xb8, 0x7e], &[2, 2]);
        let mut t = Tensors::new();
        t.insert("l.weight".into(), bytes);
        t.insert("l.weight_scale_inv".into(), Array::from_f32(0.5));
        t.insert("l.activation_scale".into(), Array::from_f32(2.0));
        fold_scales(&mut t).unwrap();
        assert_eq!(t.len(), 1);
        let w = t["l.weight"].as_dtype(Dtype::Float32).unwrap();
        assert_eq!(w.as_slice::<f32>(), &[0.5, 1.0, -0.5, 224.0]);
    }

    #[test]
    fn block_scales_and_unscaled_bytes_are_refused() {
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&[0u8; 16], &[4, 4]));
        t.insert(
            "l.weight_scale_inv".into(),
            Array::from_slice(&[1f32; 4], &[2, 2]),
        );
        let err = fold_scales(&mut t).unwrap_err().to_string();
        assert!(err.contains("block scales"), "{err}");
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&[0u8; 4], &[2, 2]));
        let err = fold_scales(&mut t).unwrap_err().to_string();
        assert!(err.contains("without a weight_scale_inv"), "{err}");
    }

    #[test]
    fn mxfp8_blocks_are_not_scaled_fp8() {
        let fp8 = serde_json::json!({"quant_method": "fp8", "weight_block_size": null});
        assert!(is_scaled_fp8(&fp8));
        let mx = serde_json::json!({
            "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [32, 32],
        });
        assert!(!is_scaled_fp8(&mx));
    }
}
