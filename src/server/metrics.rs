//! Observability: HTTP request counters, `/stats` as JSON and `/metrics` in
//! the Prometheus text format, both built from one snapshot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{json, Value};

use crate::gateway::GatewayStats;

/// Responses by route and status code.
pub struct HttpMetrics {
    started: Instant,
    responses: Mutex<BTreeMap<(String, u16), u64>>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            responses: Mutex::new(BTreeMap::new()),
        }
    }
}

impl HttpMetrics {
    /// Counts one response to `route` with HTTP `status`.
    pub fn record(&self, route: &str, status: u16) {
        *self
            .responses
            .lock()
            .unwrap()
            .entry((route.to_string(), status))
            .or_default() += 1;
    }

    pub(crate) fn uptime_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn snapshot(&self) -> BTreeMap<(String, u16), u64> {
        self.responses.lock().unwrap().clone()
    }
}

pub(crate) fn stats_json(model: &str, ready: bool, http: &HttpMetrics, g: &GatewayStats) -> Value {
    let responses = http.snapshot();
    let mut by_route: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    for ((route, status), n) in &responses {
        *by_route.entry(route.clone()).or_default() += n;
        *by_status.entry(status.to_string()).or_default() += n;
    }
    json!({
        "model": model,
        "ready": ready,
        "uptime_s": http.uptime_s(),
        "requests": {
            "http_total": responses.values().sum::<u64>(),
            "by_route": by_route,
            "by_status": by_status,
            "generations_completed": g.completed,
            "generations_cancelled": g.cancelled,
            "generations_failed": g.failed,
            "rejected_queue_full": g.rejected,
        },
        "tokens": {
            "prompt": g.prompt_tokens,
            "prompt_cached": g.cached_tokens,
            "completion": g.completion_tokens,
        },
        "speculative": {
            "drafted_tokens": g.drafted_tokens,
            "accepted_tokens": g.accepted_tokens,
            "acceptance": if g.drafted_tokens > 0 {
                g.accepted_tokens as f64 / g.drafted_tokens as f64
            } else {
                0.0
            },
        },
        "queue": {
            "depth": g.queue_depth,
            "max": g.max_queue,
            "active": g.active,
        },
        "batch": {
            "decode_concurrency": g.decode_concurrency,
            "requests_outside_batch": g.outside_batch,
            "active_rows": g.batch_rows,
            "prefilling_rows": g.prefilling_rows,
            "waiting_rows": g.queue_depth,
            "kv_bytes": g.kv_bytes,
            "kv_projected_bytes": g.kv_projected_bytes,
            "kv_budget_bytes": g.kv_budget_bytes,
        },
        "prompt_cache": {
            "hits": g.prompt_cache.hits,
            "misses": g.prompt_cache.misses,
            "entries": g.prompt_cache.entries,
            "bytes": g.prompt_cache.bytes,
            "max_bytes": g.prompt_cache.max_bytes,
        },
        "ssd_cache": ssd_json(g),
        "latency": {
            "samples": g.samples,
            "ttft_s": {"p50": g.ttft_p50_s, "p95": g.ttft_p95_s},
            "decode_tok_s": {"p50": g.decode_tps_p50, "p95": g.decode_tps_p95},
        },
    })
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, f64)]) {
    let _ = writeln!(out, "# HELP mlx_bun_{name} {help}");
    let _ = writeln!(out, "# TYPE mlx_bun_{name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "mlx_bun_{name}{labels} {value}");
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn prometheus(http: &HttpMetrics, g: &GatewayStats) -> String {
    let mut out = String::new();
    let responses: Vec<(String, f64)> = http
        .snapshot()
        .into_iter()
        .map(|((route, status), n)| {
            (
                format!("{{route=\"{}\",status=\"{status}\"}}", escape_label(&route)),
                n as f64,
            )
        })
        .collect();
    let responses: Vec<(&str, f64)> = responses.iter().map(|(l, v)| (l.as_str(), *v)).collect();
    metric(
        &mut out,
        "http_responses_total",
        "counter",
        "HTTP responses by route and status.",
        &responses,
    );
    metric(
        &mut out,
        "generations_total",
        "counter",
        "Generations by outcome.",
        &[
            ("{outcome=\"completed\"}", g.completed as f64),
            ("{outcome=\"cancelled\"}", g.cancelled as f64),
            ("{outcome=\"failed\"}", g.failed as f64),
        ],
    );
    metric(
        &mut out,
        "rejected_total",
        "counter",
        "Requests refused because the queue was full.",
        &[("", g.rejected as f64)],
    );
    metric(
        &mut out,
        "prompt_tokens_total",
        "counter",
        "Prompt tokens processed or reused.",
        &[("", g.prompt_tokens as f64)],
    );
    metric(
        &mut out,
        "cached_prompt_tokens_total",
        "counter",
        "Prompt tokens served from the prompt cache.",
        &[("", g.cached_tokens as f64)],
    );
    metric(
        &mut out,
        "completion_tokens_total",
        "counter",
        "Tokens generated.",
        &[("", g.completion_tokens as f64)],
    );
    metric(
        &mut out,
        "draft_tokens_total",
        "counter",
        "Speculative decoding: tokens drafted and accepted.",
        &[
            ("{outcome=\"drafted\"}", g.drafted_tokens as f64),
            ("{outcome=\"accepted\"}", g.accepted_tokens as f64),
        ],
    );
    metric(
        &mut out,
        "queue_depth",
        "gauge",
        "Requests waiting for the worker.",
        &[("", g.queue_depth as f64)],
    );
    metric(
        &mut out,
        "active_requests",
        "gauge",
        "Requests being generated.",
        &[("", g.active as f64)],
    );
    metric(
        &mut out,
        "batch_rows",
        "gauge",
        "Batch lane rows by stage (waiting counts every queued request).",
        &[
            ("{stage=\"decoding\"}", g.batch_rows as f64),
            ("{stage=\"prefilling\"}", g.prefilling_rows as f64),
            ("{stage=\"waiting\"}", g.queue_depth as f64),
        ],
    );
    metric(
        &mut out,
        "kv_bytes",
        "gauge",
        "KV cache bytes: in use by running requests, projected for admitted ones, and the budget.",
        &[
            ("{kind=\"in_use\"}", g.kv_bytes as f64),
            ("{kind=\"projected\"}", g.kv_projected_bytes as f64),
            ("{kind=\"budget\"}", g.kv_budget_bytes as f64),
        ],
    );
    metric(
        &mut out,
        "prompt_cache_hits_total",
        "counter",
        "Prompt-cache lookups that reused a prefix.",
        &[("", g.prompt_cache.hits as f64)],
    );
    metric(
        &mut out,
        "prompt_cache_misses_total",
        "counter",
        "Prompt-cache lookups that found nothing.",
        &[("", g.prompt_cache.misses as f64)],
    );
    metric(
        &mut out,
        "prompt_cache_bytes",
        "gauge",
        "Bytes held by the prompt cache.",
        &[("", g.prompt_cache.bytes as f64)],
    );
    metric(
        &mut out,
        "prompt_cache_entries",
        "gauge",
        "Entries in the prompt cache.",
        &[("", g.prompt_cache.entries as f64)],
    );
    metric(
        &mut out,
        "time_to_first_token_seconds",
        "summary",
        "Time from queueing to the first token, recent requests.",
        &[
            ("{quantile=\"0.5\"}", g.ttft_p50_s),
            ("{quantile=\"0.95\"}", g.ttft_p95_s),
        ],
    );
    metric(
        &mut out,
        "decode_tokens_per_second",
        "summary",
        "Decode speed of recent requests.",
        &[
            ("{quantile=\"0.5\"}", g.decode_tps_p50),
            ("{quantile=\"0.95\"}", g.decode_tps_p95),
        ],
    );
    metric(
        &mut out,
        "uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        &[("", http.uptime_s())],
    );
    ssd_metrics(&mut out, g);
    out
}

/// The SSD tier in `/stats`; `null` without `--ssd-cache`.
fn ssd_json(g: &GatewayStats) -> Value {
    let Some(s) = g.ssd else {
        return Value::Null;
    };
    json!({
        "hits": s.hits,
        "misses": s.misses,
        "entries": s.entries,
        "bytes": s.bytes,
        "max_bytes": s.max_bytes,
        "writes": s.writes,
        "write_errors": s.write_errors,
        "dropped_writes": s.dropped_writes,
        "quarantined": s.quarantined,
        "restore_s": {
            "last": s.last_restore_s,
            "mean": if s.hits > 0 { s.restore_seconds_total / s.hits as f64 } else { 0.0 },
        },
    })
}

fn ssd_metrics(out: &mut String, g: &GatewayStats) {
    let Some(s) = g.ssd else {
        return;
    };
    let rows: [(&str, &str, &str, f64); 9] = [
        (
            "ssd_cache_hits_total",
            "counter",
            "Prompts restored from the SSD tier.",
            s.hits as f64,
        ),
        (
            "ssd_cache_misses_total",
            "counter",
            "Prompts found neither in RAM nor on disk.",
            s.misses as f64,
        ),
        (
            "ssd_cache_bytes",
            "gauge",
            "Bytes of SSD-tier entries.",
            s.bytes as f64,
        ),
        (
            "ssd_cache_entries",
            "gauge",
            "Entries in the SSD tier.",
            s.entries as f64,
        ),
        (
            "ssd_cache_writes_total",
            "counter",
            "Entries written to the SSD tier.",
            s.writes as f64,
        ),
        (
            "ssd_cache_write_errors_total",
            "counter",
            "SSD-tier writes that failed (full or read-only disk).",
            s.write_errors as f64,
        ),
        (
            "ssd_cache_dropped_writes_total",
            "counter",
            "Snapshots dropped because the writer was behind.",
            s.dropped_writes as f64,
        ),
        (
            "ssd_cache_quarantined_total",
            "counter",
            "Corrupt or incompatible files moved aside.",
            s.quarantined as f64,
        ),
        (
            "ssd_cache_restore_seconds_total",
            "counter",
            "Time spent restoring from the SSD tier.",
            s.restore_seconds_total,
        ),
    ];
    for (name, kind, help, value) in rows {
        metric(out, name, kind, help, &[("", value)]);
    }
}
