//! Python's `random.Random` for the few calls lm-evaluation-harness makes
//! when it draws few-shot examples: seeding from an integer, `getrandbits`,
//! `_randbelow` and `sample`. The stream is the Mersenne Twister MT19937
//! seeded with `init_by_array`, so a seed gives here exactly the indices
//! CPython 3 gives (checked against the oracle's Python in tests/eval_data.rs).

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;

/// A `random.Random(seed)` generator.
#[derive(Clone)]
pub struct PyRandom {
    state: [u32; N],
    index: usize,
}

impl PyRandom {
    /// `random.Random(seed)` for a non-negative integer seed: the seed's
    /// 32-bit words, least significant first, feed `init_by_array`
    /// (Python uses the absolute value of a negative seed).
    pub fn new(seed: u64) -> Self {
        let low = seed as u32;
        let high = (seed >> 32) as u32;
        let key: &[u32] = if high == 0 { &[low] } else { &[low, high] };
        let mut r = Self::from_genrand(19_650_218);
        r.mix_key(key);
        r
    }

    /// MT19937's `init_genrand`.
    fn from_genrand(s: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = s;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: N }
    }

    /// The key-mixing passes of MT19937's `init_by_array`.
    fn mix_key(&mut self, key: &[u32]) {
        let mt = &mut self.state;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1];
            mt[i] = (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1];
            mt[i] =
                (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = UPPER;
        self.index = N;
    }

    /// Regenerates the whole state block.
    fn twist(&mut self) {
        let mt = &mut self.state;
        for k in 0..N {
            let y = (mt[k] & UPPER) | (mt[(k + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            mt[k] = mt[(k + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// The next tempered 32-bit output (`genrand_uint32`).
    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for `k <= 64`: 32-bit words, least significant
    /// first, the last one keeping its top bits.
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        assert!(k <= 64, "getrandbits supports at most 64 bits here");
        if k == 0 {
            return 0;
        }
        if k <= 32 {
            return (self.next_u32() >> (32 - k)) as u64;
        }
        let low = self.next_u32() as u64;
        let high = (self.next_u32() >> (64 - k)) as u64;
        low | (high << 32)
    }

    /// `_randbelow(n)`: rejection sampling on `n.bit_length()` bits.
    fn randbelow(&mut self, n: u64) -> u64 {
        assert!(n > 0, "randbelow needs n > 0");
        let bits = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(bits);
            if r < n {
                return r;
            }
        }
    }

    /// `sample(range(n), k)`: `k` distinct indices below `n` in draw order.
    /// Like Python, a partial shuffle of a pool when `n` is at most the
    /// size of a `k`-element set, else draws with rejection of repeats.
    pub fn sample(&mut self, n: usize, k: usize) -> anyhow::Result<Vec<usize>> {
        if k > n {
            anyhow::bail!("cannot sample {k} of {n} items");
        }
        let mut setsize = 21usize;
        if k > 5 {
            let exp = ((k * 3) as f64).ln() / 4f64.ln();
            setsize += 4usize.pow(exp.ceil() as u32);
        }
        let mut out = Vec::with_capacity(k);
        if n <= setsize {
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = self.randbelow((n - i) as u64) as usize;
                out.push(pool[j]);
                pool[j] = pool[n - i - 1];
            }
        } else {
            let mut seen = std::collections::HashSet::with_capacity(k);
            for _ in 0..k {
                let mut j = self.randbelow(n as u64) as usize;
                while !seen.insert(j) {
                    j = self.randbelow(n as u64) as usize;
                }
                out.push(j);
            }
        }
        Ok(out)
    }
}

/// numpy's legacy `np.random.RandomState` (what `np.random.seed` and
/// `np.random.permutation` use) for the one call `mlx_lm.perplexity` makes:
/// `permutation(n)` after `seed(s)`. Seeding from an integer fills the
/// MT19937 state with `init_genrand(s)` directly (not `init_by_array`, as
/// Python's `random` does); `permutation` shuffles `0..n` from the end,
/// each swap index drawn below `i + 1` by masking 32-bit outputs to the
/// bit width of `i` and rejecting values above it.
#[derive(Clone)]
pub struct NumpyRandomState {
    mt: PyRandom,
}

impl NumpyRandomState {
    /// `np.random.seed(seed)` (numpy accepts 0 ..= 2^32 - 1).
    pub fn new(seed: u32) -> Self {
        Self {
            mt: PyRandom::from_genrand(seed),
        }
    }

    /// A uniform integer in `0..=max` by masked rejection.
    fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mask = u64::MAX >> max.leading_zeros();
        loop {
            let v = if max <= u32::MAX as u64 {
                (self.mt.next_u32() as u64) & mask
            } else {
                let high = self.mt.next_u32() as u64;
                let low = self.mt.next_u32() as u64;
                ((high << 32) | low) & mask
            };
            if v <= max {
                return v;
            }
        }
    }

    /// `permutation(n)`: `0..n` shuffled in place, last position first.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut out: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.interval(i as u64) as usize;
            out.swap(i, j);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::PyRandom;

    #[test]
    fn reference_mt19937_outputs() {
        // The MT19937 reference (init_by_array {0x123, 0x234, 0x345, 0x456})
        // starts 1067595299 955945823 477289528.
        let mut r = PyRandom::from_genrand(19_650_218);
        r.mix_key(&[0x123, 0x234, 0x345, 0x456]);
        let first: Vec<u32> = (0..3).map(|_| r.next_u32()).collect();
        assert_eq!(first, [1_067_595_299, 955_945_823, 477_289_528]);
    }
}
