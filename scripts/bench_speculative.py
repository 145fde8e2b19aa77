#!/usr/bin/env python3
"""Speculative decoding benchmark: acceptance and decode speed-up against the
same target without a draft, for n = 1..4, per draft source and workload.
Runs are interleaved (plain, then each drafter) so machine drift hits all.

    scripts/bench-speculative.sh [--target DIR] [--draft DIR] [--runs N] [--max-tokens N]
"""
import argparse
import json
import statistics
import subprocess
import tempfile

WORKLOADS = {
    "chat": "Explain how a bicycle works in a short paragraph.",
    "extraction": (
        "Extract the names from this text and list them exactly as written: Alice Johnson met "
        "Bob Smith and Carol White at the Springfield Library. Later, Alice Johnson and Carol "
        "White visited David Brown."
    ),
}


def run(binary, target, prompt, max_tokens, draft=None, k=None):
    cmd = [binary, "generate", "-m", target, "--prompt", prompt, "-n", str(max_tokens), "--json"]
    if draft:
        cmd += ["--draft-model", draft, "--num-draft-tokens", str(k)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/mlx-bun")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True, help="a draft model directory")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    a = ap.parse_args()

    print(f"| workload | draft | n | accepted/drafted | target calls | decode tok/s | speed-up |")
    print(f"|---|---|---|---|---|---|---|")
    for name, prompt in WORKLOADS.items():
        configs = [("ngram", k) for k in a.ks] + [(a.draft, k) for k in a.ks]
        samples = {c: [] for c in configs}
        base = []
        for _ in range(a.runs):
            base.append(run(a.binary, a.target, prompt, a.max_tokens)["generation_tps"])
            for draft, k in configs:
                samples[(draft, k)].append(run(a.binary, a.target, prompt, a.max_tokens, draft, k))
        base_tps = statistics.median(base)
        print(f"| {name} | none | - | - | - | {base_tps:.2f} | 1.00x |")
        for (draft, k), results in samples.items():
            tps = statistics.median(r["generation_tps"] for r in results)
            s = results[-1]["speculation"]
            label = "ngram" if draft == "ngram" else "model"
            print(
                f"| {name} | {label} | {k} | {s['accepted']}/{s['drafted']} | {s['target_calls']} "
                f"| {tps:.2f} | {tps / base_tps:.2f}x |"
            )


if __name__ == "__main__":
    main()
