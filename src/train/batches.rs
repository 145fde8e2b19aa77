//! Grouping examples into batches: examples sorted by length, cut into
//! fixed-size batches, the batch order shuffled each epoch (as mlx-lm does).

use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::dataset_rows::SftExample;

/// A padded SFT batch, row-major `[rows, width]`, padded with token 0.
#[derive(Clone, Debug)]
pub struct SftBatch {
    /// The token ids, `rows * width` of them.
    pub tokens: Vec<i32>,
    /// Sequences in the batch.
    pub rows: usize,
    /// Length of the longest (truncated) sequence; every row is padded to it.
    pub width: usize,
    /// `(offset, length)` of each row after truncation.
    pub spans: Vec<(usize, usize)>,
}

impl SftBatch {
    /// The supervised positions as `(row, t)` over the label-shifted
    /// `[rows, width - 1]` grid (target token `t + 1`): mlx-lm's mask
    /// `offset <= t + 1 <= length`.
    pub fn supervised(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (row, &(offset, length)) in self.spans.iter().enumerate() {
            for t in 0..self.width - 1 {
                let step = t + 1;
                if step >= offset && step <= length {
                    out.push((row, t));
                }
            }
        }
        out
    }

    pub(crate) fn supervised_count(&self) -> usize {
        self.supervised().len()
    }

    /// Tokens that go through the model (the batch without its last column).
    pub(crate) fn num_tokens(&self) -> usize {
        self.spans.iter().map(|&(_, l)| l).sum()
    }
}

/// Pads `examples` into one batch, truncating rows to `max_seq_length`.
pub fn pad_sft(examples: &[&SftExample], max_seq_length: usize) -> SftBatch {
    let longest = examples.iter().map(|e| e.tokens.len()).max().unwrap_or(0);
    if longest > max_seq_length {
        tracing::warn!(
            "some sequences are longer than {max_seq_length} tokens; the longest ({longest}) is truncated"
        );
    }
    // One column past the longest row: mlx-lm's mask also scores the first
    // padding position. (mlx-lm pads further, to 1 + a multiple of 32, to
    // reuse compiled shapes; the extra columns never reach the loss.)
    let width = (longest + 1).min(max_seq_length);
    let rows = examples.len();
    let mut tokens = vec![0i32; rows * width];
    let mut spans = Vec::with_capacity(rows);
    for (r, e) in examples.iter().enumerate() {
        let len = e.tokens.len().min(max_seq_length);
        for (j, &t) in e.tokens[..len].iter().enumerate() {
            tokens[r * width + j] = t as i32;
        }
        spans.push((e.offset, len));
    }
    SftBatch {
        tokens,
        rows,
        width,
        spans,
    }
}

/// Yields index batches of `batch_size`, forever (or one pass), with the
/// batch order reshuffled from `seed` every epoch.
pub(crate) struct BatchOrder {
    batches: Vec<Vec<usize>>,
    order: Vec<usize>,
    pos: usize,
    rng: rand::rngs::StdRng,
    looping: bool,
}

impl BatchOrder {
    /// `lengths[i]` is the length of example `i`; examples are sorted by it so
    /// that a batch holds similar lengths. A trailing partial batch is dropped.
    pub fn new(lengths: &[usize], batch_size: usize, seed: u64, looping: bool) -> Result<Self> {
        if lengths.len() < batch_size {
            bail!(
                "the dataset needs at least batch_size={batch_size} examples but has {}",
                lengths.len()
            );
        }
        let mut idx: Vec<usize> = (0..lengths.len()).collect();
        idx.sort_by_key(|&i| lengths[i]);
        let batches: Vec<Vec<usize>> = idx.chunks_exact(batch_size).map(|c| c.to_vec()).collect();
        let mut me = Self {
            order: Vec::new(),
            pos: 0,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            batches,
            looping,
        };
        me.reshuffle();
        Ok(me)
    }

    fn reshuffle(&mut self) {
        self.order = (0..self.batches.len()).collect();
        self.order.shuffle(&mut self.rng);
        self.pos = 0;
    }
}

impl Iterator for BatchOrder {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        if self.pos == self.order.len() {
            if !self.looping {
                return None;
            }
            self.reshuffle();
        }
        let b = self.batches[self.order[self.pos]].clone();
        self.pos += 1;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_and_mask_follow_mlx_lm() {
        let a = SftExample {
            tokens: vec![5, 6, 7, 8],
            offset: 2,
        };
        let b = SftExample {
            tokens: vec![1, 2],
            offset: 0,
        };
        let batch = pad_sft(&[&a, &b], 2048);
        assert_eq!(batch.width, 5);
        assert_eq!(&batch.tokens[..5], &[5, 6, 7, 8, 0]);
        // Row 0: steps 2..=4 (targets 7, 8 and the first pad); row 1: steps 1..=2.
        assert_eq!(
            batch.supervised(),
            vec![(0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
        );
        let short = pad_sft(&[&a], 3);
        assert_eq!(short.width, 3);
        assert_eq!(short.spans, vec![(2, 3)]);
    }

    #[test]
    fn order_covers_every_batch_each_epoch() {
        let lengths = [5, 1, 4, 2, 3, 6];
        let mut order = BatchOrder::new(&lengths, 2, 7, true).unwrap();
        let mut seen: Vec<Vec<usize>> = (0..3).map(|_| order.next().unwrap()).collect();
        seen.sort();
        assert_eq!(seen, vec![vec![0, 5], vec![1, 3], vec![4, 2]]);
        assert!(BatchOrder::new(&lengths, 7, 0, false).is_err());
    }
}
