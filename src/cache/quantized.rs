//! The quantized KV cache (mlx-lm's `QuantizedKVCache`): keys and values
//! stored as MLX affine-quantized triples (packed uint32, scales, biases)
//! along the head dimension, attended to with `quantized_matmul`.
//!
//! mlx-lm starts a cache dense and converts it once its length reaches
//! `--quantized-kv-start` (checked after each forward pass). This cache does
//! the same from the inside: it stays a [`StandardCache`] until an update
//! begins at or past the start, then quantizes what it holds and continues
//! quantized, so a forward pass sees exactly the keys mlx-lm's would.
//! Rows of these caches decode together in a `BatchQuantizedCache`
//! (`batch_quantized.rs`).

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, quantize, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::batch_quantized::BatchQuantizedCache;
use super::{BatchCache, KvCache, StandardCache};

const STEP: i32 = 256;

/// KV quantization settings (`--kv-bits`, `--kv-group-size`,
/// `--quantized-kv-start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvQuantization {
    /// Bits per quantized value (`--kv-bits`: 2, 3, 4, 5, 6 or 8).
    pub bits: i32,
    /// Values sharing one scale and bias (`--kv-group-size`: 32, 64 or 128).
    pub group_size: i32,
    /// Positions kept dense before the cache turns quantized (`--quantized-kv-start`).
    pub start: usize,
}

impl KvQuantization {
    /// Checks the bits and group size; whether the group size divides a
    /// model's cached widths is checked against the model
    /// (`Decoder::check_kv`).
    pub(crate) fn validate(&self) -> Result<()> {
        if !matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8) {
            bail!("--kv-bits must be one of 2, 3, 4, 5, 6, 8");
        }
        if !matches!(self.group_size, 32 | 64 | 128) {
            bail!("--kv-group-size must be 32, 64 or 128");
        }
        Ok(())
    }
}

/// Quantized keys and values, each `[packed, scales, biases]` shaped
/// `[batch, kv_heads, positions, *]`.
#[derive(Clone)]
pub struct QuantizedState {
    /// The keys' packed values, scales and biases.
    pub keys: [Array; 3],
    /// The values' packed values, scales and biases.
    pub values: [Array; 3],
    /// Values sharing one scale and bias.
    pub group_size: i32,
    /// Bits per quantized value.
    pub bits: i32,
    /// The cache's buffers (keys, then values) where they hold spare
    /// positions after the ones above: `keys` and `values` are their first
    /// `len()` positions, for attention that reads the buffers directly.
    pub buffers: Option<Box<[[Array; 3]; 2]>>,
}

impl QuantizedState {
    /// Positions held.
    pub fn len(&self) -> i32 {
        self.keys[0].shape()[2]
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone)]
enum Store {
    Dense(StandardCache),
    Quantized {
        keys: [Array; 3],
        values: [Array; 3],
    },
}

/// One layer's quantized KV cache (mlx-lm's `QuantizedKVCache`), dense until
/// `start` positions are held.
#[derive(Clone)]
pub struct QuantizedCache {
    store: Store,
    offset: usize,
    q: KvQuantization,
}

pub(super) fn quantize3(a: &Array, q: &KvQuantization) -> Result<[Array; 3]> {
    let (w, s, b) = quantize(a, q.group_size, q.bits)?;
    Ok([w, s, b])
}

fn grow3(buf: &[Array; 3], live: i32, needed: i32) -> Result<[Array; 3]> {
    let steps = (needed + STEP - 1) / STEP;
    let mut out = buf.clone();
    for (o, x) in out.iter_mut().zip(buf) {
        let s = x.shape();
        let fresh = zeros_dtype(&[s[0], s[1], steps * STEP, s[3]], x.dtype())?;
        *o = concatenate(&[x.index((.., .., ..live, ..)), fresh], 2)?;
    }
    Ok(out)
}

impl QuantizedCache {
    /// A cache that turns quantized once `q.start` positions are held.
    pub fn new(q: KvQuantization) -> Self {
        Self {
            store: Store::Dense(StandardCache::new()),
            offset: 0,
            q,
        }
    }

    /// A quantized cache holding `state` (`offset` live positions).
    pub(crate) fn from_state(state: QuantizedState, offset: usize) -> Result<Self> {
        let q = KvQuantization {
            bits: state.bits,
            group_size: state.group_size,
            start: 0,
        };
        Self::with_state(state, offset, q)
    }

    /// A quantized cache holding `state` (`offset` live positions) whose
    /// settings are `q` (a row leaving a batch keeps the batch's start).
    pub(crate) fn with_state(
        state: QuantizedState,
        offset: usize,
        q: KvQuantization,
    ) -> Result<Self> {
        if state.len() as usize != offset {
            bail!(
                "quantized state has {} positions, offset says {offset}",
                state.len()
            );
        }
        if (state.bits, state.group_size) != (q.bits, q.group_size) {
            bail!(
                "quantized state has {} bits (group {}), the cache {} (group {})",
                state.bits,
                state.group_size,
                q.bits,
                q.group_size
            );
        }
        Ok(Self {
            store: Store::Quantized {
                keys: state.keys,
                values: state.values,
            },
            offset,
            q,
        })
    }

    /// The quantization settings this cache was made with.
    pub fn settings(&self) -> KvQuantization {
        self.q
    }

    /// Converts to the quantized store when the start is reached.
    fn maybe_convert(&mut self) -> Result<()> {
        if let Store::Dense(dense) = &self.store {
            if self.offset >= self.q.start {
                if let Some((k, v)) = dense.state() {
                    self.store = Store::Quantized {
                        keys: quantize3(&k, &self.q)?,
                        values: quantize3(&v, &self.q)?,
                    };
                }
            }
        }
        Ok(())
    }

    fn live(&self, a: &[Array; 3]) -> [Array; 3] {
        let end = self.offset as i32;
        a.clone().map(|x| x.index((.., .., ..end, ..)))
    }
}

impl KvCache for QuantizedCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        match &mut self.store {
            Store::Dense(dense) => {
                let out = dense.update_and_fetch(keys, values)?;
                self.offset = dense.offset();
                Ok(out)
            }
            Store::Quantized { .. } => {
                bail!("a quantized KV cache is read through update_quantized")
            }
        }
    }

    fn update_quantized(&mut self, keys: &Array, values: &Array) -> Result<Option<QuantizedState>> {
        self.maybe_convert()?;
        let offset = self.offset as i32;
        let q = self.q;
        let Store::Quantized {
            keys: kb,
            values: vb,
        } = &mut self.store
        else {
            return Ok(None);
        };
        let n = keys.shape()[2];
        if offset + n > kb[0].shape()[2] {
            *kb = grow3(kb, offset, n)?;
            *vb = grow3(vb, offset, n)?;
        }
        let (nk, nv) = (quantize3(keys, &q)?, quantize3(values, &q)?);
        super::write_at(
            kb.iter_mut().chain(vb.iter_mut()).collect(),
            nk.iter().chain(&nv).collect(),
            offset,
        )?;
        self.offset += n as usize;
        Ok(self.quantized_state())
    }

    fn quantized_state(&self) -> Option<QuantizedState> {
        let (keys, values, buffers) = match &self.store {
            Store::Quantized { keys, values } => (
                self.live(keys),
                self.live(values),
                Some(Box::new([keys.clone(), values.clone()])),
            ),
            // Saved after the start: quantize as mlx-lm's conversion would.
            Store::Dense(d) if self.offset >= self.q.start => {
                let (k, v) = d.state()?;
                let (k, v) = (quantize3(&k, &self.q).ok()?, quantize3(&v, &self.q).ok()?);
                (k, v, None)
            }
            Store::Dense(_) => return None,
        };
        Some(QuantizedState {
            keys,
            values,
            group_size: self.q.group_size,
            bits: self.q.bits,
            buffers,
        })
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: usize) -> usize {
        if let Store::Dense(d) = &mut self.store {
            let n = d.trim(n);
            self.offset = d.offset();
            return n;
        }
        let n = n.min(self.offset);
        self.offset -= n;
        n
    }

    fn state(&self) -> Option<(Array, Array)> {
        match &self.store {
            Store::Dense(d) => d.state(),
            Store::Quantized { .. } => None,
        }
    }

    fn set_state(&mut self, keys: Array, values: Array, offset: usize) -> Result<()> {
        let mut d = StandardCache::new();
        d.set_state(keys, values, offset)?;
        self.store = Store::Dense(d);
        self.offset = offset;
        Ok(())
    }

    fn arrays(&self) -> Vec<Array> {
        match &self.store {
            Store::Dense(d) => d.arrays(),
            Store::Quantized { keys, values } => keys.iter().chain(values).cloned().collect(),
        }
    }

    fn nbytes(&self) -> usize {
        match &self.store {
            Store::Dense(d) => d.nbytes(),
            Store::Quantized { keys, values } => {
                keys.iter().chain(values).map(|a| a.nbytes()).sum()
            }
        }
    }

    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn kind(&self) -> &'static str {
        match &self.store {
            Store::Dense(_) if self.offset < self.q.start => "KVCache",
            _ => "QuantizedKVCache",
        }
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(BatchQuantizedCache::new(self.q)))
    }
}

/// Casts the scales and biases of a quantized state to `dtype`.
pub(crate) fn cast_state(state: QuantizedState, dtype: Dtype) -> Result<QuantizedState> {
    let cast = |a: [Array; 3]| -> Result<[Array; 3]> {
        let [w, s, b] = a;
        Ok([w, s.as_dtype(dtype)?, b.as_dtype(dtype)?])
    };
    Ok(QuantizedState {
        buffers: None,
        keys: cast(state.keys)?,
        values: cast(state.values)?,
        ..state
    })
}
