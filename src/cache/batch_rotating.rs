//! The sliding-window batch cache: one windowed layer's keys and values for
//! several rows, each holding what its own [`RotatingCache`] would hold.
//!
//! Like the dense [`super::BatchKvCache`], rows are right-aligned: row `r`
//! holds its `held[r]` live keys in the last columns, in temporal order, and
//! the columns before them are padding that its mask hides. Each row keeps
//! its own RoPE offset (its token count). An update first evicts every row
//! down to `max_size - 1` keys (the first `keep` always stay), then appends
//! the new keys to all rows, and keeps `max_size` of them; eviction happens
//! per row, so a long row and a short one share one array. The mask is the
//! single cache's: the new queries see their causal window over the columns
//! their row holds. A row leaves as a `RotatingCache` whose later decoding
//! continues exactly as if it had never been batched.
//!
//! mlx-lm's `BatchRotatingKVCache` keeps a ring buffer and no `keep` head;
//! this one keeps the window in temporal order, as our `RotatingCache` does,
//! so `--max-kv-size` rows (which keep their first 4 positions) batch too.

use anyhow::{bail, ensure, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{
    arange, broadcast_to, concatenate, expand_dims, ge, gt, logical_and, subtract, zeros_dtype,
};
use mlx_rs::Array;

use super::{BatchCache, KvCache, Mask, Positions, RotatingCache};

#[derive(Clone)]
pub(crate) struct BatchRotatingCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Per row: live keys it holds, the last columns of the arrays.
    held: Vec<i32>,
    /// Per row: tokens it has seen, the RoPE offset of its next token.
    lengths: Vec<i32>,
    /// Per row: live keys the last `update_and_fetch` returned (for `mask`).
    fetched: Vec<i32>,
    max_size: usize,
    keep: usize,
}

impl BatchRotatingCache {
    /// A cache with no rows for windows of `max_size` keeping `keep` leading positions.
    pub(crate) fn new(max_size: usize, keep: usize) -> Self {
        Self {
            keys: None,
            values: None,
            held: Vec::new(),
            lengths: Vec::new(),
            fetched: Vec::new(),
            max_size,
            keep,
        }
    }

    fn width(&self) -> i32 {
        self.keys.as_ref().map_or(0, |k| k.shape()[2])
    }

    /// Evicts every row holding more than `limit` keys down to `limit`: the
    /// first `keep` stay, the oldest after them go, as `RotatingCache` does.
    fn evict(&mut self, limit: i32) -> Result<()> {
        let drops: Vec<i32> = self.held.iter().map(|&h| (h - limit).max(0)).collect();
        if drops.iter().all(|&d| d == 0) {
            return Ok(());
        }
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            bail!("a sliding-window batch cache holds keys it has no arrays for");
        };
        let width = self.width();
        let before = self.held.clone();
        for (h, d) in self.held.iter_mut().zip(&drops) {
            *h -= d;
        }
        let new_width = self.held.iter().copied().max().unwrap_or(0);
        let keep = self.keep as i32;
        let (k, v) = if keep == 0 {
            // Dropping each row's oldest keys only widens its padding.
            let cut = width - new_width;
            (k.index((.., .., cut.., ..)), v.index((.., .., cut.., ..)))
        } else {
            let columns: Vec<Vec<i32>> = before
                .iter()
                .zip(&drops)
                .map(|(&h, &d)| {
                    let start = width - h;
                    let head = keep.min(h);
                    if d == 0 {
                        (start..width).collect()
                    } else {
                        (start..start + head)
                            .chain(start + head + d..width)
                            .collect()
                    }
                })
                .collect();
            (
                right_aligned(k, &columns, new_width)?,
                right_aligned(v, &columns, new_width)?,
            )
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(())
    }

    /// Drops the leading columns that are padding for every row.
    fn drop_shared_padding(&mut self) {
        let width = self.width();
        let needed = self.held.iter().copied().max().unwrap_or(0);
        if needed == 0 {
            self.keys = None;
            self.values = None;
        } else if needed < width {
            let cut = width - needed;
            self.keys = self.keys.as_ref().map(|k| k.index((.., .., cut.., ..)));
            self.values = self.values.as_ref().map(|v| v.index((.., .., cut.., ..)));
        }
    }
}

/// `a` `[B, H, S, D]` with row `r` holding the columns `columns[r]`,
/// right-aligned in `width` columns (the columns before them are filler that
/// the mask hides).
fn right_aligned(a: &Array, columns: &[Vec<i32>], width: i32) -> Result<Array> {
    let b = columns.len() as i32;
    let mut ids = Vec::with_capacity(columns.len() * width as usize);
    for row in columns {
        ids.extend(std::iter::repeat_n(0, width as usize - row.len()));
        ids.extend_from_slice(row);
    }
    let s = a.shape();
    let ids = Array::from_slice(&ids, &[b, 1, width, 1]);
    let ids = broadcast_to(&ids, &[b, s[1], width, s[3]])?;
    Ok(a.take_along_axis(&ids, 2)?)
}

/// `a` `[B, H, S, D]` with `n` zero columns in front.
fn pad_left(a: &Array, n: i32) -> Result<Array> {
    if n == 0 {
        return Ok(a.clone());
    }
    let s = a.shape();
    let zeros = zeros_dtype(&[s[0], s[1], n, s[3]], a.dtype())?;
    Ok(concatenate(&[zeros, a.clone()], 2)?)
}

/// `rows` rows of `width` zero columns shaped like `like`.
fn zero_rows(like: &Array, rows: i32, width: i32) -> Result<Array> {
    let s = like.shape();
    Ok(zeros_dtype(&[rows, s[1], width, s[3]], like.dtype())?)
}

impl BatchCache for BatchRotatingCache {
    fn rows(&self) -> usize {
        self.lengths.len()
    }

    fn push_row(&mut self, single: &dyn KvCache) -> Result<()> {
        ensure!(
            single.kind() == "RotatingKVCache",
            "a {} cannot join a sliding-window batch cache",
            single.kind()
        );
        ensure!(
            single.max_size() == Some(self.max_size) && single.keep() == self.keep,
            "a window of {:?} keeping {} cannot join a batch of windows of {} keeping {}",
            single.max_size(),
            single.keep(),
            self.max_size,
            self.keep
        );
        let state = single.state();
        let held = state.as_ref().map_or(0, |(k, _)| k.shape()[2]);
        let rows = self.rows() as i32;
        let width = self.width();
        let joined = match (self.keys.take(), self.values.take(), state) {
            (None, None, None) => None,
            (Some(k), Some(v), None) => Some((
                concatenate(&[k.clone(), zero_rows(&k, 1, width)?], 0)?,
                concatenate(&[v.clone(), zero_rows(&v, 1, width)?], 0)?,
            )),
            (None, None, Some((k1, v1))) if rows == 0 => Some((k1, v1)),
            (None, None, Some((k1, v1))) => Some((
                concatenate(&[zero_rows(&k1, rows, held)?, k1.clone()], 0)?,
                concatenate(&[zero_rows(&v1, rows, held)?, v1.clone()], 0)?,
            )),
            (Some(k), Some(v), Some((k1, v1))) => {
                let w = width.max(held);
                Some((
                    concatenate(&[pad_left(&k, w - width)?, pad_left(&k1, w - held)?], 0)?,
                    concatenate(&[pad_left(&v, w - width)?, pad_left(&v1, w - held)?], 0)?,
                ))
            }
            _ => bail!("a sliding-window batch cache has keys without values"),
        };
        if let Some((k, v)) = joined {
            self.keys = Some(k);
            self.values = Some(v);
        }
        self.held.push(held);
        self.fetched.push(held);
        self.lengths.push(single.offset() as i32);
        Ok(())
    }

    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let pick = |v: &[i32]| keep.iter().map(|&i| v[i]).collect::<Vec<_>>();
        self.held = pick(&self.held);
        self.fetched = pick(&self.fetched);
        self.lengths = pick(&self.lengths);
        let identity = keep.len() == self.keys.as_ref().map_or(0, |k| k.shape()[0] as usize)
            && keep.iter().enumerate().all(|(a, &b)| a == b);
        if !identity && !keep.is_empty() {
            let ids: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
            let ids = Array::from_slice(&ids, &[ids.len() as i32]);
            self.keys = self
                .keys
                .as_ref()
                .map(|k| k.take_axis(&ids, 0))
                .transpose()?;
            self.values = self
                .values
                .as_ref()
                .map(|v| v.take_axis(&ids, 0))
                .transpose()?;
        }
        self.drop_shared_padding();
        Ok(())
    }

    fn extract(&self, row: usize) -> Result<Box<dyn KvCache>> {
        let mut cache = RotatingCache::new(self.max_size, self.keep);
        let held = self.held[row];
        cache.offset = self.lengths[row] as usize;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            if held > 0 {
                let (r, start) = (row as i32, self.width() - held);
                let k = k.index((r..r + 1, .., start.., ..)).contiguous()?;
                let v = v.index((r..r + 1, .., start.., ..)).contiguous()?;
                cache.set_state(k, v, self.lengths[row] as usize)?;
            }
        }
        Ok(Box::new(cache))
    }

    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        ensure!(
            n.len() == self.rows(),
            "{} trims for {} rows",
            n.len(),
            self.rows()
        );
        if n.iter().any(|&d| d > 0) {
            bail!("a sliding-window batch cache cannot drop positions");
        }
        Ok(())
    }
}

impl KvCache for BatchRotatingCache {
    fn offset(&self) -> usize {
        self.width() as usize
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        ensure!(
            keys.shape()[0] as usize == self.rows(),
            "{} rows of keys for a batch of {}",
            keys.shape()[0],
            self.rows()
        );
        let n = keys.shape()[2];
        // As the single cache: keep `max_size - 1` old keys so that every
        // new query still sees a full window, then store the last `max_size`.
        self.evict((self.max_size as i32 - 1).max(0))?;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (
                concatenate(&[k.clone(), keys.clone()], 2)?,
                concatenate(&[v.clone(), values.clone()], 2)?,
            ),
            _ => (keys.clone(), values.clone()),
        };
        self.held.iter_mut().for_each(|h| *h += n);
        self.lengths.iter_mut().for_each(|l| *l += n);
        self.fetched.clone_from(&self.held);
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        self.evict(self.max_size as i32)?;
        Ok((k, v))
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: usize) -> usize {
        0
    }

    fn state(&self) -> Option<(Array, Array)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Some((k.clone(), v.clone())),
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
        "BatchRotatingKVCache"
    }

    fn max_size(&self) -> Option<usize> {
        Some(self.max_size)
    }

    fn keep(&self) -> usize {
        self.keep
    }

    fn positions(&self) -> Positions {
        Positions::of_rows(&self.lengths)
    }

    fn mask(&self, l: i32, kv_len: i32) -> Result<Mask> {
        let b = self.rows() as i32;
        let pad: Vec<i32> = self.fetched.iter().map(|h| kv_len - h).collect();
        let columns = expand_dims(&arange::<_, i32>(0, kv_len, None)?, 0)?; // [1, K]
        let live = ge(&columns, Array::from_slice(&pad, &[b, 1, 1, 1]))?; // [B, 1, 1, K]
        if l == 1 {
            return Ok(Mask::Array(live));
        }
        // The single cache's window over its columns: query i (column
        // kv_len - l + i) sees the `max_size` columns ending at its own.
        let queries = expand_dims(&arange::<_, i32>(kv_len - l, kv_len, None)?, 1)?; // [L, 1]
        let causal = ge(&queries, &columns)?;
        let window = Array::from_int(self.max_size as i32);
        let in_window = gt(&columns, &subtract(&queries, &window)?)?;
        let visible = logical_and(&causal, &in_window)?; // [L, K]
        Ok(Mask::Array(logical_and(&live, &visible)?))
    }

    fn as_batch_mut(&mut self) -> Option<&mut dyn BatchCache> {
        Some(self)
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(BatchRotatingCache::new(self.max_size, self.keep)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` new positions for `rows` rows: row r's position p holds the value
    /// `100 * r + p + 1` in both of its two dimensions.
    fn positions(rows: &[(i32, i32)], n: i32) -> Array {
        let flat: Vec<f32> = rows
            .iter()
            .flat_map(|&(r, from)| {
                (from..from + n).flat_map(move |p| {
                    let x = (100 * r + p + 1) as f32;
                    [x, x]
                })
            })
            .collect();
        Array::from_slice(&flat, &[rows.len() as i32, 1, n, 2])
    }

    fn single(r: i32, len: i32, max_size: usize, keep: usize) -> RotatingCache {
        let mut c = RotatingCache::new(max_size, keep);
        if len > 0 {
            let kv = positions(&[(r, 0)], len);
            c.update_and_fetch(&kv, &kv).unwrap();
        }
        c
    }

    fn keys(c: &dyn KvCache) -> Vec<f32> {
        c.state()
            .map(|(k, _)| k.as_slice::<f32>().iter().step_by(2).copied().collect())
            .unwrap_or_default()
    }

    fn mask_bits(m: Mask) -> Vec<i32> {
        match m {
            Mask::Array(m) => m
                .as_dtype(mlx_rs::Dtype::Int32)
                .unwrap()
                .as_slice()
                .to_vec(),
            _ => panic!("expected an array mask"),
        }
    }

    /// Rows of prompt lengths `lens` join one by one, decode `steps` single
    /// tokens and `chunk`-token updates; every row's fetched keys, mask and
    /// extracted cache equal its own `RotatingCache`'s.
    fn check_against_serial(lens: &[i32], max_size: usize, keep: usize, steps: i32) {
        let mut serial: Vec<RotatingCache> = lens
            .iter()
            .enumerate()
            .map(|(r, &l)| single(r as i32, l, max_size, keep))
            .collect();
        let mut batch = BatchRotatingCache::new(max_size, keep);
        for s in &serial {
            batch.push_row(s).unwrap();
        }
        for step in 0..steps {
            let n = if step % 4 == 3 { 3 } else { 1 };
            let rows: Vec<(i32, i32)> = serial
                .iter()
                .enumerate()
                .map(|(r, s)| (r as i32, s.offset() as i32))
                .collect();
            let kv = positions(&rows, n);
            let (k, _) = batch.update_and_fetch(&kv, &kv).unwrap();
            let kv_len = k.shape()[2];
            let batch_mask = mask_bits(batch.mask(n, kv_len).unwrap());
            let per_row = batch_mask.len() / rows.len();
            for (r, s) in serial.iter_mut().enumerate() {
                let one = positions(&rows[r..r + 1], n);
                let (sk, _) = s.update_and_fetch(&one, &one).unwrap();
                let held = sk.shape()[2];
                let row_keys: Vec<f32> = k
                    .index((r as i32..r as i32 + 1, .., kv_len - held.., ..))
                    .as_slice::<f32>()
                    .iter()
                    .step_by(2)
                    .copied()
                    .collect();
                let want: Vec<f32> = sk.as_slice::<f32>().iter().step_by(2).copied().collect();
                assert_eq!(row_keys, want, "step {step} row {r}: fetched keys");
                let row_mask = &batch_mask[r * per_row..(r + 1) * per_row];
                let want_mask = match s.mask(n, held).unwrap() {
                    Mask::None => vec![1; held as usize],
                    m => mask_bits(m),
                };
                let got: Vec<i32> = row_mask
                    .chunks(kv_len as usize)
                    .flat_map(|q| {
                        assert!(q[..(kv_len - held) as usize].iter().all(|&b| b == 0));
                        q[(kv_len - held) as usize..].to_vec()
                    })
                    .collect();
                assert_eq!(got, want_mask, "step {step} row {r}: mask");
                let out = batch.extract(r).unwrap();
                assert_eq!(out.offset(), s.offset(), "step {step} row {r}: offset");
                assert_eq!(keys(out.as_ref()), keys(s), "step {step} row {r}: extract");
            }
        }
    }

    #[test]
    fn rows_of_uneven_lengths_match_their_single_caches() {
        check_against_serial(&[9, 2, 5, 14], 5, 0, 12);
    }

    #[test]
    fn rows_keeping_a_head_match_their_single_caches() {
        check_against_serial(&[12, 3, 6], 7, 4, 12);
    }

    #[test]
    fn an_empty_row_joins_and_filter_drops_shared_padding() {
        let mut batch = BatchRotatingCache::new(4, 0);
        batch.push_row(&single(0, 0, 4, 0)).unwrap();
        batch.push_row(&single(1, 2, 4, 0)).unwrap();
        assert_eq!((batch.width(), batch.held.clone()), (2, vec![0, 2]));
        let kv = positions(&[(0, 0), (1, 2)], 1);
        batch.update_and_fetch(&kv, &kv).unwrap();
        batch.filter(&[0]).unwrap();
        assert_eq!(batch.width(), 1);
        assert_eq!(keys(batch.extract(0).unwrap().as_ref()), vec![1.0]);
        assert!(batch.trim_rows(&[0]).is_ok());
        assert!(batch.trim_rows(&[1]).is_err());
    }
}
