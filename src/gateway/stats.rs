//! Counters and latency samples shared between the worker and the HTTP layer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Mutex;

use crate::prefix::{PrefixStatsHandle, PromptCacheStats, SsdStats};

/// How many recent requests the latency percentiles are computed over.
const SAMPLE_WINDOW: usize = 1024;

/// Latency and speed of recent requests.
#[derive(Default)]
pub(crate) struct Samples {
    pub ttft_s: VecDeque<f64>,
    pub decode_tps: VecDeque<f64>,
    pub service_s: VecDeque<f64>,
}

pub(crate) fn push_sample(v: &mut VecDeque<f64>, x: f64) {
    if v.len() == SAMPLE_WINDOW {
        v.pop_front();
    }
    v.push_back(x);
}

/// The `q`-quantile (0..=1) of `v` by nearest rank; 0 when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

#[derive(Default)]
pub(crate) struct Counters {
    /// Requests submitted and not yet admitted to a lane.
    pub queued: AtomicUsize,
    /// Requests admitted and not finished (rows of the batch included).
    pub active: AtomicUsize,
    /// Batch rows decoding.
    pub batch_rows: AtomicUsize,
    /// Batch rows prefilling.
    pub prefilling_rows: AtomicUsize,
    /// KV bytes held by running requests.
    pub kv_bytes: AtomicUsize,
    /// KV bytes admitted requests are projected to reach.
    pub kv_projected: AtomicUsize,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub rejected: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Requests routed outside the batch, by reason.
    pub outside_batch: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    pub samples: Mutex<Samples>,
    /// The prefix store's counters, read live.
    pub prefixes: Mutex<PrefixStatsHandle>,
}

/// A snapshot for `/stats` and `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct GatewayStats {
    pub queue_depth: usize,
    pub max_queue: usize,
    pub active: usize,
    /// Batch lane: rows decoding and rows prefilling.
    pub batch_rows: usize,
    pub prefilling_rows: usize,
    pub decode_concurrency: usize,
    /// KV bytes in use by running requests, admitted projections, and the budget.
    pub kv_bytes: usize,
    pub kv_projected_bytes: usize,
    pub kv_budget_bytes: usize,
    pub completed: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub rejected: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Speculative lane: tokens the draft model proposed and the target kept.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// Requests routed outside the batch, by reason.
    pub outside_batch: std::collections::BTreeMap<&'static str, u64>,
    pub prompt_cache: PromptCacheStats,
    /// The SSD tier, when the server has one.
    pub ssd: Option<SsdStats>,
    pub ttft_p50_s: f64,
    pub ttft_p95_s: f64,
    pub decode_tps_p50: f64,
    pub decode_tps_p95: f64,
    pub samples: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 10.0);
        assert_eq!(quantile(&v, 0.95), 19.0);
        assert_eq!(quantile(&[3.0], 0.95), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
