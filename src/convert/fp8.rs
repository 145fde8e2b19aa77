//! Checkpoints whose linear weights are float8 (`quant_method: fp8`): e4m3
//! weights, each with a `weight_scale_inv`, and `activation_scale`s no MLX
//! layer uses. Two layouts of the scales are read. Mistral's (Ministral 3)
//! has one scale per tensor, row or column, multiplied in as mlx-lm's
//! Ministral 3 `sanitize` does. DeepSeek-V3's (also Kimi K2's, and most
//! published fp8 checkpoints) has one scale per block of
//! `quantization_config.weight_block_size` (normally 128×128) weights, the
//! blocks at the bottom and right edges cut short where the shape is not a
//! multiple of the block; as mlx-lm's DeepSeek-V3 `sanitize`, each weight is
//! multiplied by its block's scale and the result rounded to bfloat16.
//! MLX loads the e4m3 bytes as uint8; they are read as float8 in bfloat16
//! first (as mlx-lm's fp8 `sanitize`s do), so the weights keep their values.

use anyhow::{anyhow, bail, Result};
use mlx_rs::ops::broadcast_to;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use serde_json::{Map, Value};

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

/// Whether a config's `quantization_config` says scaled float8.
pub(crate) fn config_says_scaled_fp8(config: &Map<String, Value>) -> bool {
    config.get("quantization_config").is_some_and(is_scaled_fp8)
}

/// The `[rows, columns]` of the blocks that share one scale, as the
/// config's `quantization_config.weight_block_size` says; None when it does
/// not name one (scales per tensor, row or column).
fn block_size(config: &Map<String, Value>) -> Result<Option<[i32; 2]>> {
    let Some(size) = config
        .get("quantization_config")
        .and_then(|q| q.get("weight_block_size"))
        .filter(|v| !v.is_null())
    else {
        return Ok(None);
    };
    let sides: Vec<i32> = size
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_i64().and_then(|n| i32::try_from(n).ok()))
        .filter(|&n| n > 0)
        .collect();
    match sides[..] {
        [rows, columns] if size.as_array().map(Vec::len) == Some(2) => Ok(Some([rows, columns])),
        _ => bail!(
            "quantization_config.weight_block_size {size} is not two positive sizes \
             ([rows, columns])"
        ),
    }
}

/// Multiplies every weight by its `weight_scale_inv` (per tensor, row,
/// column, or block of the config's `weight_block_size`) and drops the
/// scales and the activation scales.
pub(crate) fn fold_scales(tensors: &mut Tensors, config: &Map<String, Value>) -> Result<()> {
    let block = block_size(config)?;
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in &names {
        if name.contains("activation_scale") {
            tensors.remove(name);
        } else if let Some(base) = name.strip_suffix("_scale_inv") {
            let scale = tensors.remove(name).expect("listed above");
            let weight = tensors
                .remove(base)
                .ok_or_else(|| anyhow!("{name} has no weight {base} to scale"))?;
            tensors.insert(base.to_string(), scaled(base, &weight, &scale, block)?);
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

/// `weight` (float8 bytes, or floats) times `scale`: one per block of
/// `block` when the config names a block size and the scale is a matrix,
/// else one that broadcasts to it (one per tensor, row or column).
fn scaled(name: &str, weight: &Array, scale: &Array, block: Option<[i32; 2]>) -> Result<Array> {
    if fp8_bytes(scale) {
        bail!(
            "{name}: fp8 scales stored as bytes (ue8m0 exponents) are not read; \
             only float scales are"
        );
    }
    let values = match fp8_bytes(weight) {
        true => from_fp8(weight, Dtype::Bfloat16)?,
        false => weight.clone(),
    };
    match block {
        Some(block) if scale.ndim() == 2 => {
            let per_weight = spread_over_blocks(name, scale, block, weight.shape())?;
            Ok(values.multiply(per_weight)?.as_dtype(Dtype::Bfloat16)?)
        }
        _ if broadcasts(scale.shape(), weight.shape()) => Ok(values.multiply(scale)?),
        _ => bail!(
            "{name}: fp8 scales {:?} for a weight {:?} neither broadcast (per tensor, row or \
             column) nor tile it in blocks (quantization_config.weight_block_size is {})",
            scale.shape(),
            weight.shape(),
            block.map_or("not given".to_string(), |[r, c]| format!("{r}×{c}"))
        ),
    }
}

/// Block scales `[⌈rows/r⌉, ⌈columns/c⌉]` repeated over their `[r, c]`
/// blocks and cut to the weight's `shape`, so each weight meets its block's
/// scale (the last row and column of blocks may be partial).
fn spread_over_blocks(name: &str, scale: &Array, [r, c]: [i32; 2], shape: &[i32]) -> Result<Array> {
    let &[rows, columns] = shape else {
        bail!("{name}: block fp8 scales are read for matrices only, not a weight {shape:?}");
    };
    let blocks = [(rows + r - 1) / r, (columns + c - 1) / c];
    if scale.shape() != blocks {
        bail!(
            "{name}: fp8 block scales {:?} do not tile a weight {shape:?} in {r}×{c} blocks \
             (expected {blocks:?})",
            scale.shape()
        );
    }
    let [br, bc] = blocks;
    let tiled = broadcast_to(scale.reshape(&[br, 1, bc, 1])?, &[br, r, bc, c])?
        .reshape(&[br * r, bc * c])?;
    Ok(tiled.index((..rows, ..columns)))
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

    fn config(quantization_config: Value) -> Map<String, Value> {
        let mut c = Map::new();
        c.insert("quantization_config".into(), quantization_config);
        c
    }

    #[test]
    fn scales_fold_into_their_weights_and_activation_scales_go() {
        // e4m3 bytes of 1, 2, -1, 448.
        let bytes = Array::from_slice(&[0x38u8, 0x40, 0xb8, 0x7e], &[2, 2]);
        let mut t = Tensors::new();
        t.insert("l.weight".into(), bytes);
        t.insert("l.weight_scale_inv".into(), Array::from_f32(0.5));
        t.insert("l.activation_scale".into(), Array::from_f32(2.0));
        fold_scales(&mut t, &Map::new()).unwrap();
        assert_eq!(t.len(), 1);
        let w = t["l.weight"].as_dtype(Dtype::Float32).unwrap();
        assert_eq!(w.as_slice::<f32>(), &[0.5, 1.0, -0.5, 224.0]);
    }

    #[test]
    fn block_scales_cover_their_blocks_and_the_partial_ones_at_the_edges() {
        // A 3×5 weight in 2×2 blocks: 2×3 scales, the last block row one
        // row high and the last block column one column wide. Every weight
        // is 1 (e4m3 0x38) but w[0][1] = -1 (0xb8) and w[2][4] = 2 (0x40).
        let mut bytes = [0x38u8; 15];
        bytes[1] = 0xb8;
        bytes[14] = 0x40;
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&bytes, &[3, 5]));
        let scales = Array::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]);
        t.insert("l.weight_scale_inv".into(), scales);
        let blocks =
            config(serde_json::json!({"quant_method": "fp8", "weight_block_size": [2, 2]}));
        fold_scales(&mut t, &blocks).unwrap();
        let w = &t["l.weight"];
        assert_eq!((w.dtype(), w.shape()), (Dtype::Bfloat16, &[3, 5][..]));
        let expected = [
            1., -1., 2., 2., 3., //
            1., 1., 2., 2., 3., //
            4., 4., 5., 5., 12.,
        ];
        assert_eq!(
            w.as_dtype(Dtype::Float32).unwrap().as_slice::<f32>(),
            &expected
        );
    }

    #[test]
    fn block_scales_that_do_not_tile_the_weight_are_refused() {
        let blocks =
            config(serde_json::json!({"quant_method": "fp8", "weight_block_size": [2, 2]}));
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&[0u8; 15], &[3, 5]));
        t.insert(
            "l.weight_scale_inv".into(),
            Array::from_slice(&[1f32; 4], &[2, 2]),
        );
        let err = fold_scales(&mut t, &blocks).unwrap_err().to_string();
        assert!(
            err.contains("do not tile a weight [3, 5] in 2×2 blocks (expected [2, 3])"),
            "{err}"
        );
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&[0u8; 4], &[2, 2]));
        t.insert(
            "l.weight_scale_inv".into(),
            Array::from_slice(&[127u8], &[1, 1]),
        );
        let err = fold_scales(&mut t, &blocks).unwrap_err().to_string();
        assert!(err.contains("stored as bytes (ue8m0"), "{err}");
        let bad = config(serde_json::json!({"quant_method": "fp8", "weight_block_size": [128]}));
        let err = fold_scales(&mut Tensors::new(), &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not two positive sizes"), "{err}");
    }

    #[test]
    fn scales_without_a_block_size_must_broadcast_and_bytes_need_a_scale() {
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&[0u8; 16], &[4, 4]));
        t.insert(
            "l.weight_scale_inv".into(),
            Array::from_slice(&[1f32; 4], &[2, 2]),
        );
        let err = fold_scales(&mut t, &Map::new()).unwrap_err().to_string();
        assert!(err.contains("neither broadcast"), "{err}");
        let mut t = Tensors::new();
        t.insert("l.weight".into(), Array::from_slice(&[0u8; 4], &[2, 2]));
        let err = fold_scales(&mut t, &Map::new()).unwrap_err().to_string();
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
