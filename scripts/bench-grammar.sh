#!/usr/bin/env bash
# Structured-output benchmark: grammar compile time cold vs cached, mask time
# per token (median, p99), and decode tok/s with vs without a JSON schema on
# the same prompt, in interleaved rounds.
#
#   scripts/bench-grammar.sh [--model DIR] [--rounds N] [--max-tokens N] [--case NAME]
#
# --case names a schema of tests/schemas/ (default: task_list). The last line
# printed is the whole report as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --example bench_grammar >&2
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "machine: $(uname -sm), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
echo "command: scripts/bench-grammar.sh $*"
exec target/release/examples/bench_grammar "$@"
