//! The cache of a layer that keeps a running state instead of keys and
//! values (mlx-lm's `ArraysCache`): the gated DeltaNet layers of the hybrid
//! Qwen families keep the last inputs of their short convolution and their
//! recurrent state, both `[rows, ...]`.
//!
//! A state summarizes every position seen, so it cannot drop positions: it
//! is not trimmable (speculative decoding refuses it), and its batch form
//! cannot drop rejected drafts. Rows join a batch already prefilled, so rows
//! of different lengths simply stack along the first axis: no padding.

use anyhow::{bail, ensure, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::{BatchCache, KvCache};

/// The arrays of one state layer, for one sequence or for a batch of rows.
#[derive(Clone, Default)]
pub struct StateCache {
    /// The last `kernel - 1` convolution inputs, `[rows, kernel - 1, channels]`.
    conv: Option<Array>,
    /// The recurrent state, `[rows, heads, value_dim, key_dim]`.
    recurrent: Option<Array>,
    /// Per row: positions seen.
    lengths: Vec<usize>,
    /// Whether this is a batch cache (rows join and leave).
    batch: bool,
}

impl StateCache {
    /// An empty cache for one sequence.
    pub fn new() -> Self {
        Self {
            lengths: vec![0],
            ..Self::default()
        }
    }

    /// A batch cache with no rows.
    fn empty_batch_cache() -> Self {
        Self {
            batch: true,
            ..Self::default()
        }
    }

    /// A single-sequence cache holding `conv` (and `recurrent`, for a
    /// layer that keeps one) after `length` positions (a prompt-cache
    /// file's layer).
    pub(crate) fn from_arrays(conv: Array, recurrent: Option<Array>, length: usize) -> Self {
        Self {
            conv: Some(conv),
            recurrent,
            lengths: vec![length],
            batch: false,
        }
    }

    /// Sets the positions seen by a single sequence (a file stores no
    /// length for a state layer: its attention layers say it).
    pub(crate) fn set_length(&mut self, length: usize) {
        self.lengths = vec![length];
    }

    /// Casts the kept convolution inputs to the model's compute dtype (the
    /// recurrent state stays float32, as the layer keeps it).
    pub(crate) fn cast_conv(&mut self, dtype: mlx_rs::Dtype) -> Result<()> {
        if let Some(c) = self.conv.as_mut() {
            if c.dtype() != dtype {
                *c = c.as_dtype(dtype)?;
            }
        }
        Ok(())
    }

    /// The convolution inputs kept from earlier positions, if any.
    pub(crate) fn conv(&self) -> Option<&Array> {
        self.conv.as_ref()
    }

    /// The recurrent state, if any.
    pub(crate) fn recurrent(&self) -> Option<&Array> {
        self.recurrent.as_ref()
    }

    /// Stores the state after `n` more positions of every row.
    pub(crate) fn advance(&mut self, conv: Array, recurrent: Array, n: usize) {
        self.conv = Some(conv);
        self.recurrent = Some(recurrent);
        self.lengths.iter_mut().for_each(|l| *l += n);
    }

    /// Stores the convolution inputs after `n` more positions of every row,
    /// for a layer that keeps no recurrent state (LFM2's short convolution).
    pub(crate) fn advance_conv(&mut self, conv: Array, n: usize) {
        self.conv = Some(conv);
        self.lengths.iter_mut().for_each(|l| *l += n);
    }

    fn slots(&self) -> [&Option<Array>; 2] {
        [&self.conv, &self.recurrent]
    }
}

/// `a` `[rows_a, ...]` followed by `b` `[rows_b, ...]`, an absent side
/// standing for zeros (a row that has seen nothing).
fn stack_rows(
    a: Option<&Array>,
    rows_a: usize,
    b: Option<&Array>,
    rows_b: usize,
) -> Result<Option<Array>> {
    let like = match (a, b) {
        (None, None) => return Ok(None),
        (Some(x), _) | (None, Some(x)) => x,
    };
    let zeros = |rows: usize| {
        let mut shape = like.shape().to_vec();
        shape[0] = rows as i32;
        zeros_dtype(&shape, like.dtype())
    };
    let a = match a {
        Some(a) => a.clone(),
        None => zeros(rows_a)?,
    };
    let b = match b {
        Some(b) => b.clone(),
        None => zeros(rows_b)?,
    };
    if rows_a == 0 {
        return Ok(Some(b));
    }
    Ok(Some(concatenate(&[a, b], 0)?))
}

impl KvCache for StateCache {
    fn offset(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0)
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        bail!("a recurrent-state layer (ArraysCache) holds no keys and values")
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: usize) -> usize {
        0
    }

    /// `None`: the state is not keys and values (see [`KvCache::arrays`]).
    fn state(&self) -> Option<(Array, Array)> {
        None
    }

    fn set_state(&mut self, _keys: Array, _values: Array, _offset: usize) -> Result<()> {
        bail!("a recurrent-state layer (ArraysCache) cannot take keys and values")
    }

    fn nbytes(&self) -> usize {
        self.slots()
            .iter()
            .map(|a| a.as_ref().map_or(0, |a| a.nbytes()))
            .sum()
    }

    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn kind(&self) -> &'static str {
        "ArraysCache"
    }

    fn as_batch_mut(&mut self) -> Option<&mut dyn BatchCache> {
        if self.batch {
            Some(self)
        } else {
            None
        }
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(Self::empty_batch_cache()))
    }

    fn as_state_mut(&mut self) -> Option<&mut StateCache> {
        Some(self)
    }

    fn arrays(&self) -> Vec<Array> {
        self.slots().iter().filter_map(|a| (*a).clone()).collect()
    }
}

impl BatchCache for StateCache {
    fn rows(&self) -> usize {
        self.lengths.len()
    }

    fn push_row(&mut self, single: &dyn KvCache) -> Result<()> {
        let Some(other) = single.boxed_clone().as_state_mut().map(|s| s.clone()) else {
            bail!(
                "a {} cannot join a recurrent-state batch cache",
                single.kind()
            );
        };
        ensure!(
            other.rows() == 1,
            "a row joining a batch must hold one sequence"
        );
        let rows = self.rows();
        self.conv = stack_rows(self.conv.as_ref(), rows, other.conv.as_ref(), 1)?;
        self.recurrent = stack_rows(self.recurrent.as_ref(), rows, other.recurrent.as_ref(), 1)?;
        self.lengths.push(other.lengths[0]);
        Ok(())
    }

    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let rows = self.rows();
        if let Some(&bad) = keep.iter().find(|&&r| r >= rows) {
            bail!("row {bad} is not in a batch of {rows}");
        }
        let ids: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let ids = Array::from_slice(&ids, &[ids.len() as i32]);
        for slot in [&mut self.conv, &mut self.recurrent] {
            if let Some(a) = slot.as_ref() {
                *slot = (!keep.is_empty())
                    .then(|| a.take_axis(&ids, 0))
                    .transpose()?;
            }
        }
        self.lengths = keep.iter().map(|&r| self.lengths[r]).collect();
        Ok(())
    }

    fn extract(&self, row: usize) -> Result<Box<dyn KvCache>> {
        ensure!(
            row < self.rows(),
            "row {row} is not in a batch of {}",
            self.rows()
        );
        let r = row as i32;
        let one = |a: &Option<Array>| a.as_ref().map(|a| a.index(r..r + 1));
        Ok(Box::new(StateCache {
            conv: one(&self.conv),
            recurrent: one(&self.recurrent),
            lengths: vec![self.lengths[row]],
            batch: false,
        }))
    }

    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        if n.iter().all(|&d| d == 0) {
            return Ok(());
        }
        bail!("a recurrent state cannot drop positions")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::full;

    fn row(value: f32, len: usize) -> StateCache {
        let mut c = StateCache::new();
        c.advance(
            full::<f32>(&[1, 3, 2], Array::from_f32(value)).unwrap(),
            full::<f32>(&[1, 2, 2, 2], Array::from_f32(value)).unwrap(),
            len,
        );
        c
    }

    fn firsts(a: &Array) -> Vec<f32> {
        let n = a.shape()[0];
        (0..n)
            .map(|r| a.index((r, 0, 0)).item_cast::<f32>())
            .collect()
    }

    #[test]
    fn rows_join_leave_and_refuse_trimming() {
        let single = StateCache::new();
        assert!(!single.is_trimmable());
        assert_eq!(single.kind(), "ArraysCache");
        let mut batch = single.empty_batch().unwrap();
        batch.push_row(&row(1.0, 5)).unwrap();
        batch.push_row(&StateCache::new()).unwrap();
        batch.push_row(&row(3.0, 9)).unwrap();
        assert_eq!(batch.rows(), 3);
        assert_eq!(batch.offset(), 9);
        let conv = batch.as_state_mut().unwrap().conv().unwrap().clone();
        assert_eq!(firsts(&conv), [1.0, 0.0, 3.0]);

        let third = batch.extract(2).unwrap();
        assert_eq!(third.offset(), 9);
        assert_eq!(third.arrays()[1].shape(), &[1, 2, 2, 2]);

        batch.filter(&[2, 0]).unwrap();
        assert_eq!(batch.rows(), 2);
        let conv = batch.as_state_mut().unwrap().conv().unwrap().clone();
        assert_eq!(firsts(&conv), [3.0, 1.0]);
        batch.trim_rows(&[0, 0]).unwrap();
        let err = batch.trim_rows(&[1, 0]).unwrap_err();
        assert!(err.to_string().contains("cannot drop positions"), "{err}");
        assert!(!batch.can_trim_rows());
    }
}
