//! Random keys as MLX hands them out: `mx.random.seed(S)` sets the key to
//! `key(S)`, and every draw without an explicit key splits it, keeping the
//! first half and drawing with the second. A `KeyStream` is one such
//! sequence, owned by one request, so a seeded request draws the same keys
//! alone or in a batch.

use anyhow::Result;
use mlx_rs::{random, transforms::eval, Array};

pub(crate) struct KeyStream {
    key: Array,
}

impl KeyStream {
    /// The stream `mx.random.seed(seed)` starts, advanced past `skip` draws.
    pub fn new(seed: u64, skip: usize) -> Result<Self> {
        let mut stream = Self {
            key: random::key(seed)?,
        };
        for _ in 0..skip {
            stream.next()?;
        }
        if skip > 0 {
            eval([&stream.key])?;
        }
        Ok(stream)
    }

    /// The key for the next draw.
    pub fn next(&mut self) -> Result<Array> {
        let (next, draw) = random::split(&self.key, 2)?;
        self.key = next;
        Ok(draw)
    }
}
