//! The RAM prompt cache: a byte-capped LRU of KV caches keyed by the exact
//! token list they hold. A request reuses the entry sharing the longest
//! prefix with its prompt, so a conversation that re-sends its history only
//! prefills what is new.
//!
//! An entry whose caches cannot drop positions (a recurrent state, a sliding
//! window that wrapped) serves only prompts that extend all of it. The
//! server therefore also keeps such caches at the end of each prompt (a
//! checkpoint, as llama.cpp's context checkpoints), so the next turn of a
//! conversation finds a state to continue even when the reply is templated
//! back differently than it was generated; and an entry that cannot be cut
//! back never replaces the shorter entries it extends.

use super::PrefixHit;
use crate::cache::{clone_all, total_bytes, trim_all, KvCache};

struct Entry {
    tokens: Vec<u32>,
    caches: Vec<Box<dyn KvCache>>,
    bytes: usize,
    last_used: u64,
    /// Whether every cache can drop positions (serve a shorter prefix).
    trimmable: bool,
}

impl Entry {
    /// Prompt tokens this entry can serve for `prompt`, leaving at least
    /// one to process (`limit`); 0 when none.
    fn usable(&self, prompt: &[u32], limit: usize) -> usize {
        let common = common_prefix(&self.tokens, prompt).min(limit);
        if self.trimmable || common == self.tokens.len() {
            common
        } else {
            0
        }
    }
}

/// An entry pushed out of the cache: its tokens and caches.
pub(crate) type Evicted = (Vec<u32>, Vec<Box<dyn KvCache>>);

/// Counters of the RAM tier, for `/stats` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptCacheStats {
    /// Lookups that found a usable prefix.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries held.
    pub entries: usize,
    /// Bytes of the entries' caches.
    pub bytes: usize,
    /// The byte cap (`--prompt-cache`); 0: the tier is off.
    pub max_bytes: usize,
}

pub(crate) struct PromptCache {
    entries: Vec<Entry>,
    max_bytes: usize,
    bytes: usize,
    clock: u64,
    hits: u64,
    misses: u64,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    /// A cache holding at most `max_bytes` of keys and values; 0 disables it.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            entries: Vec::new(),
            max_bytes,
            bytes: 0,
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.max_bytes > 0
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Copies of the caches sharing the longest prefix with `prompt`, trimmed
    /// to that prefix. At least one prompt token is always left to process.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<PrefixHit> {
        if !self.is_enabled() {
            return None;
        }
        let limit = prompt.len().saturating_sub(1);
        let best = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.usable(prompt, limit)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].last_used));
        let Some((index, usable)) = best else {
            self.misses += 1;
            return None;
        };
        let now = self.tick();
        let entry = &mut self.entries[index];
        let mut caches = clone_all(&entry.caches);
        let excess = entry.tokens.len() - usable;
        if !trim_all(&mut caches, excess) {
            // A sliding window that wrapped since it was stored as trimmable.
            self.misses += 1;
            return None;
        }
        entry.last_used = now;
        self.hits += 1;
        Some(PrefixHit {
            caches,
            cached: usable,
        })
    }

    /// Stores `caches`, which hold exactly `tokens`. Entries that are a
    /// prefix of `tokens` are dropped when the new entry can serve them too
    /// (its caches can drop positions).
    /// Returns the entries evicted to make room (a colder tier may keep them).
    pub fn insert(&mut self, tokens: Vec<u32>, caches: Vec<Box<dyn KvCache>>) -> Vec<Evicted> {
        let mut evicted = Vec::new();
        if !self.is_enabled() || tokens.is_empty() {
            return evicted;
        }
        if caches.iter().any(|c| c.offset() != tokens.len()) {
            tracing::warn!("prompt cache: caches and token list disagree; not stored");
            return evicted;
        }
        let bytes = total_bytes(&caches);
        if bytes > self.max_bytes {
            return evicted;
        }
        let trimmable = caches.iter().all(|c| c.is_trimmable());
        let mut removed = 0;
        self.entries.retain(|e| {
            let same = e.tokens == tokens;
            let dominated = (trimmable || same)
                && e.tokens.len() <= tokens.len()
                && tokens.starts_with(&e.tokens);
            if dominated {
                removed += e.bytes;
            }
            !dominated
        });
        self.bytes -= removed;
        while self.bytes + bytes > self.max_bytes {
            match self.evict_oldest() {
                Some(e) => evicted.push(e),
                None => break,
            }
        }
        let now = self.tick();
        self.bytes += bytes;
        self.entries.push(Entry {
            tokens,
            caches,
            bytes,
            last_used: now,
            trimmable,
        });
        evicted
    }

    fn evict_oldest(&mut self) -> Option<Evicted> {
        let i = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)?;
        let e = self.entries.swap_remove(i);
        self.bytes -= e.bytes;
        Some((e.tokens, e.caches))
    }

    pub fn stats(&self) -> PromptCacheStats {
        PromptCacheStats {
            hits: self.hits,
            misses: self.misses,
            entries: self.entries.len(),
            bytes: self.bytes,
            max_bytes: self.max_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::StandardCache;
    use mlx_rs::Array;

    /// Caches of `layers` layers holding `n` positions.
    fn caches(layers: usize, n: usize) -> Vec<Box<dyn KvCache>> {
        (0..layers)
            .map(|_| {
                let mut c = StandardCache::new();
                let kv = Array::from_slice(&vec![1f32; n * 4], &[1, 1, n as i32, 4]);
                c.update_and_fetch(&kv, &kv).unwrap();
                Box::new(c) as Box<dyn KvCache>
            })
            .collect()
    }

    #[test]
    fn longest_prefix_wins_and_leaves_one_token() {
        let mut pc = PromptCache::new(1 << 30);
        pc.insert(vec![1, 2, 3], caches(2, 3));
        pc.insert(vec![7, 8, 9, 10, 11], caches(2, 5));
        let hit = pc.lookup(&[7, 8, 9, 10, 11]).unwrap();
        assert_eq!(hit.cached, 4);
        assert!(hit.caches.iter().all(|c| c.offset() == 4));
        let hit = pc.lookup(&[7, 8, 5]).unwrap();
        assert_eq!(hit.cached, 2);
        assert!(pc.lookup(&[4, 5]).is_none());
        let s = pc.stats();
        assert_eq!((s.hits, s.misses, s.entries), (2, 1, 2));
    }

    #[test]
    fn prefix_entries_are_replaced_by_their_extension() {
        let mut pc = PromptCache::new(1 << 30);
        pc.insert(vec![1, 2], caches(1, 2));
        pc.insert(vec![1, 2, 3, 4], caches(1, 4));
        assert_eq!(pc.stats().entries, 1);
        assert_eq!(pc.stats().bytes, total_bytes(&caches(1, 4)));
    }

    #[test]
    fn byte_cap_evicts_least_recently_used() {
        let one = total_bytes(&caches(1, 2));
        let mut pc = PromptCache::new(2 * one);
        pc.insert(vec![1, 2], caches(1, 2));
        pc.insert(vec![3, 4], caches(1, 2));
        pc.lookup(&[1, 2, 5]).unwrap();
        let evicted = pc.insert(vec![5, 6], caches(1, 2));
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].0, vec![3, 4]);
        assert!(pc.lookup(&[3, 4, 0]).is_none());
        assert!(pc.lookup(&[1, 2, 0]).is_some());
        assert!(pc.stats().bytes <= 2 * one);
    }

    /// Caches of a hybrid model holding `n` positions: an attention layer
    /// and a recurrent state, which cannot drop positions.
    fn hybrid(n: usize) -> Vec<Box<dyn KvCache>> {
        let mut caches = caches(1, n);
        let conv = Array::from_slice(&[0f32; 6], &[1, 3, 2]);
        let recurrent = Array::from_slice(&[0f32; 8], &[1, 2, 2, 2]);
        caches.push(Box::new(crate::cache::StateCache::from_arrays(
            conv,
            Some(recurrent),
            n,
        )));
        caches
    }

    #[test]
    fn states_serve_only_prompts_extending_them() {
        let mut pc = PromptCache::new(1 << 30);
        // A checkpoint at the end of a prompt, then the end of its reply.
        pc.insert(vec![1, 2, 3], hybrid(3));
        pc.insert(vec![1, 2, 3, 4, 5, 6], hybrid(6));
        assert_eq!(
            pc.stats().entries,
            2,
            "the longer state cannot serve [1, 2, 3]"
        );

        // The reply came back as generated: all of it is reused.
        let hit = pc.lookup(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(hit.cached, 6);
        assert!(hit.caches.iter().all(|c| c.offset() == 6));
        // The reply came back otherwise: the prompt's checkpoint serves.
        let hit = pc.lookup(&[1, 2, 3, 4, 9, 9]).unwrap();
        assert_eq!(hit.cached, 3);
        assert!(hit.caches.iter().all(|c| c.offset() == 3));
        // Nothing extends [1, 2]: no hit rather than a wrong state.
        assert!(pc.lookup(&[1, 2, 7]).is_none());
        // The same prompt again needs one token to process: a miss.
        assert!(pc.lookup(&[1, 2, 3]).is_none());
        // Storing the same tokens again replaces the entry.
        pc.insert(vec![1, 2, 3], hybrid(3));
        assert_eq!(pc.stats().entries, 2);
    }

    #[test]
    fn disabled_cache_stores_nothing() {
        let mut pc = PromptCache::new(0);
        pc.insert(vec![1, 2], caches(1, 2));
        assert!(pc.lookup(&[1, 2, 3]).is_none());
        assert_eq!(pc.stats().entries, 0);
    }
}
