//! The batch cache for `--kv-bits`: rows of [`QuantizedCache`]s decoded
//! together. mlx-lm has no batched quantized cache, so the rule for when a
//! batch turns quantized is this project's:
//!
//! - While every row is below `--quantized-kv-start`, the batch is dense: it
//!   is a [`BatchKvCache`], so each row runs as its dense single cache would.
//! - The first update at which some row holds `start` positions or more (the
//!   point where that row's single cache would convert) quantizes every row,
//!   and the batch stays quantized until it empties. A row still below the
//!   start is then quantized earlier than it would be alone.
//! - A row that joins already quantized makes the batch quantized at once;
//!   a row that joins a quantized batch is quantized as it joins.
//!
//! So with `--quantized-kv-start 0`, and while every row stays below the
//! start, each row's attention is the computation it would be alone.
//!
//! Quantized rows keep the dense batch's layout: right-aligned, each with its
//! own left padding (masked), its own RoPE offset, and holes where a
//! speculative row dropped rejected drafts (masked until a repack).

use anyhow::{bail, ensure, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{broadcast_to, concatenate, zeros_dtype};
use mlx_rs::Array;

use super::batch::{drop_row_tails, live_positions, repack_gather, rows_mask};
use super::quantized::quantize3;
use super::{
    BatchCache, BatchKvCache, KvCache, KvQuantization, Mask, Positions, QuantizedCache,
    QuantizedState, STEP,
};

/// Keys' then values' `[packed, scales, biases]`, each `[rows, kv_heads, positions, *]`.
type Planes = [Array; 6];

#[derive(Clone)]
pub(crate) struct BatchQuantizedCache {
    q: KvQuantization,
    store: Store,
}

#[derive(Clone)]
enum Store {
    Dense(BatchKvCache),
    Quantized(Rows),
}

/// Quantized rows, right-aligned as in [`BatchKvCache`].
#[derive(Clone, Default)]
struct Rows {
    /// Allocated in steps of [`STEP`] positions; `None` until a row holds keys.
    planes: Option<Planes>,
    /// Per row: index of its first live key.
    left_padding: Vec<i32>,
    /// Per row: tokens it holds, the RoPE offset of its next token.
    lengths: Vec<i32>,
    /// Per row: positions after its padding that hold dropped drafts, ascending.
    holes: Vec<Vec<i32>>,
    /// Keys in use: every row ends here.
    idx: i32,
}

fn map_planes(p: &Planes, mut f: impl FnMut(&Array) -> Result<Array>) -> Result<Planes> {
    let mut out = p.clone();
    for (o, x) in out.iter_mut().zip(p) {
        *o = f(x)?;
    }
    Ok(out)
}

/// `a` `[B, H, S, W]` with `n` zero positions in front.
fn pad_left(a: &Array, n: i32) -> Result<Array> {
    if n == 0 {
        return Ok(a.clone());
    }
    let s = a.shape();
    let zeros = zeros_dtype(&[s[0], s[1], n, s[3]], a.dtype())?;
    Ok(concatenate(&[zeros, a.clone()], 2)?)
}

/// Zero planes shaped like `like` with `rows` rows and `n` positions.
fn zero_planes(like: &Planes, rows: i32, n: i32) -> Result<Planes> {
    map_planes(like, |a| {
        let s = a.shape();
        Ok(zeros_dtype(&[rows, s[1], n, s[3]], a.dtype())?)
    })
}

fn quantize_kv(keys: &Array, values: &Array, q: &KvQuantization) -> Result<Planes> {
    let [k0, k1, k2] = quantize3(keys, q)?;
    let [v0, v1, v2] = quantize3(values, q)?;
    Ok([k0, k1, k2, v0, v1, v2])
}

/// The state of live planes `p`, of the buffers `stored` when given.
fn state_of(p: Planes, stored: Option<&Planes>, q: &KvQuantization) -> QuantizedState {
    let [k0, k1, k2, v0, v1, v2] = p;
    QuantizedState {
        keys: [k0, k1, k2],
        values: [v0, v1, v2],
        group_size: q.group_size,
        bits: q.bits,
        buffers: stored.map(|b| {
            let [k0, k1, k2, v0, v1, v2] = b.clone();
            Box::new([[k0, k1, k2], [v0, v1, v2]])
        }),
    }
}

impl Rows {
    fn rows(&self) -> usize {
        self.lengths.len()
    }

    /// The planes up to `idx`.
    fn live(&self) -> Option<Planes> {
        let idx = self.idx;
        let p = self.planes.as_ref()?;
        map_planes(p, |a| Ok(a.index((.., .., ..idx, ..)))).ok()
    }

    /// Appends a row holding `len` positions (`row`: exactly those, one row).
    fn push(&mut self, row: Option<Planes>, len: i32) -> Result<()> {
        let b = self.rows() as i32;
        let idx = self.idx.max(len);
        let extra = idx - self.idx;
        let like = self.planes.clone().or_else(|| row.clone());
        if let Some(like) = like {
            let old = match self.live() {
                Some(p) => Some(map_planes(&p, |a| pad_left(a, extra))?),
                None if b > 0 => Some(zero_planes(&like, b, idx)?),
                None => None,
            };
            let new = match row {
                Some(r) => map_planes(&r, |a| pad_left(a, idx - len))?,
                None => zero_planes(&like, 1, idx)?,
            };
            self.planes = Some(match old {
                Some(old) => {
                    let mut out = new.clone();
                    for ((o, a), n) in out.iter_mut().zip(&old).zip(&new) {
                        *o = concatenate(&[a, n], 0)?;
                    }
                    out
                }
                None => new,
            });
        }
        self.left_padding.iter_mut().for_each(|p| *p += extra);
        self.holes.iter_mut().flatten().for_each(|h| *h += extra);
        self.left_padding.push(idx - len);
        self.lengths.push(len);
        self.holes.push(Vec::new());
        self.idx = idx;
        Ok(())
    }

    /// Writes `new` (`[rows, H, n, *]`) after every row's last position.
    fn append(&mut self, new: Planes) -> Result<()> {
        let prev = self.idx;
        let n = new[0].shape()[2];
        let capacity = self.planes.as_ref().map_or(0, |p| p[0].shape()[2]);
        if self.planes.is_none() || prev + n > capacity {
            let steps = (n + STEP - 1) / STEP;
            let fresh = zero_planes(&new, new[0].shape()[0], steps * STEP)?;
            self.planes = Some(match &self.planes {
                Some(old) => {
                    let mut out = fresh.clone();
                    for ((o, a), f) in out.iter_mut().zip(old).zip(&fresh) {
                        *o = concatenate(&[a.index((.., .., ..prev, ..)), f.clone()], 2)?;
                    }
                    out
                }
                None => fresh,
            });
        }
        let planes = self.planes.as_mut().unwrap();
        super::write_at(planes.iter_mut().collect(), new.iter().collect(), prev)?;
        self.idx += n;
        self.lengths.iter_mut().for_each(|l| *l += n);
        Ok(())
    }

    /// Keeps the rows at `keep` (in that order), then drops the leading
    /// positions that are padding for every remaining row.
    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = Self::default();
            return Ok(());
        }
        let identity = keep.len() == self.rows() && keep.iter().enumerate().all(|(a, &b)| a == b);
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        self.lengths = keep.iter().map(|&i| self.lengths[i]).collect();
        self.holes = keep.iter().map(|&i| self.holes[i].clone()).collect();
        if let Some(p) = &self.planes {
            let mut p = p.clone();
            if !identity {
                let ids: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
                let ids = Array::from_slice(&ids, &[ids.len() as i32]);
                p = map_planes(&p, |a| Ok(a.take_axis(&ids, 0)?))?;
            }
            let shift = *self.left_padding.iter().min().unwrap_or(&0);
            if shift > 0 {
                p = map_planes(&p, |a| Ok(a.index((.., .., shift.., ..))))?;
                self.idx -= shift;
                self.left_padding.iter_mut().for_each(|x| *x -= shift);
                self.holes.iter_mut().flatten().for_each(|h| *h -= shift);
            }
            self.planes = Some(p);
        }
        Ok(())
    }

    /// Row `row`'s live positions, ascending.
    fn live_positions(&self, row: usize) -> Vec<i32> {
        live_positions(self.left_padding[row], self.idx, &self.holes[row])
    }

    /// Row `row`'s live positions as one-row planes (a copy), if it has any.
    fn extract(&self, row: usize) -> Result<Option<Planes>> {
        let Some(p) = &self.planes else {
            return Ok(None);
        };
        if self.lengths[row] == 0 {
            return Ok(None);
        }
        let r = row as i32;
        let (start, idx) = (self.left_padding[row], self.idx);
        let ids = (!self.holes[row].is_empty()).then(|| {
            let live = self.live_positions(row);
            Array::from_slice(&live, &[live.len() as i32])
        });
        let out = map_planes(p, |a| {
            let a = a.index((r..r + 1, .., .., ..));
            let a = match &ids {
                Some(ids) => a.take_axis(ids, 2)?,
                None => a.index((.., .., start..idx, ..)),
            };
            Ok(a.contiguous()?)
        })?;
        Ok(Some(out))
    }

    /// Drops the last `n[r]` positions of each row `r`: the positions every
    /// row drops are cut from the end, the rest become holes.
    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        for (r, &drop) in n.iter().enumerate().take(self.rows()) {
            ensure!(
                drop as i32 <= self.lengths[r],
                "cannot drop {drop} of row {r}'s {} positions",
                self.lengths[r]
            );
        }
        if drop_row_tails(&mut self.idx, &mut self.lengths, &mut self.holes, n)? {
            self.repack()?;
        }
        Ok(())
    }

    /// Right-aligns every row's live positions again, without holes.
    fn repack(&mut self) -> Result<()> {
        let Some(p) = &self.planes else {
            self.holes.iter_mut().for_each(Vec::clear);
            return Ok(());
        };
        let live: Vec<Vec<i32>> = (0..self.rows()).map(|r| self.live_positions(r)).collect();
        let (gather, idx) = repack_gather(&live);
        let b = self.rows() as i32;
        let ids = Array::from_slice(&gather, &[b, 1, idx, 1]);
        let old_idx = self.idx;
        let planes = map_planes(p, |a| {
            let s = a.shape();
            let ids = broadcast_to(&ids, &[b, s[1], idx, s[3]])?;
            Ok(a.index((.., .., ..old_idx, ..)).take_along_axis(&ids, 2)?)
        })?;
        self.planes = Some(planes);
        self.left_padding = live.iter().map(|r| idx - r.len() as i32).collect();
        self.holes.iter_mut().for_each(Vec::clear);
        self.idx = idx;
        Ok(())
    }

    /// Each row's padding and holes hidden; causal over `l` new queries.
    fn mask(&self, l: i32, kv_len: i32) -> Result<Mask> {
        rows_mask(&self.left_padding, &self.holes, l, kv_len)
    }
}

impl BatchQuantizedCache {
    /// An empty batch for rows quantized with `q`.
    pub(crate) fn new(q: KvQuantization) -> Self {
        Self {
            q,
            store: Store::Dense(BatchKvCache::new()),
        }
    }

    fn lengths(&self) -> &[i32] {
        match &self.store {
            Store::Dense(d) => d.lengths(),
            Store::Quantized(r) => &r.lengths,
        }
    }

    /// Quantizes every row of a dense batch.
    fn quantize_all(&mut self) -> Result<()> {
        let Store::Dense(dense) = &self.store else {
            return Ok(());
        };
        let mut rows = Rows::default();
        for (r, &len) in dense.lengths().iter().enumerate() {
            let planes = match dense.extract_standard(r)?.state() {
                Some((k, v)) => Some(quantize_kv(&k, &v, &self.q)?),
                None => None,
            };
            rows.push(planes, len)?;
        }
        self.store = Store::Quantized(rows);
        Ok(())
    }

    /// A joining row's positions, quantized.
    fn quantized_row(&self, single: &dyn KvCache) -> Result<Option<Planes>> {
        if let Some(s) = single.quantized_state() {
            ensure!(
                (s.bits, s.group_size) == (self.q.bits, self.q.group_size),
                "a row quantized to {} bits (group {}) cannot join a batch of {} bits (group {})",
                s.bits,
                s.group_size,
                self.q.bits,
                self.q.group_size
            );
            let [k0, k1, k2] = s.keys;
            let [v0, v1, v2] = s.values;
            return Ok(Some([k0, k1, k2, v0, v1, v2]));
        }
        match single.state() {
            Some((k, v)) => Ok(Some(quantize_kv(&k, &v, &self.q)?)),
            None => Ok(None),
        }
    }
}

impl BatchCache for BatchQuantizedCache {
    fn rows(&self) -> usize {
        self.lengths().len()
    }

    fn push_row(&mut self, single: &dyn KvCache) -> Result<()> {
        if !matches!(single.kind(), "KVCache" | "QuantizedKVCache") {
            bail!("a {} cannot join a quantized batch cache", single.kind());
        }
        let dense = single.state();
        // Dense contents, or none: a dense batch takes the row as it is.
        if let Store::Dense(batch) = &mut self.store {
            if dense.is_some() || single.offset() == 0 {
                return batch.extend(BatchKvCache::from_single(dense));
            }
        }
        self.quantize_all()?;
        let row = self.quantized_row(single)?;
        let len = single.offset() as i32;
        if let Some(p) = &row {
            ensure!(
                p[0].shape()[2] == len,
                "a joining row holds {} positions, its offset says {len}",
                p[0].shape()[2]
            );
        }
        let Store::Quantized(rows) = &mut self.store else {
            unreachable!("quantize_all leaves the batch quantized");
        };
        rows.push(row, len)
    }

    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = Self::new(self.q);
            return Ok(());
        }
        match &mut self.store {
            Store::Dense(d) => d.filter(keep),
            Store::Quantized(r) => r.filter(keep),
        }
    }

    fn extract(&self, row: usize) -> Result<Box<dyn KvCache>> {
        let mut cache = QuantizedCache::new(self.q);
        match &self.store {
            Store::Dense(d) => {
                if let Some((k, v)) = d.extract_standard(row)?.state() {
                    let n = k.shape()[2] as usize;
                    cache.set_state(k, v, n)?;
                }
            }
            Store::Quantized(r) => {
                if let Some(p) = r.extract(row)? {
                    let len = r.lengths[row] as usize;
                    cache = QuantizedCache::with_state(state_of(p, None, &self.q), len, self.q)?;
                }
            }
        }
        Ok(Box::new(cache))
    }

    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        match &mut self.store {
            Store::Dense(d) => BatchCache::trim_rows(d, n),
            Store::Quantized(r) => r.trim_rows(n),
        }
    }

    fn can_trim_rows(&self) -> bool {
        true
    }
}

impl KvCache for BatchQuantizedCache {
    fn offset(&self) -> usize {
        match &self.store {
            Store::Dense(d) => d.offset(),
            Store::Quantized(r) => r.idx as usize,
        }
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        match &mut self.store {
            Store::Dense(d) => d.update_and_fetch(keys, values),
            Store::Quantized(_) => {
                bail!("a quantized batch cache is read through update_quantized")
            }
        }
    }

    fn update_quantized(&mut self, keys: &Array, values: &Array) -> Result<Option<QuantizedState>> {
        let start = self.q.start as i32;
        if let Store::Dense(d) = &self.store {
            // Where a single cache converts: an update at or past the start.
            if !d.lengths().iter().any(|&l| l > 0 && l >= start) {
                return Ok(None);
            }
            self.quantize_all()?;
        }
        let new = quantize_kv(keys, values, &self.q)?;
        let Store::Quantized(rows) = &mut self.store else {
            unreachable!("quantize_all leaves the batch quantized");
        };
        rows.append(new)?;
        Ok(self.quantized_state())
    }

    fn quantized_state(&self) -> Option<QuantizedState> {
        match &self.store {
            Store::Quantized(r) => r.live().map(|p| state_of(p, r.planes.as_ref(), &self.q)),
            Store::Dense(_) => None,
        }
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: usize) -> usize {
        0
    }

    fn state(&self) -> Option<(Array, Array)> {
        match &self.store {
            Store::Dense(d) => d.state(),
            Store::Quantized(_) => None,
        }
    }

    fn set_state(&mut self, _keys: Array, _values: Array, _offset: usize) -> Result<()> {
        bail!("a batch cache is built from rows, not restored from a state")
    }

    fn nbytes(&self) -> usize {
        match &self.store {
            Store::Dense(d) => d.nbytes(),
            Store::Quantized(r) => r
                .planes
                .as_ref()
                .map_or(0, |p| p.iter().map(|a| a.nbytes()).sum()),
        }
    }

    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn kind(&self) -> &'static str {
        "BatchQuantizedKVCache"
    }

    fn positions(&self) -> Positions {
        Positions::of_rows(self.lengths())
    }

    fn mask(&self, l: i32, kv_len: i32) -> Result<Mask> {
        match &self.store {
            Store::Dense(d) => d.mask(l, kv_len),
            Store::Quantized(r) => r.mask(l, kv_len),
        }
    }

    fn arrays(&self) -> Vec<Array> {
        match &self.store {
            Store::Dense(d) => d.arrays(),
            Store::Quantized(r) => r.planes.as_ref().map_or(Vec::new(), |p| p.to_vec()),
        }
    }

    fn as_batch_mut(&mut self) -> Option<&mut dyn BatchCache> {
        Some(self)
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(Self::new(self.q)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::array_eq;

    const D: i32 = 64;

    fn q(start: usize) -> KvQuantization {
        KvQuantization {
            bits: 8,
            group_size: 64,
            start,
        }
    }

    /// `[rows, 1, len, D]` of distinct values.
    fn kv(rows: i32, len: i32, seed: f32) -> Array {
        let n = (rows * len * D) as usize;
        let v: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
        Array::from_slice(&v, &[rows, 1, len, D])
    }

    fn single(len: i32, seed: f32, q: KvQuantization) -> QuantizedCache {
        let mut c = QuantizedCache::new(q);
        let a = kv(1, len, seed);
        c.set_state(a.clone(), a, len as usize).unwrap();
        c
    }

    fn same(a: &Array, b: &Array) -> bool {
        a.shape() == b.shape() && array_eq(a, b, false).unwrap().item_cast::<bool>()
    }

    fn mask_bits(c: &BatchQuantizedCache) -> Vec<i32> {
        let Mask::Array(m) = c.mask(1, c.offset() as i32).unwrap() else {
            panic!("expected an array mask");
        };
        m.as_dtype(mlx_rs::Dtype::Int32)
            .unwrap()
            .as_slice::<i32>()
            .to_vec()
    }

    #[test]
    fn rows_quantize_at_the_start_and_leave_as_they_would_alone() {
        let mut b = BatchQuantizedCache::new(q(0));
        b.push_row(&single(3, 0.0, q(0))).unwrap();
        b.push_row(&single(5, 9.0, q(0))).unwrap();
        let step = kv(2, 1, 40.0);
        let state = b.update_quantized(&step, &step).unwrap().unwrap();
        assert_eq!(state.len(), 6);
        assert_eq!(mask_bits(&b), vec![0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);

        // Row 0 alone: the same keys, quantized at the same update.
        let mut alone = single(3, 0.0, q(0));
        let own = step.index((0..1, .., .., ..));
        let want = alone.update_quantized(&own, &own).unwrap().unwrap();
        let got = b.extract(0).unwrap().quantized_state().unwrap();
        for (g, w) in got
            .keys
            .iter()
            .chain(&got.values)
            .zip(want.keys.iter().chain(&want.values))
        {
            assert!(same(g, w));
        }

        // A row joining a quantized batch is quantized as it joins.
        b.push_row(&single(2, 5.0, q(0))).unwrap();
        assert_eq!(b.lengths(), &[4, 6, 2]);
        let joined = b.extract(2).unwrap().quantized_state().unwrap();
        let want = single(2, 5.0, q(0)).quantized_state().unwrap();
        assert!(same(&joined.keys[0], &want.keys[0]));
    }

    #[test]
    fn dense_until_a_row_reaches_the_start() {
        let mut b = BatchQuantizedCache::new(q(4));
        b.push_row(&single(2, 0.0, q(4))).unwrap();
        b.push_row(&single(3, 1.0, q(4))).unwrap();
        let step = kv(2, 1, 2.0);
        assert!(b.update_quantized(&step, &step).unwrap().is_none());
        b.update_and_fetch(&step, &step).unwrap();
        assert!(b.state().is_some());
        let state = b.update_quantized(&step, &step).unwrap().unwrap();
        assert_eq!((state.len(), b.lengths()), (5, &[4, 5][..]));
        assert_eq!(mask_bits(&b), vec![0, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        b.filter(&[]).unwrap();
        assert!(b.quantized_state().is_none() && b.rows() == 0);
    }

    #[test]
    fn trimmed_rows_leave_holes_until_they_leave() {
        let mut b = BatchQuantizedCache::new(q(0));
        b.push_row(&single(3, 0.0, q(0))).unwrap();
        b.push_row(&single(4, 7.0, q(0))).unwrap();
        let step = kv(2, 2, 3.0);
        b.update_quantized(&step, &step).unwrap();
        b.trim_rows(&[2, 1]).unwrap();
        assert_eq!((b.offset(), b.lengths()), (5, &[3, 5][..]));
        assert_eq!(mask_bits(&b), vec![0, 1, 1, 1, 0, 1, 1, 1, 1, 1]);
        let row0 = b.extract(0).unwrap();
        let want = single(3, 0.0, q(0)).quantized_state().unwrap();
        assert!(same(
            &row0.quantized_state().unwrap().keys[0],
            &want.keys[0]
        ));
        let Store::Quantized(rows) = &mut b.store else {
            panic!("quantized");
        };
        rows.repack().unwrap();
        assert_eq!(rows.left_padding, vec![2, 0]);
        assert!(same(
            &b.extract(0).unwrap().quantized_state().unwrap().keys[0],
            &want.keys[0]
        ));
        b.filter(&[1]).unwrap();
        assert_eq!((b.offset(), b.lengths()), (5, &[5][..]));
    }
}
