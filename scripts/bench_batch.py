"""Concurrency sweep for scripts/bench-batch.sh (standard library only).

For each server and each client count, C streaming chat requests run at
once, each generating --max-tokens tokens (end tokens banned); measured from
the client side: aggregate decode tok/s (all completion tokens over the
round's wall time) and TTFT p50/p95. Servers are measured one after another
(the others idle), each sweep after a warm-up. Prints one Markdown table.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
import bench_serve  # noqa: E402


def sweep(name, base, counts, max_tokens, rounds):
    bench_serve.stream_chat(base, [{"role": "user", "content": "warm up"}], 2)
    rows = []
    for c in counts:
        ttft, agg = [], []
        for r in range(rounds):
            results, wall = bench_serve.concurrent_round(base, c, max_tokens, f"{name}{c}.{r}")
            ttft += [x[0] for x in results]
            agg.append(sum(x[2] for x in results) / wall)
        rows.append(
            {
                "clients": c,
                "agg_tps": statistics.mean(agg),
                "ttft_p50": bench_serve.quantile(ttft, 0.5),
                "ttft_p95": bench_serve.quantile(ttft, 0.95),
            }
        )
        print(f"  {name} c={c}: {rows[-1]['agg_tps']:.1f} tok/s, "
              f"TTFT p50 {rows[-1]['ttft_p50']:.2f} s", file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="NAME=URL")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ban-ids", default="0,2")
    ap.add_argument("--out", required=True, help="append this server's rows (JSON lines)")
    a = ap.parse_args()
    bench_serve.BAN.update({i.strip(): -100 for i in a.ban_ids.split(",") if i.strip()})
    name, base = a.server.split("=", 1)
    counts = [int(x) for x in a.clients.split(",")]
    rows = sweep(name, base, counts, a.max_tokens, a.rounds)
    with open(a.out, "a") as f:
        f.write(json.dumps({"server": name, "rows": rows}) + "\n")


def table(path, baseline):
    runs = [json.loads(l) for l in open(path)]
    counts = [r["clients"] for r in runs[0]["rows"]]
    print("| server | " + " | ".join(f"{c} client{'s' if c > 1 else ''}: tok/s, TTFT p50/p95 (s)" for c in counts) + " |")
    print("|---|" + "---|" * len(counts))
    for run in runs:
        cells = [f"{r['agg_tps']:.1f}, {r['ttft_p50']:.2f}/{r['ttft_p95']:.2f}" for r in run["rows"]]
        print(f"| {run['server']} | " + " | ".join(cells) + " |")
    base = next((r for r in runs if r["server"] == baseline), None)
    if base:
        one = base["rows"][0]["agg_tps"]
        print(f"\n{baseline}: aggregate at {counts[-1]} clients / at 1 client = "
              + ", ".join(f"{r['clients']}: {r['agg_tps'] / one:.2f}x" for r in base["rows"]))
        for run in runs:
            if run is base:
                continue
            ratios = [b["agg_tps"] / o["agg_tps"] for b, o in zip(base["rows"], run["rows"]) if o["agg_tps"] > 0]
            print(f"{baseline} / {run['server']}: " + ", ".join(f"{x:.2f}x" for x in ratios))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        main()
