//! Prefix storage: KV caches kept for the token prefixes they hold, so a
//! prompt that starts with a stored prefix prefills only the rest.
//!
//! - `ram`: the RAM tier, a byte-capped LRU keyed by token list (an entry
//!   whose caches cannot drop positions serves only prompts extending it)
//! - `ssd`: the tier on disk (`serve --ssd-cache`), written behind by its
//!   own thread, restored after a restart
//! - [`file`]: KV-cache files in mlx-lm's layout (`cache-prompt`,
//!   `--prompt-cache-file`, the chat REPL, and the SSD tier's entries)
//!
//! [`PrefixStore`] is what the server uses: it answers the longest stored
//! prefix of a prompt across the tiers (RAM first, then disk when it holds
//! a longer one) and stores caches in both (every store, and every RAM
//! eviction not on disk yet, is snapshotted to disk).
//!
//! This module stands on the model and its caches (and `generate`'s
//! prefill, which [`file::fill`] runs); serving calls it, never the other
//! way round.

pub mod file;
mod ram;
mod ssd;

pub use ram::PromptCacheStats;
pub use ssd::{SsdConfig, SsdStats};

use std::sync::{Arc, Mutex};

use anyhow::Result;

use crate::cache::{clone_all, KvCache};
use crate::model::Model;
use ram::PromptCache;
use ssd::{SsdStatsHandle, SsdTier};

/// Caches ready for a prompt: its first `cached` tokens are in them.
pub(crate) struct PrefixHit {
    pub caches: Vec<Box<dyn KvCache>>,
    pub cached: usize,
}

/// The counters of every tier.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PrefixStats {
    pub ram: PromptCacheStats,
    /// `None` without a tier on disk.
    pub ssd: Option<SsdStats>,
}

/// A live view of a store's counters, readable from any thread: the RAM
/// tier's as the store last published them, the SSD tier's as its writer
/// keeps them.
#[derive(Clone, Default)]
pub(crate) struct PrefixStatsHandle {
    ram: Arc<Mutex<PromptCacheStats>>,
    ssd: Option<SsdStatsHandle>,
}

impl PrefixStatsHandle {
    pub(crate) fn get(&self) -> PrefixStats {
        PrefixStats {
            ram: *self.ram.lock().unwrap(),
            ssd: self.ssd.as_ref().map(|h| h.get()),
        }
    }
}

/// The server's prefix storage: the RAM tier and, with `--ssd-cache`, the
/// tier on disk. It lives on the worker (MLX arrays stay on its thread).
pub(crate) struct PrefixStore {
    ram: PromptCache,
    ssd: Option<SsdTier>,
    /// Where the RAM tier's counters are published for [`PrefixStatsHandle`].
    ram_stats: Arc<Mutex<PromptCacheStats>>,
}

impl PrefixStore {
    /// A store keeping up to `ram_bytes` of caches in RAM (0: none) and,
    /// with `ssd`, a tier on disk, opened here (its folder created, what
    /// this server cannot use quarantined, its writer started).
    pub(crate) fn open(ram_bytes: usize, ssd: Option<&SsdConfig>) -> Result<PrefixStore> {
        let ssd = match ssd {
            Some(c) => Some(SsdTier::open(c.clone())?),
            None => None,
        };
        let store = PrefixStore {
            ram: PromptCache::new(ram_bytes),
            ssd,
            ram_stats: Arc::default(),
        };
        store.publish();
        Ok(store)
    }

    /// The same store without its RAM tier (a sharded server: its hits
    /// would depend on each rank's memory).
    pub(crate) fn without_ram(mut self) -> PrefixStore {
        self.ram = PromptCache::new(0);
        self.publish();
        self
    }

    /// Whether the store has a tier on disk.
    pub(crate) fn has_disk(&self) -> bool {
        self.ssd.is_some()
    }

    /// A live view of the counters.
    pub(crate) fn stats_handle(&self) -> PrefixStatsHandle {
        PrefixStatsHandle {
            ram: self.ram_stats.clone(),
            ssd: self.ssd.as_ref().map(|t| t.stats_handle()),
        }
    }

    /// Caches holding the longest stored prefix of `prompt`, trimmed to it:
    /// from RAM, or restored from disk when the SSD tier holds a longer
    /// prefix. At least one prompt token is left to process; `None` when no
    /// tier holds a usable prefix.
    pub(crate) fn longest(&mut self, model: &Model, prompt: &[u32]) -> Option<PrefixHit> {
        let ram = self.ram.lookup(prompt);
        let ram_cached = ram.as_ref().map_or(0, |h| h.cached);
        let disk = self
            .ssd
            .as_ref()
            .and_then(|ssd| ssd.restore(model, prompt, ram_cached));
        let found = match disk {
            Some((caches, cached)) => Some(PrefixHit { caches, cached }),
            None => ram,
        };
        self.publish();
        found
    }

    /// Keeps `caches` (which hold exactly `tokens`) in RAM, and hands them
    /// to the SSD tier with any entry RAM evicts that is not on disk yet.
    pub(crate) fn store(&mut self, tokens: Vec<u32>, caches: Vec<Box<dyn KvCache>>) {
        if let Some(ssd) = &self.ssd {
            ssd.snapshot(&tokens, &caches);
        }
        let evicted = self.ram.insert(tokens, caches);
        if let Some(ssd) = &self.ssd {
            for (tokens, caches) in evicted {
                if !ssd.contains(&tokens) {
                    ssd.snapshot(&tokens, &caches);
                }
            }
        }
        self.publish();
    }

    /// Keeps a copy of `caches`, which hold exactly `tokens` (a prompt
    /// without its last token), when they cannot drop positions: the end
    /// of the request stores a longer entry that cannot serve a prompt
    /// diverging inside the reply, and this one can.
    pub(crate) fn checkpoint(&mut self, tokens: &[u32], caches: &[Box<dyn KvCache>]) {
        let kept = self.ram.is_enabled() || self.ssd.is_some();
        if !kept || caches.iter().all(|c| c.is_trimmable()) {
            return;
        }
        self.store(tokens.to_vec(), clone_all(caches));
    }

    /// Publishes the RAM tier's counters (the SSD tier's are read live).
    fn publish(&self) {
        *self.ram_stats.lock().unwrap() = self.ram.stats();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{StandardCache, StateCache};
    use mlx_rs::Array;

    /// Caches of one attention layer holding `n` positions, with a
    /// recurrent state when `state`.
    fn caches(n: usize, state: bool) -> Vec<Box<dyn KvCache>> {
        let mut c = StandardCache::new();
        let kv = Array::from_slice(&vec![1f32; n * 4], &[1, 1, n as i32, 4]);
        c.update_and_fetch(&kv, &kv).unwrap();
        let mut caches = vec![Box::new(c) as Box<dyn KvCache>];
        if state {
            let conv = Array::from_slice(&[0f32; 6], &[1, 3, 2]);
            let recurrent = Array::from_slice(&[0f32; 8], &[1, 2, 2, 2]);
            caches.push(Box::new(StateCache::from_arrays(conv, Some(recurrent), n)));
        }
        caches
    }

    #[test]
    fn checkpoints_keep_only_states_and_stats_are_published() {
        let mut store = PrefixStore::open(1 << 30, None).unwrap();
        let stats = store.stats_handle();
        assert_eq!(stats.get().ram.max_bytes, 1 << 30);
        assert_eq!(stats.get().ssd, None);
        store.checkpoint(&[1, 2, 3], &caches(3, false));
        assert_eq!(
            stats.get().ram.entries,
            0,
            "trimmable caches need no checkpoint"
        );
        store.checkpoint(&[1, 2, 3], &caches(3, true));
        assert_eq!(stats.get().ram.entries, 1);
        store.store(vec![1, 2, 3, 4, 5], caches(5, true));
        assert_eq!(stats.get().ram.entries, 2);
        let store = store.without_ram();
        assert_eq!(stats.get().ram, PromptCacheStats::default());
        assert!(!store.has_disk());
    }

    #[test]
    fn a_store_without_tiers_keeps_nothing() {
        let mut store = PrefixStore::open(0, None).unwrap();
        store.checkpoint(&[1, 2], &caches(2, true));
        store.store(vec![1, 2], caches(2, true));
        assert_eq!(store.stats_handle().get().ram.entries, 0);
    }

    #[test]
    fn stores_reach_the_disk_beside_the_ram_cap() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SsdConfig {
            dir: dir.path().to_path_buf(),
            max_bytes: 1 << 30,
            model_fingerprint: "m".into(),
            tokenizer_fingerprint: "t".into(),
            kv_config: "dense".into(),
            write_delay: std::time::Duration::ZERO,
        };
        let one = crate::cache::total_bytes(&caches(2, false));
        let mut store = PrefixStore::open(one, Some(&cfg)).unwrap();
        assert!(store.has_disk());
        store.store(vec![1, 2], caches(2, false));
        store.store(vec![3, 4], caches(2, false));
        let stats = store.stats_handle();
        assert_eq!(stats.get().ram.entries, 1, "the cap holds one entry");
        for _ in 0..500 {
            if stats.get().ssd.unwrap().writes >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let ssd = store.ssd.as_ref().unwrap();
        assert!(ssd.contains(&[1, 2]), "the entry RAM evicted is on disk");
        assert!(ssd.contains(&[3, 4]));
    }
}
