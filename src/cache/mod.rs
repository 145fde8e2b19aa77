//! Key/value caches for attention layers.
//!
//! Every cache stores keys and values shaped `[batch, kv_heads, seq, head_dim]`.
//! `KvCache` is the one interface the models, speculation (trim), the prompt
//! cache (clone, trim), batching and persistence (state) work through. A
//! cache also says where the next tokens sit (their RoPE positions) and which
//! keys they may see (the attention mask), so the decoder is the same for one
//! sequence and for a batch of rows of different lengths.

mod batch;
mod batch_quantized;
mod batch_rotating;
mod quantized;
mod state;

pub use batch::BatchKvCache;
pub(crate) use quantized::cast_state;
pub use quantized::{KvQuantization, QuantizedCache, QuantizedState};
pub use state::StateCache;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{arange, concatenate, expand_dims, ge, gt, logical_and, subtract, zeros_dtype};
use mlx_rs::Array;

/// How KV caches are built: dense (the default), bounded to `max_kv_size`
/// positions, or quantized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvSettings {
    /// Positions a cache keeps (`--max-kv-size`); `None`: all of them.
    pub max_kv_size: Option<usize>,
    /// Quantized keys and values (`--kv-bits`).
    pub quantization: Option<KvQuantization>,
}

impl KvSettings {
    /// Checks what holds for any model: bounded and quantized caches do not
    /// combine, a bound exceeds the positions it always keeps, and the bits
    /// and group size are ones MLX quantizes with. Whether the group size
    /// divides what a model caches is checked against the model
    /// (`Decoder::check_kv`).
    pub fn validate(&self) -> Result<()> {
        if self.max_kv_size.is_some() && self.quantization.is_some() {
            bail!("--max-kv-size and --kv-bits cannot be combined (as in mlx-lm)");
        }
        if self.max_kv_size.is_some_and(|n| n <= 4) {
            bail!("--max-kv-size must exceed the 4 positions it always keeps");
        }
        if let Some(q) = &self.quantization {
            q.validate()?;
        }
        Ok(())
    }

    pub(crate) fn is_default(&self) -> bool {
        self.max_kv_size.is_none() && self.quantization.is_none()
    }

    /// What an SSD entry records, so entries are only restored into caches
    /// of the same kind.
    pub(crate) fn describe(&self) -> String {
        match (self.max_kv_size, self.quantization) {
            (Some(n), _) => format!("rotating max={n} keep=4"),
            (None, Some(q)) => format!(
                "quantized bits={} group={} start={}",
                q.bits, q.group_size, q.start
            ),
            (None, None) => "dense".into(),
        }
    }
}

/// The RoPE positions of the next tokens: one offset for every row, or one
/// offset per row (`[batch]` int32).
pub enum Positions {
    /// Every row's next token is at this position (a single sequence, or rows
    /// of equal length).
    Shared(i32),
    /// Row `r`'s next token is at `offsets[r]`.
    PerRow(Array),
}

impl Positions {
    /// The positions of rows holding `lengths` tokens each: shared when they
    /// are all equal (no offsets array in the graph).
    pub(crate) fn of_rows(lengths: &[i32]) -> Self {
        match lengths.split_first() {
            Some((&first, rest)) if rest.iter().all(|&l| l == first) => Self::Shared(first),
            _ => Self::PerRow(Array::from_slice(lengths, &[lengths.len() as i32])),
        }
    }
}

/// Which keys each query may attend to.
pub enum Mask {
    /// Every key (a single query over a full cache).
    None,
    /// Causal over the new queries, every earlier key visible.
    Causal,
    /// An explicit boolean mask broadcastable to `[batch, heads, queries, keys]`.
    Array(Array),
}

/// The attention mask for `l` new queries at `offset` over `kv_len` keys of a
/// single sequence, with an optional sliding window.
pub(crate) fn attention_mask(
    l: i32,
    offset: i32,
    kv_len: i32,
    window: Option<usize>,
) -> Result<Mask> {
    if l == 1 {
        return Ok(Mask::None);
    }
    let Some(window) = window else {
        return Ok(Mask::Causal);
    };
    // Sliding window: key j (absolute position) is visible to query i iff
    // i - window < j <= i. Keys are the last `kv_len` positions ending at offset + l.
    let first_key = offset + l - kv_len;
    let q = expand_dims(&arange::<_, i32>(offset, offset + l, None)?, 1)?;
    let k = expand_dims(&arange::<_, i32>(first_key, first_key + kv_len, None)?, 0)?;
    let causal = ge(&q, &k)?;
    let in_window = gt(&k, &subtract(&q, Array::from_int(window as i32))?)?;
    Ok(Mask::Array(logical_and(&causal, &in_window)?))
}

/// How many positions a standard cache grows by at a time.
const STEP: i32 = 256;

/// One attention layer's cache of keys and values for one sequence (mlx-lm's
/// `KVCache` family), or a recurrent layer's state.
pub trait KvCache: Send {
    /// Number of positions seen so far (the RoPE offset of the next token).
    fn offset(&self) -> usize;
    /// Appends `keys`/`values` and returns everything attention should see.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// Appends `keys`/`values` as `update_and_fetch` does but returns the
    /// cache's whole buffers and how many positions at their start are live,
    /// for attention that reads a length instead of a slice; `None`, with
    /// nothing appended, where the cache keeps no such buffers.
    fn update_in_buffers(
        &mut self,
        _keys: &Array,
        _values: &Array,
    ) -> Result<Option<(Array, Array, i32)>> {
        Ok(None)
    }
    /// Room for `n` more positions in buffers this cache alone holds, for a
    /// kernel that writes them in place (`kernels::cuda_attention`): the key
    /// and value buffers and the position the new ones start at, counted as
    /// written. `None`, with nothing changed, where the cache keeps no such
    /// buffers or keeps them in another dtype than `keys`.
    fn reserve_in_place(
        &mut self,
        _keys: &Array,
        _values: &Array,
        _n: i32,
    ) -> Result<Option<(Array, Array, i32)>> {
        Ok(None)
    }
    /// Whether `trim` can drop recent positions.
    fn is_trimmable(&self) -> bool;
    /// Drops the last `n` positions; returns how many were dropped.
    fn trim(&mut self, n: usize) -> usize;
    /// Keys and values of the live positions, if any.
    fn state(&self) -> Option<(Array, Array)>;
    /// Replaces the contents with `keys`/`values` (as returned by `state`).
    fn set_state(&mut self, keys: Array, values: Array, offset: usize) -> Result<()>;
    /// Bytes held on the device.
    fn nbytes(&self) -> usize;
    /// An independent copy (arrays are immutable; copies share storage until written).
    fn boxed_clone(&self) -> Box<dyn KvCache>;
    /// A short type name, stored with persisted caches.
    fn kind(&self) -> &'static str;
    /// The window size of a sliding-window cache.
    fn max_size(&self) -> Option<usize> {
        None
    }
    /// RoPE positions of the next tokens (read before `update_and_fetch`).
    fn positions(&self) -> Positions {
        Positions::Shared(self.offset() as i32)
    }
    /// The mask for the `l` queries just added over the `kv_len` keys that
    /// `update_and_fetch` returned (read after it).
    fn mask(&self, l: i32, kv_len: i32) -> Result<Mask> {
        attention_mask(l, self.offset() as i32 - l, kv_len, self.max_size())
    }
    /// The batch cache behind this layer, when it is one.
    fn as_batch_mut(&mut self) -> Option<&mut dyn BatchCache> {
        None
    }
    /// An empty batch cache that rows of this kind join; `None` when this
    /// kind of cache cannot be batched.
    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        None
    }
    /// The recurrent state behind this layer, when it keeps one instead of
    /// keys and values (gated DeltaNet layers).
    fn as_state_mut(&mut self) -> Option<&mut StateCache> {
        None
    }
    /// Leading positions a sliding window never evicts.
    fn keep(&self) -> usize {
        0
    }
    /// A quantized cache appends `keys`/`values` and returns everything
    /// attention should see, quantized; dense caches return `None` without
    /// touching anything (use `update_and_fetch`).
    fn update_quantized(
        &mut self,
        _keys: &Array,
        _values: &Array,
    ) -> Result<Option<QuantizedState>> {
        Ok(None)
    }
    /// The quantized contents of a quantized cache.
    fn quantized_state(&self) -> Option<QuantizedState> {
        None
    }
    /// The arrays to evaluate after a forward pass.
    fn arrays(&self) -> Vec<Array> {
        self.state().map(|(k, v)| vec![k, v]).unwrap_or_default()
    }
}

/// One layer's cache for several rows of different lengths: rows join from
/// single-sequence caches of the matching kind, leave by [`BatchCache::filter`]
/// or [`BatchCache::extract`], and drop rejected drafts per row.
pub trait BatchCache: KvCache {
    /// Number of rows.
    fn rows(&self) -> usize;
    /// Appends a row holding `single`'s contents (a cache of the kind whose
    /// [`KvCache::empty_batch`] made this one).
    fn push_row(&mut self, single: &dyn KvCache) -> Result<()>;
    /// Keeps only the rows at `keep`, in that order.
    fn filter(&mut self, keep: &[usize]) -> Result<()>;
    /// Row `row`'s contents as a single-sequence cache.
    fn extract(&self, row: usize) -> Result<Box<dyn KvCache>>;
    /// Drops the last `n[r]` positions of each row `r` (rejected drafts).
    fn trim_rows(&mut self, n: &[usize]) -> Result<()>;
    /// Whether [`BatchCache::trim_rows`] can drop positions (speculative rows).
    fn can_trim_rows(&self) -> bool {
        false
    }
}

/// Empty batch caches for a row whose single-sequence caches are `caches`,
/// or why they cannot batch.
pub(crate) fn empty_batch_like(caches: &[Box<dyn KvCache>]) -> Result<Vec<Box<dyn KvCache>>> {
    caches
        .iter()
        .map(|c| {
            c.empty_batch()
                .map(|b| b as Box<dyn KvCache>)
                .ok_or_else(|| anyhow::anyhow!("a {} layer cannot join a batch", c.kind()))
        })
        .collect()
}

/// Whether rows with caches like `caches` can be decoded together.
pub fn can_batch(caches: &[Box<dyn KvCache>]) -> bool {
    caches.iter().all(|c| c.empty_batch().is_some())
}

/// Whether rows with caches like `caches` can also speculate in a batch
/// (every layer's batch cache drops rejected drafts per row).
pub fn can_batch_speculate(caches: &[Box<dyn KvCache>]) -> bool {
    caches
        .iter()
        .all(|c| c.empty_batch().is_some_and(|b| b.can_trim_rows()))
}

/// The standard cache: grows in steps of 256 positions, trimmable.
#[derive(Default)]
pub struct StandardCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    /// Whether no other array shares the buffers: set when this cache makes
    /// them, cleared when a copy of the cache or a slice of its state may
    /// share them. Kernels write only into buffers held alone.
    alone: AtomicBool,
}

impl Clone for StandardCache {
    fn clone(&self) -> Self {
        self.alone.store(false, Ordering::Relaxed);
        Self {
            keys: self.keys.clone(),
            values: self.values.clone(),
            offset: self.offset,
            alone: AtomicBool::new(false),
        }
    }
}

impl StandardCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `keys`/`values` after the live positions, growing the buffers
    /// as needed: the buffers and the new number of live positions.
    fn append(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array, i32)> {
        let prev = self.offset as i32;
        let n = keys.shape()[2];
        let capacity = self.keys.as_ref().map(|k| k.shape()[2]).unwrap_or(0);
        if self.keys.is_none() || prev + n > capacity {
            self.grow(keys, values, n)?;
        }
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        write_at(vec![&mut *k, &mut *v], vec![keys, values], prev)?;
        self.offset += n as usize;
        Ok((k.clone(), v.clone(), self.offset as i32))
    }
}

impl StandardCache {
    /// New buffers with room for `n` positions after the live ones (a copy of
    /// those), held by this cache alone.
    fn grow(&mut self, keys: &Array, values: &Array, n: i32) -> Result<()> {
        let live = self.offset as i32;
        self.keys = Some(grow(self.keys.take(), keys, live, n)?);
        self.values = Some(grow(self.values.take(), values, live, n)?);
        self.alone.store(true, Ordering::Relaxed);
        Ok(())
    }
}

pub(super) fn grow(buf: Option<Array>, like: &Array, live: i32, needed: i32) -> Result<Array> {
    let shape = like.shape();
    let (b, h, d) = (shape[0], shape[1], shape[3]);
    let steps = (needed + STEP - 1) / STEP;
    let fresh = zeros_dtype(&[b, h, steps * STEP, d], like.dtype())?;
    Ok(match buf {
        Some(old) => {
            let old = old.index((.., .., ..live, ..));
            concatenate(&[old, fresh], 2)?
        }
        None => fresh,
    })
}

/// Writes each of `updates` into its buffer at `position` along the
/// positions axis (one `slice_update` each).
pub(crate) fn write_at(
    buffers: Vec<&mut Array>,
    updates: Vec<&Array>,
    position: i32,
) -> Result<()> {
    for (buf, new) in buffers.into_iter().zip(updates) {
        *buf = crate::mlx_ext::slice_update(buf, new, &[0, 0, position, 0])?;
    }
    Ok(())
}

impl KvCache for StandardCache {
    fn offset(&self) -> usize {
        self.offset
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

    fn reserve_in_place(
        &mut self,
        keys: &Array,
        values: &Array,
        n: i32,
    ) -> Result<Option<(Array, Array, i32)>> {
        if self
            .keys
            .as_ref()
            .is_some_and(|k| k.dtype() != keys.dtype())
        {
            return Ok(None);
        }
        let start = self.offset as i32;
        let capacity = self.keys.as_ref().map(|k| k.shape()[2]).unwrap_or(0);
        if start + n > capacity || !self.alone.load(Ordering::Relaxed) {
            self.grow(keys, values, n)?;
        }
        self.offset += n as usize;
        let (k, v) = (self.keys.clone(), self.values.clone());
        Ok(Some((
            k.expect("grown above"),
            v.expect("grown above"),
            start,
        )))
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset);
        self.offset -= n;
        n
    }

    fn arrays(&self) -> Vec<Array> {
        self.keys.iter().chain(&self.values).cloned().collect()
    }

    fn state(&self) -> Option<(Array, Array)> {
        // The slices share the buffers.
        self.alone.store(false, Ordering::Relaxed);
        let end = self.offset as i32;
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if end > 0 => {
                Some((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
            }
            _ => None,
        }
    }

    fn set_state(&mut self, keys: Array, values: Array, offset: usize) -> Result<()> {
        if keys.shape()[2] as usize != offset {
            bail!(
                "cache state has {} positions, offset says {offset}",
                keys.shape()[2]
            );
        }
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset = offset;
        self.alone.store(false, Ordering::Relaxed);
        Ok(())
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes())
            + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn kind(&self) -> &'static str {
        "KVCache"
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(BatchKvCache::new()))
    }
}

/// A sliding-window cache holding the last `max_size` positions (plus `keep`
/// leading positions that are never evicted). It can be trimmed only while
/// the window has not wrapped.
#[derive(Clone)]
pub(crate) struct RotatingCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    max_size: usize,
    keep: usize,
}

impl RotatingCache {
    pub fn new(max_size: usize, keep: usize) -> Self {
        Self {
            keys: None,
            values: None,
            offset: 0,
            max_size,
            keep,
        }
    }

    fn len(&self) -> i32 {
        self.keys.as_ref().map_or(0, |k| k.shape()[2])
    }

    /// Keeps the first `keep` positions and the most recent ones so that at
    /// most `limit` remain.
    fn evict(&self, a: &Array, limit: i32) -> Result<Array> {
        let len = a.shape()[2];
        if len <= limit {
            return Ok(a.clone());
        }
        let keep = self.keep as i32;
        let drop = len - limit;
        if keep == 0 {
            return Ok(a.index((.., .., drop.., ..)));
        }
        let head = a.index((.., .., ..keep, ..));
        let tail = a.index((.., .., keep + drop.., ..));
        Ok(concatenate(&[head, tail], 2)?)
    }
}

impl KvCache for RotatingCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        // Keep the window in temporal order: append, then evict the oldest.
        // Multi-token updates keep `max_size - 1` old positions so that every
        // new query still sees a full window.
        let n = keys.shape()[2];
        let limit_old = (self.max_size as i32 - 1).max(0);
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => {
                let k = self.evict(k, limit_old)?;
                let v = self.evict(v, limit_old)?;
                (
                    concatenate(&[k, keys.clone()], 2)?,
                    concatenate(&[v, values.clone()], 2)?,
                )
            }
            _ => (keys.clone(), values.clone()),
        };
        self.offset += n as usize;
        let window = self.max_size as i32;
        let stored_k = self.evict(&k, window)?;
        let stored_v = self.evict(&v, window)?;
        self.keys = Some(stored_k);
        self.values = Some(stored_v);
        Ok((k, v))
    }

    fn is_trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    fn trim(&mut self, n: usize) -> usize {
        if !self.is_trimmable() {
            return 0;
        }
        let n = n.min(self.offset);
        self.offset -= n;
        let end = self.len() - n as i32;
        self.keys = self.keys.as_ref().map(|k| k.index((.., .., ..end, ..)));
        self.values = self.values.as_ref().map(|v| v.index((.., .., ..end, ..)));
        n
    }

    fn state(&self) -> Option<(Array, Array)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Some((k.clone(), v.clone())),
            _ => None,
        }
    }

    fn set_state(&mut self, keys: Array, values: Array, offset: usize) -> Result<()> {
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset = offset;
        Ok(())
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes())
            + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    fn boxed_clone(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn kind(&self) -> &'static str {
        "RotatingKVCache"
    }

    fn max_size(&self) -> Option<usize> {
        Some(self.max_size)
    }

    fn keep(&self) -> usize {
        self.keep
    }

    fn empty_batch(&self) -> Option<Box<dyn BatchCache>> {
        Some(Box::new(batch_rotating::BatchRotatingCache::new(
            self.max_size,
            self.keep,
        )))
    }
}

/// Trims every layer's cache by `n`; false if any layer cannot be trimmed.
pub(crate) fn trim_all(caches: &mut [Box<dyn KvCache>], n: usize) -> bool {
    if n == 0 {
        return true;
    }
    if !caches.iter().all(|c| c.is_trimmable()) {
        return false;
    }
    caches.iter_mut().all(|c| c.trim(n) == n)
}

/// Bytes all of `caches` hold on the device.
pub fn total_bytes(caches: &[Box<dyn KvCache>]) -> usize {
    caches.iter().map(|c| c.nbytes()).sum()
}

/// Independent copies of `caches` (sharing storage until written).
pub fn clone_all(caches: &[Box<dyn KvCache>]) -> Vec<Box<dyn KvCache>> {
    caches.iter().map(|c| c.boxed_clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::transforms::eval;

    /// The address of an array's data once evaluated.
    fn data(a: &Array) -> *const f32 {
        eval([a]).unwrap();
        a.as_slice::<f32>().as_ptr()
    }

    fn reserve(cache: &mut dyn KvCache, like: &Array) -> (Array, i32) {
        let (keys, _, start) = cache.reserve_in_place(like, like, 1).unwrap().unwrap();
        (keys, start)
    }

    #[test]
    fn in_place_room_is_in_buffers_held_alone() {
        let like = Array::from_iter((0..8).map(|i| i as f32), &[1, 2, 1, 4]);
        let mut cache = StandardCache::new();
        let (first, start) = reserve(&mut cache, &like);
        assert_eq!((start, first.shape()[2]), (0, STEP));
        let (second, start) = reserve(&mut cache, &like);
        assert_eq!(start, 1);
        assert_eq!(data(&first), data(&second), "one buffer while held alone");

        // A copy of the cache shares the buffers: the next room is a copy.
        let snapshot = cache.clone();
        let (third, start) = reserve(&mut cache, &like);
        assert_eq!((start, cache.offset(), snapshot.offset()), (2, 3, 2));
        assert_ne!(data(&third), data(&second));
        let (fourth, _) = reserve(&mut cache, &like);
        assert_eq!(data(&fourth), data(&third));

        // So does a slice of its state.
        let (keys, _) = cache.state().unwrap();
        assert_eq!(keys.shape()[2], 4);
        let (fifth, start) = reserve(&mut cache, &like);
        assert_eq!(start, 4);
        assert_ne!(data(&fifth), data(&fourth));

        // Appending by `update_and_fetch` continues after the room.
        let (k, _) = cache.update_and_fetch(&like, &like).unwrap();
        assert_eq!((k.shape()[2], cache.offset()), (6, 6));

        // Past the capacity the buffers grow.
        cache.trim(6);
        for _ in 0..STEP {
            reserve(&mut cache, &like);
        }
        let (grown, start) = reserve(&mut cache, &like);
        assert_eq!(start, STEP);
        assert!(grown.shape()[2] > STEP);

        // Buffers of another dtype are left to the node-by-node path.
        let half = like.as_dtype(mlx_rs::Dtype::Float16).unwrap();
        assert!(cache.reserve_in_place(&half, &half, 1).unwrap().is_none());
        assert_eq!(cache.offset(), STEP as usize + 1);
    }
}
