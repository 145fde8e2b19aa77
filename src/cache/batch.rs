//! The batch cache: one layer's keys and values for several rows of
//! different lengths, as mlx-lm's `BatchKVCache` lays them out.
//!
//! Rows are right-aligned: every row's last key sits at `idx - 1`, and row `r`
//! holds its keys in `left_padding[r]..idx`. The padding is masked out of
//! attention, and each row keeps its own RoPE offset (its token count), so a
//! row's attention is the same computation it would be alone. Rows join by
//! [`BatchKvCache::extend`] (already running rows are never re-merged or
//! re-prefilled) and leave by [`BatchKvCache::filter`], which also drops
//! padding no remaining row needs.
//!
//! Speculative rows drop different numbers of rejected drafts in the same
//! step. The positions every row drops are cut from the end; a row dropping
//! more leaves holes, masked like padding, until the holes are worth a
//! repack (one gather that right-aligns every row's live keys again).

use anyhow::{bail, ensure, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{arange, broadcast_to, concatenate, expand_dims, ge, logical_and, zeros_dtype};
use mlx_rs::Array;

use super::{BatchCache, KvCache, Mask, Positions};

/// Repack once the holes reach this many positions in some row.
const REPACK_HOLES: usize = 64;

/// The live positions of a row whose keys sit in `left_padding..idx`,
/// ascending, without its `holes`.
pub(super) fn live_positions(left_padding: i32, idx: i32, holes: &[i32]) -> Vec<i32> {
    (left_padding..idx)
        .filter(|p| holes.binary_search(p).is_err())
        .collect()
}

/// Drops the last `n[r]` positions of each row `r`: the positions every row
/// drops are cut from the end (`idx` moves back), the rest become holes.
/// Returns whether the holes are worth a repack.
pub(super) fn drop_row_tails(
    idx: &mut i32,
    lengths: &mut [i32],
    holes: &mut [Vec<i32>],
    n: &[usize],
) -> Result<bool> {
    ensure!(
        n.len() == lengths.len(),
        "{} trims for {} rows",
        n.len(),
        lengths.len()
    );
    let common = *n.iter().min().unwrap_or(&0) as i32;
    ensure!(common <= *idx, "cannot drop {common} of {idx} positions");
    *idx -= common;
    for (r, &drop) in n.iter().enumerate() {
        let extra = drop as i32 - common;
        lengths[r] -= drop as i32;
        holes[r].retain(|&p| p < *idx);
        holes[r].extend(*idx - extra..*idx);
    }
    Ok(holes.iter().any(|h| h.len() >= REPACK_HOLES))
}

/// For rows with `live` positions, the gather indices `[rows * idx]` that
/// right-align them into `idx` positions (padding gathers position 0), and
/// `idx`.
pub(super) fn repack_gather(live: &[Vec<i32>]) -> (Vec<i32>, i32) {
    let idx = live.iter().map(Vec::len).max().unwrap_or(0);
    let mut gather = Vec::with_capacity(live.len() * idx);
    for row in live {
        gather.extend(std::iter::repeat_n(0, idx - row.len()));
        gather.extend_from_slice(row);
    }
    (gather, idx as i32)
}

/// The mask of right-aligned rows: each row's padding and holes hidden,
/// causal over the `l` newest of `kv_len` keys. Rows without padding or
/// holes need none (one query each) or the plain causal one.
pub(super) fn rows_mask(
    left_padding: &[i32],
    holes: &[Vec<i32>],
    l: i32,
    kv_len: i32,
) -> Result<Mask> {
    let aligned = left_padding.iter().all(|&p| p <= 0) && holes.iter().all(Vec::is_empty);
    if aligned {
        return Ok(if l == 1 { Mask::None } else { Mask::Causal });
    }
    let b = left_padding.len() as i32;
    let mut bits = Vec::with_capacity((b * kv_len) as usize);
    for (pad, holes) in left_padding.iter().zip(holes) {
        bits.extend((0..kv_len).map(|p| p >= *pad && holes.binary_search(&p).is_err()));
    }
    let live = Array::from_slice(&bits, &[b, 1, 1, kv_len]);
    if l == 1 {
        return Ok(Mask::Array(live));
    }
    let keys = expand_dims(&arange::<_, i32>(0, kv_len, None)?, 0)?; // [1, K]
    let queries = expand_dims(&arange::<_, i32>(kv_len - l, kv_len, None)?, 1)?; // [L, 1]
    let causal = ge(&queries, &keys)?; // [L, K]
    Ok(Mask::Array(logical_and(&live, &causal)?))
}

/// One attention layer's keys and values for several rows of different
/// lengths, right-aligned with left padding (mlx-lm's `BatchKVCache`).
#[derive(Clone, Default)]
pub struct BatchKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Per row: index of its first live key.
    left_padding: Vec<i32>,
    /// Per row: tokens it holds, which is also the RoPE offset of its next token.
    lengths: Vec<i32>,
    /// Per row: positions after its padding that hold dropped drafts, ascending.
    holes: Vec<Vec<i32>>,
    /// Keys in use: every row ends here.
    idx: i32,
}

impl BatchKvCache {
    /// A cache with no rows.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes every row's `keys`/`values` after position `idx`, growing the
    /// buffers as needed: the buffers and the new `idx`.
    fn append(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array, i32)> {
        let prev = self.idx;
        let n = keys.shape()[2];
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if self.keys.is_none() || prev + n > capacity {
            self.keys = Some(super::grow(self.keys.take(), keys, prev, n)?);
            self.values = Some(super::grow(self.values.take(), values, prev, n)?);
        }
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        super::write_at(vec![&mut *k, &mut *v], vec![keys, values], prev)?;
        self.idx += n;
        self.lengths.iter_mut().for_each(|l| *l += n);
        Ok((k.clone(), v.clone(), self.idx))
    }

    /// A one-row batch from a single sequence's keys and values `[1, H, len, D]`.
    pub(crate) fn from_single(state: Option<(Array, Array)>) -> Self {
        match state {
            Some((k, v)) => {
                let len = k.shape()[2];
                Self {
                    keys: Some(k),
                    values: Some(v),
                    left_padding: vec![0],
                    lengths: vec![len],
                    holes: vec![Vec::new()],
                    idx: len,
                }
            }
            None => Self {
                left_padding: vec![0],
                lengths: vec![0],
                holes: vec![Vec::new()],
                ..Self::default()
            },
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.lengths.len()
    }

    /// Tokens held by each row.
    pub fn lengths(&self) -> &[i32] {
        &self.lengths
    }

    /// Keeps only the rows at `keep` (in that order), then drops the leading
    /// positions that are padding for every remaining row.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = Self::default();
            return Ok(());
        }
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        self.lengths = keep.iter().map(|&i| self.lengths[i]).collect();
        self.holes = keep.iter().map(|&i| self.holes[i].clone()).collect();
        let identity = keep.len() == self.rows_before_filter()
            && keep.iter().enumerate().all(|(a, &b)| a == b);
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (mut k, mut v) = (k.clone(), v.clone());
            if !identity {
                let ids: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
                let ids = Array::from_slice(&ids, &[ids.len() as i32]);
                k = k.take_axis(&ids, 0)?;
                v = v.take_axis(&ids, 0)?;
            }
            let shift = *self.left_padding.iter().min().unwrap_or(&0);
            if shift > 0 {
                k = k.index((.., .., shift.., ..));
                v = v.index((.., .., shift.., ..));
                self.idx -= shift;
                self.left_padding.iter_mut().for_each(|p| *p -= shift);
                for h in self.holes.iter_mut().flatten() {
                    *h -= shift;
                }
            }
            self.keys = Some(k);
            self.values = Some(v);
        }
        Ok(())
    }

    fn rows_before_filter(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.shape()[0] as usize)
    }

    /// Appends the rows of `other` after this cache's rows.
    pub fn extend(&mut self, other: BatchKvCache) -> Result<()> {
        if other.rows() == 0 {
            return Ok(());
        }
        if self.rows() == 0 {
            *self = other;
            return Ok(());
        }
        let like = match (&self.keys, &other.keys) {
            (Some(k), _) | (None, Some(k)) => k.clone(),
            (None, None) => {
                self.left_padding.extend(other.left_padding);
                self.lengths.extend(other.lengths);
                self.holes.extend(other.holes);
                return Ok(());
            }
        };
        let like_v = self
            .values
            .as_ref()
            .or(other.values.as_ref())
            .unwrap()
            .clone();
        let idx = self.idx.max(other.idx);
        let (k_a, v_a, pad_a, holes_a) = self.right_aligned(idx, &like, &like_v)?;
        let (k_b, v_b, pad_b, holes_b) = other.right_aligned(idx, &like, &like_v)?;
        self.keys = Some(concatenate(&[k_a, k_b], 0)?);
        self.values = Some(concatenate(&[v_a, v_b], 0)?);
        self.left_padding = pad_a.into_iter().chain(pad_b).collect();
        self.holes = holes_a.into_iter().chain(holes_b).collect();
        self.lengths.extend(other.lengths);
        self.idx = idx;
        Ok(())
    }

    /// This cache's live keys and values padded on the left to `idx` positions.
    #[allow(clippy::type_complexity)]
    fn right_aligned(
        &self,
        idx: i32,
        like_k: &Array,
        like_v: &Array,
    ) -> Result<(Array, Array, Vec<i32>, Vec<Vec<i32>>)> {
        let b = self.rows() as i32;
        let extra = idx - self.idx;
        let pad = |live: Option<&Array>, like: &Array| -> Result<Array> {
            let s = like.shape();
            let (h, d) = (s[1], s[3]);
            let zeros = |n: i32| zeros_dtype(&[b, h, n, d], like.dtype());
            Ok(match live {
                Some(a) => {
                    let a = a.index((.., .., ..self.idx, ..));
                    if extra > 0 {
                        concatenate(&[zeros(extra)?, a], 2)?
                    } else {
                        a
                    }
                }
                None => zeros(idx)?,
            })
        };
        let k = pad(self.keys.as_ref(), like_k)?;
        let v = pad(self.values.as_ref(), like_v)?;
        let padding = self.left_padding.iter().map(|p| p + extra).collect();
        let holes = self
            .holes
            .iter()
            .map(|h| h.iter().map(|p| p + extra).collect())
            .collect();
        Ok((k, v, padding, holes))
    }

    /// Row `row`'s live positions, ascending.
    fn live_positions(&self, row: usize) -> Vec<i32> {
        live_positions(self.left_padding[row], self.idx, &self.holes[row])
    }

    /// Row `row`'s keys and values as a single-sequence cache.
    pub fn extract_standard(&self, row: usize) -> Result<super::StandardCache> {
        let mut cache = super::StandardCache::new();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let r = row as i32;
            let start = self.left_padding[row];
            let (k, v) = (
                k.index((r..r + 1, .., .., ..)),
                v.index((r..r + 1, .., .., ..)),
            );
            let (k, v) = if self.holes[row].is_empty() {
                (
                    k.index((.., .., start..self.idx, ..)),
                    v.index((.., .., start..self.idx, ..)),
                )
            } else {
                let live = self.live_positions(row);
                let ids = Array::from_slice(&live, &[live.len() as i32]);
                (k.take_axis(&ids, 2)?, v.take_axis(&ids, 2)?)
            };
            let n = k.shape()[2] as usize;
            if n > 0 {
                cache.set_state(k.contiguous()?, v.contiguous()?, n)?;
            }
        }
        Ok(cache)
    }

    /// Right-aligns every row's live keys again, without holes.
    fn repack(&mut self) -> Result<()> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            self.holes.iter_mut().for_each(Vec::clear);
            return Ok(());
        };
        let live: Vec<Vec<i32>> = (0..self.rows()).map(|r| self.live_positions(r)).collect();
        let (gather, idx) = repack_gather(&live);
        let b = self.rows() as i32;
        let ids = Array::from_slice(&gather, &[b, 1, idx, 1]);
        let take = |a: &Array| -> Result<Array> {
            let s = a.shape();
            let ids = broadcast_to(&ids, &[b, s[1], idx, s[3]])?;
            Ok(a.index((.., .., ..self.idx, ..)).take_along_axis(&ids, 2)?)
        };
        let (k, v) = (take(k)?, take(v)?);
        self.keys = Some(k);
        self.values = Some(v);
        self.left_padding = live.iter().map(|r| idx - r.len() as i32).collect();
        self.holes.iter_mut().for_each(Vec::clear);
        self.idx = idx;
        Ok(())
    }
}

impl BatchCache for BatchKvCache {
    fn rows(&self) -> usize {
        self.lengths.len()
    }

    fn push_row(&mut self, single: &dyn KvCache) -> Result<()> {
        if single.kind() != "KVCache" {
            bail!("a {} cannot join a dense batch cache", single.kind());
        }
        self.extend(BatchKvCache::from_single(single.state()))
    }

    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        BatchKvCache::filter(self, keep)
    }

    fn extract(&self, row: usize) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(self.extract_standard(row)?))
    }

    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        if drop_row_tails(&mut self.idx, &mut self.lengths, &mut self.holes, n)? {
            self.repack()?;
        }
        Ok(())
    }
    fn can_trim_rows(&self) -> bool {
        true
    }
}

impl KvCache for BatchKvCache {
    fn offset(&self) -> usize {
        self.idx as usize
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v, end) = self.append(keys, values)?;
        Ok((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
    }

    fn update_in_buffers(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<Option<(Array, Array, i32)>> {
        self.append(keys, values).map(Some)
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: usize) -> usize {
        0
    }

    fn state(&self) -> Option<(Array, Array)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.idx > 0 => Some((
                k.index((.., .., ..self.idx, ..)),
                v.index((.., .., ..self.idx, ..)),
            )),
            _ => None,
        }
    }

    fn set_state(&mut self, _keys: Array, _values: Array, _offset: usize) -> Result<()> {
        bail!("a batch cache is built from rows, not restored from a state")
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes())
            + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn kind(&self) -> &'static str {
        "BatchKVCache"
    }

    fn positions(&self) -> Positions {
        Positions::of_rows(&self.lengths)
    }

    fn mask(&self, l: i32, kv_len: i32) -> Result<Mask> {
        rows_mask(&self.left_padding, &self.holes, l, kv_len)
    }

    fn as_batch_mut(&mut self) -> Option<&mut dyn BatchCache> {
        Some(self)
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(BatchKvCache::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(len: usize, fill: f32) -> BatchKvCache {
        let kv = Array::from_slice(&vec![fill; len * 2], &[1, 1, len as i32, 2]);
        BatchKvCache::from_single(Some((kv.clone(), kv)))
    }

    fn live_keys(c: &BatchKvCache, r: usize) -> Vec<f32> {
        let (k, _) = c.extract_standard(r).unwrap().state().unwrap();
        k.as_slice::<f32>().to_vec()
    }

    #[test]
    fn extend_right_aligns_and_extract_recovers_rows() {
        let mut c = row(3, 1.0);
        c.extend(row(5, 2.0)).unwrap();
        assert_eq!(c.offset(), 5);
        assert_eq!(c.left_padding, vec![2, 0]);
        assert_eq!(c.lengths(), &[3, 5]);
        assert_eq!(live_keys(&c, 0), vec![1.0; 6]);
        assert_eq!(live_keys(&c, 1), vec![2.0; 10]);
    }

    #[test]
    fn update_grows_every_row_and_filter_drops_shared_padding() {
        let mut c = row(2, 1.0);
        c.extend(row(6, 2.0)).unwrap();
        let step = Array::from_slice(&[9f32; 4], &[2, 1, 1, 2]);
        c.update_and_fetch(&step, &step).unwrap();
        assert_eq!(c.lengths(), &[3, 7]);
        c.filter(&[0]).unwrap();
        assert_eq!((c.offset(), c.left_padding.clone()), (3, vec![0]));
        assert_eq!(live_keys(&c, 0), vec![1.0, 1.0, 1.0, 1.0, 9.0, 9.0]);
    }

    #[test]
    fn mask_hides_left_padding() {
        let mut c = row(1, 1.0);
        c.extend(row(3, 2.0)).unwrap();
        let Mask::Array(m) = c.mask(1, 3).unwrap() else {
            panic!("expected an array mask");
        };
        let m = m.as_dtype(mlx_rs::Dtype::Int32).unwrap();
        assert_eq!(m.as_slice::<i32>(), &[0, 0, 1, 1, 1, 1]);
    }

    fn keys_of(c: &BatchKvCache, r: usize) -> Vec<f32> {
        live_keys(c, r).iter().step_by(2).copied().collect()
    }

    fn step(c: &mut BatchKvCache, values: &[&[f32]]) {
        let b = values.len() as i32;
        let n = values[0].len() as i32;
        let flat: Vec<f32> = values
            .iter()
            .flat_map(|row| row.iter().flat_map(|&x| [x, x]))
            .collect();
        let a = Array::from_slice(&flat, &[b, 1, n, 2]);
        c.update_and_fetch(&a, &a).unwrap();
    }

    #[test]
    fn trim_rows_drops_each_rows_rejected_tail() {
        let mut c = row(2, 1.0);
        c.extend(row(3, 2.0)).unwrap();
        step(&mut c, &[&[10.0, 11.0, 12.0], &[20.0, 21.0, 22.0]]);
        c.trim_rows(&[2, 0]).unwrap();
        assert_eq!(c.lengths(), &[3, 6]);
        assert_eq!(keys_of(&c, 0), vec![1.0, 1.0, 10.0]);
        assert_eq!(keys_of(&c, 1), vec![2.0, 2.0, 2.0, 20.0, 21.0, 22.0]);
        let Mask::Array(m) = c.mask(1, c.offset() as i32).unwrap() else {
            panic!("expected an array mask");
        };
        let m = m.as_dtype(mlx_rs::Dtype::Int32).unwrap();
        assert_eq!(m.as_slice::<i32>(), &[0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1]);
        step(&mut c, &[&[13.0], &[23.0]]);
        assert_eq!(keys_of(&c, 0), vec![1.0, 1.0, 10.0, 13.0]);
        assert_eq!(c.lengths(), &[4, 7]);
        c.repack().unwrap();
        assert_eq!(keys_of(&c, 0), vec![1.0, 1.0, 10.0, 13.0]);
        assert_eq!(keys_of(&c, 1), vec![2.0, 2.0, 2.0, 20.0, 21.0, 22.0, 23.0]);
        assert_eq!((c.offset(), c.left_padding.clone()), (7, vec![3, 0]));
    }

    #[test]
    fn holes_move_with_filter_and_extend() {
        let mut c = row(4, 1.0);
        c.extend(row(1, 2.0)).unwrap();
        step(&mut c, &[&[10.0, 11.0], &[20.0, 21.0]]);
        c.trim_rows(&[0, 1]).unwrap();
        c.extend(row(9, 3.0)).unwrap();
        assert_eq!(keys_of(&c, 1), vec![2.0, 20.0]);
        c.filter(&[1]).unwrap();
        assert_eq!(keys_of(&c, 0), vec![2.0, 20.0]);
        assert_eq!(c.lengths(), &[2]);
    }
}
