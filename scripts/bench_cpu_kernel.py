#!/usr/bin/env python3
"""CPU decode and prompt speed of mlx-bun, mlx-lm and llama.cpp on the
default model, run alternately (A B C A B C), with medians and ratios.

Called by scripts/bench-cpu-kernel.sh, which finds the interpreters, the
model and the GGUF. Only the standard library is used here; the llama.cpp
runs execute this same file under the llama-cpp-python venv (`--llama-child`).
"""

import argparse
import json
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
}


def parse_stats(output: str) -> dict:
    stats = {}
    for key, pattern in STAT_PATTERNS.items():
        matches = re.findall(pattern, output)
        if not matches:
            raise ValueError(f"no {key!r} in the output:\n{output[-2000:]}")
        stats[key] = float(matches[-1])
    return stats


def llama_child(args) -> None:
    """Greedy decode in llama.cpp, timed like mlx-lm's generate: prompt
    tok/s over the prompt's evaluation, decode tok/s over the tokens after
    the first."""
    import llama_cpp  # only in the llama-cpp-python venv

    llm = llama_cpp.Llama(
        model_path=args.gguf,
        n_ctx=2048,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=0,
        verbose=False,
    )
    text = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\n"
        + args.prompt
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
    eos = llm.token_eos()
    started = time.perf_counter()
    llm.eval(tokens)
    first = _argmax(llm)
    prompt_s = time.perf_counter() - started
    generated = [first]
    started = time.perf_counter()
    while len(generated) < args.max_tokens and generated[-1] != eos:
        llm.eval([generated[-1]])
        generated.append(_argmax(llm))
    decode_s = time.perf_counter() - started
    print(f"Prompt: {len(tokens)} tokens, {len(tokens) / prompt_s:.3f} tokens-per-sec")
    decoded = max(len(generated) - 1, 1)
    print(f"Generation: {len(generated)} tokens, {decoded / decode_s:.3f} tokens-per-sec")


def _argmax(llm) -> int:
    import numpy as np

    return int(np.argmax(llm.scores[llm.n_tokens - 1]))


def run_once(name: str, argv: list, env: dict) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}): {' '.join(argv)}\n{output[-2000:]}")
    return parse_stats(output)


def bench_forward(binary: str, model: str, env: dict, kernel: str) -> dict:
    """ms per forward pass of L = 1 and 4 new tokens (4 rows per matmul)."""
    argv = [
        binary, "bench", "forward", "--model", model,
        "--lengths", "1,4", "--runs", "9", "--json",
    ]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=dict(env, MLX_BUN_CPU_KERNEL=kernel)
    )
    if proc.returncode != 0:
        sys.exit(f"bench forward failed: {proc.stdout}{proc.stderr}"[-2000:])
    rows = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return {r["tokens"]: r["ms_per_forward"] for r in rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model")
    p.add_argument("--gguf", required=True)
    p.add_argument("--oracle-python")
    p.add_argument("--llama-python")
    p.add_argument("--binary")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", required=True)
    args = p.parse_args()
    if args.llama_child:
        llama_child(args)
        return

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
        "llama.cpp": [
            args.llama_python, os.path.abspath(__file__), "--llama-child",
            "--gguf", args.gguf, "--prompt", args.prompt,
            "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
        ],
    }
    results = {name: [] for name in commands}
    for run in range(1, args.runs + 1):
        for name, argv in commands.items():  # A B C A B C: drift hits all alike
            stats = run_once(name, argv, env)
            results[name].append(stats)
            print(
                f"run {run} {name:9s} prompt {stats['prompt_tps']:7.2f} tok/s  "
                f"decode {stats['gen_tps']:7.2f} tok/s  "
                f"({stats['prompt_tokens']:.0f} + {stats['gen_tokens']:.0f} tokens)",
                flush=True,
            )

    def median(name, key):
        return statistics.median(s[key] for s in results[name])

    print()
    print(f"medians of {args.runs} runs, {args.max_tokens} max tokens, greedy")
    print("| metric | mlx-lm | llama.cpp | mlx-bun | mlx-bun / mlx-lm | mlx-bun / llama.cpp |")
    print("|---|---|---|---|---|---|")
    for label, key in [("prompt tok/s", "prompt_tps"), ("decode tok/s", "gen_tps")]:
        a, l, b = (median(n, key) for n in ("mlx-lm", "llama.cpp", "mlx-bun"))
        print(f"| {label} | {a:.2f} | {l:.2f} | {b:.2f} | {b / a:.2f} | {b / l:.2f} |")

    print()
    print("forward pass of the default model, 64 tokens of context (ms, median of 9)")
    print("| kernel | 1 token | 4 tokens | 4-row aggregate / 1-row |")
    print("|---|---|---|---|")
    for label, kernel in [("mlx-bun kernel", "1"), ("MLX kernel", "0")]:
        ms = bench_forward(args.binary, args.model, env, kernel)
        print(f"| {label} | {ms[1]:.2f} | {ms[4]:.2f} | {4 * ms[1] / ms[4]:.2f} |")


if __name__ == "__main__":
    main()
