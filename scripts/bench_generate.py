#!/usr/bin/env python3
"""Runs `mlx_lm generate` and `mlx-bun generate` alternately on one model and
prompt, parses their --verbose statistics and prints medians and ratios.

Called by scripts/bench-generate.sh, which finds the interpreters and paths.
Only the standard library is used.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

STAT_PATTERNS = {
    "prompt_tokens": r"Prompt: (\d+) tokens",
    "prompt_tps": r"Prompt: \d+ tokens, ([\d.]+) tokens-per-sec",
    "gen_tokens": r"Generation: (\d+) tokens",
    "gen_tps": r"Generation: \d+ tokens, ([\d.]+) tokens-per-sec",
    "peak_gb": r"Peak memory: ([\d.]+) GB",
}


def parse_stats(output: str) -> dict:
    stats = {}
    for key, pattern in STAT_PATTERNS.items():
        matches = re.findall(pattern, output)
        if not matches:
            raise ValueError(f"no {key!r} in the output:\n{output[-2000:]}")
        stats[key] = float(matches[-1])
    return stats


def run_once(name: str, argv: list, env: dict) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}): {' '.join(argv)}\n{output[-2000:]}")
    stats = parse_stats(output)
    stats["wall_s"] = wall
    return stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--oracle-python", required=True)
    p.add_argument("--binary", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--also", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
        help="an extra mlx-bun run with these environment settings (repeatable)",
    )
    args = p.parse_args()

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    commands = {
        "mlx-lm": [
            args.oracle_python, "-m", "mlx_lm", "generate",
            "--model", args.model, "--prompt", args.prompt,
            "--max-tokens", str(args.max_tokens), "--verbose", "True",
        ],
        "mlx-bun": [
            args.binary, "generate",
            "--model", args.model, "--prompt", args.prompt,
            "--max-tokens", str(args.max_tokens), "--verbose",
        ],
    }
    envs = {name: env for name in commands}
    for extra in args.also:
        name, _, settings = extra.partition(":")
        pairs = [kv.split("=", 1) for kv in settings.split(",") if kv]
        if not name or any(len(kv) != 2 for kv in pairs):
            sys.exit(f"--also {extra!r}: expected NAME:VAR=VALUE[,VAR=VALUE]")
        commands[name] = commands["mlx-bun"]
        envs[name] = dict(env, **dict(pairs))
    results = {name: [] for name in commands}
    for run in range(1, args.runs + 1):
        for name, argv in commands.items():  # A B A B: drift hits both sides alike
            stats = run_once(name, argv, envs[name])
            results[name].append(stats)
            print(
                f"run {run} {name:8s} prompt {stats['prompt_tps']:7.2f} tok/s  "
                f"decode {stats['gen_tps']:7.2f} tok/s  peak {stats['peak_gb']:.3f} GB  "
                f"({stats['prompt_tokens']:.0f} + {stats['gen_tokens']:.0f} tokens, "
                f"wall {stats['wall_s']:.1f} s)",
                flush=True,
            )

    def median(name, key):
        return statistics.median(s[key] for s in results[name])

    rows = [
        ("prompt tok/s", "prompt_tps", "{:.2f}"),
        ("decode tok/s", "gen_tps", "{:.2f}"),
        ("peak memory GB", "peak_gb", "{:.3f}"),
        ("wall s (load + run)", "wall_s", "{:.1f}"),
    ]
    print()
    print(f"medians of {args.runs} runs, {args.max_tokens} max tokens")
    ours = [name for name in commands if name != "mlx-lm"]
    print("| metric | mlx-lm | " + " | ".join(ours) + " | "
          + " | ".join(f"{n} / mlx-lm" for n in ours) + " |")
    print("|---" * (1 + 2 * len(ours) + 1) + "|")
    for label, key, fmt in rows:
        a = median("mlx-lm", key)
        values = [median(n, key) for n in ours]
        ratios = [f"{b / a:.2f}" if a else "n/a" for b in values]
        print(f"| {label} | {fmt.format(a)} | " + " | ".join(fmt.format(b) for b in values)
              + " | " + " | ".join(ratios) + " |")
    tokens = {name: {s["gen_tokens"] for s in results[name]} for name in results}
    if len({frozenset(t) for t in tokens.values()}) > 1:
        print(f"note: generated token counts differ: {tokens}")


if __name__ == "__main__":
    main()
