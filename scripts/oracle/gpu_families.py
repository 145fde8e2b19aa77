#!/usr/bin/env python3
"""The 2026 families in a published dtype on one device: mlx-lm and mlx-bun
on the same tiny checkpoints, cast to bfloat16 (or float16), same MLX.

For every case (a folder of goldens/arch/, made by mlx-lm's own classes) it
writes a copy whose floating tensors are cast to --dtype (quantized layers
keep their packed weights; their scales and biases are cast), adds a
256-word WordLevel tokenizer ("t0" ... "t255") and drops the end-of-text ids
so neither side stops early. Then it compares greedy token ids:

  serial  mlx-lm's `generate_step` against `mlx-bun generate --batch-file`
          with one row at a time (--decode-concurrency 1)
  batch   mlx-lm's `BatchGenerator`, four prompts of uneven lengths inserted
          together, against the same batch file with --decode-concurrency 4

Nemotron-H's batch reference is its serial tokens: mlx-lm's batched Mamba-2
scan is not given the rows' lengths (make_batch_hybrid_goldens.py says why).
On a GPU mlx-bun computes in the weights' dtype, as mlx-lm does; on the CPU
pass --ours-flag=--compute-dtype=model for the same computation.

    python scripts/oracle/gpu_families.py --bin target/gpu-bundle/run.sh \
        --work /tmp/families --out report.json qwen3_5 lfm2 ...
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

from make_batch_goldens import run  # noqa: E402
from make_batch_sliding_goldens import serial  # noqa: E402

ARCH = HERE.parent.parent / "goldens" / "arch"
PROMPTS = [
    [1, 17, 42, 99, 3, 250, 7, 7, 128],
    [64, 5, 200, 9, 11, 31, 4, 77, 160, 2, 90, 13, 54, 201],
    [8, 16, 32, 64, 128, 255, 1],
    [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100],
]
SERIAL_BATCH_REFERENCE = {"nemotron_h", "nemotron_h_q4"}


def adapt_config(cfg):
    """No end-of-text ids; published soft caps (the tiny checkpoints' cap of
    3.0 squeezes bf16 logits into a few values, so most of them tie)."""
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        cfg.pop(key, None)
    if cfg.get("final_logit_softcapping"):
        cfg["final_logit_softcapping"] = max(cfg["final_logit_softcapping"], 30.0)
    for sub in cfg.values():
        if isinstance(sub, dict):
            adapt_config(sub)


def cast_copy(case, work, dtype):
    src, dst = ARCH / case, work / f"{case}-{dtype}"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    adapt_config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    target = getattr(mx, dtype)
    weights = {
        k: v.astype(target) if mx.issubdtype(v.dtype, mx.floating) else v
        for k, v in mx.load(str(src / "model.safetensors")).items()
    }
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})
    vocab = {f"t{i}": i for i in range(256)}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }
    (dst / "tokenizer.json").write_text(json.dumps(tokenizer))
    (dst / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return dst


def ours(binary, model_dir, rows, max_tokens, extra):
    batch = model_dir / "prompts.jsonl"
    batch.write_text("".join(
        json.dumps({"prompt": " ".join(f"t{t}" for t in p)}) + "\n" for p in PROMPTS))
    res = subprocess.run(
        [binary, "generate", "--model", str(model_dir), "--batch-file", str(batch),
         "--ignore-chat-template", "-n", str(max_tokens), "--temp", "0",
         "--decode-concurrency", str(rows), "--prompt-concurrency", str(rows), "--json", *extra],
        capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr else "failed")
    return [json.loads(line)["token_ids"] for line in res.stdout.strip().splitlines()]


def divergence(model, prompt, want, got):
    """Where `got` first leaves `want`: mlx-lm's logits there (one forward
    over the prompt and the agreed tokens) for its token and ours, and the
    gap in units of bf16's spacing at mlx-lm's top logit. A gap of a unit or
    two is a near tie that the order of a sum decides."""
    step = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if step is None:
        return None
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt + want[:step]]), cache=cache)[0, -1].astype(mx.float32)
    theirs, mine = logits[want[step]].item(), logits[got[step]].item()
    found = {"step": step, "mlx_lm_token": want[step], "mlx_bun_token": got[step],
             "mlx_lm_logit": theirs, "mlx_bun_token_logit": mine,
             "gap_bf16_units": float("nan"), "mlx_bun_token_rank": -1}
    if math.isfinite(theirs) and math.isfinite(mine):
        spacing = 2.0 ** (math.floor(math.log2(max(abs(theirs), 1e-30))) - 7)
        found["gap_bf16_units"] = (theirs - mine) / spacing
        found["mlx_bun_token_rank"] = int((logits > mine).sum().item())
    return found


def divergences(model, want_rows, got_rows):
    found = []
    for row, (prompt, want, got) in enumerate(zip(PROMPTS, want_rows, got_rows)):
        d = divergence(model, prompt, want, got)
        if d is not None:
            found.append({"row": row, **d})
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--ours-flag", action="append", default=[])
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    work = Path(a.work)
    report, failed = {}, 0
    for case in a.cases:
        entry = {}
        try:
            model_dir = cast_copy(case, work, a.dtype)
            model, _ = load_model(model_dir)
            want_serial = [serial(model, p, a.max_tokens) for p in PROMPTS]
            got_serial = ours(a.bin, model_dir, 1, a.max_tokens, a.ours_flag)
            got_batch = ours(a.bin, model_dir, 4, a.max_tokens, a.ours_flag)
            entry = {"serial_equal": got_serial == want_serial,
                     "mlx_lm_serial": want_serial, "mlx_bun_serial": got_serial,
                     "mlx_bun_batch": got_batch}
            if case in SERIAL_BATCH_REFERENCE:
                want_batch = want_serial
            else:
                try:
                    out, _ = run(model, None, PROMPTS, [0, 1, 2, 3], [], a.max_tokens, 0, [])
                    want_batch = [out[i] for i in range(len(PROMPTS))]
                except Exception as e:  # mlx-lm's batch fails: ours must equal serial
                    entry["mlx_lm_batch_error"] = str(e).splitlines()[0]
                    want_batch = want_serial
            entry["mlx_lm_batch"] = want_batch
            entry["batch_equal"] = got_batch == want_batch
            entry["serial_divergences"] = divergences(model, want_serial, got_serial)
            entry["batch_divergences"] = divergences(model, want_batch, got_batch)
            ok = entry["serial_equal"] and entry["batch_equal"] and all(want_serial)
        except Exception as e:  # one case's failure is reported, the rest still run
            entry = {"error": str(e)}
            ok = False
        failed += not ok
        report[case] = entry
        state = "error: " + entry["error"] if "error" in entry else (
            f"serial {'EQUAL' if entry['serial_equal'] else 'DIFFERENT'}, "
            f"batch {'EQUAL' if entry['batch_equal'] else 'DIFFERENT'}"
            + (f" (mlx-lm's batch failed: {entry['mlx_lm_batch_error']}; against its serial)"
               if "mlx_lm_batch_error" in entry else ""))
        for mode in ("serial", "batch"):
            for d in entry.get(f"{mode}_divergences", []):
                state += (f"\n  {mode} row {d['row']} step {d['step']}: mlx-lm {d['mlx_lm_token']}"
                          f" ({d['mlx_lm_logit']:.4f}), mlx-bun {d['mlx_bun_token']}"
                          f" ({d['mlx_bun_token_logit']:.4f}, rank {d['mlx_bun_token_rank']}),"
                          f" gap {d['gap_bf16_units']:.2f} bf16 units")
        print(f"{case} ({a.dtype}): {state}", flush=True)
    meta = {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "device": str(mx.default_device()),
            "dtype": a.dtype, "max_tokens": a.max_tokens, "prompt_ids": PROMPTS}
    Path(a.out).write_text(json.dumps({"meta": meta, "cases": report}, indent=1) + "\n")
    print(f"{len(a.cases) - failed}/{len(a.cases)} cases token-identical "
          f"(mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, {mx.default_device()})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
