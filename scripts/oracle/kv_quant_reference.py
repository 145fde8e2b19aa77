"""mlx-lm's quantized KV cache and quantized attention, driven as `generate_step`
drives them, on seeded inputs: the component-level reference for
`tests/kv_quant_parity.rs`.

Inputs (seeded numpy float32): one sequence, 4 query heads over 2 KV heads
(grouped-query folding), head_dim 128 (every group size divides it). A
prefill of 30 positions in two chunks (16 + 14, as `prefill_step_size=16`
would split it), then 48 single-token decode steps. Keys carry per-channel
scales (outlier channels, as real keys have) so the quantization is not
uniform across groups.

For every cell (dtype, bits, group size, quantized start): one `KVCache`;
per forward pass the model's order of calls: `create_attention_mask(h,
cache)` before the update, `cache.update_and_fetch(k, v)`, `base.
scaled_dot_product_attention(q, k, v, cache=cache, ...)` (which goes to
`quantized_scaled_dot_product_attention` once the cache has `bits`), then
`maybe_quantize_kv_cache` (converts once `offset >= start`) and `mx.eval`,
as `generate_step` does after each forward.

Cells: float32 over bits {2, 3, 4, 5, 6, 8} x group {32, 64, 128} x start
{0, 40} (0: converted after the first prefill chunk, so the second chunk
runs quantized with a causal mask; 40: converted mid-decode after the step
that reaches 40 positions); float16 and bfloat16 at group 64, every bits,
both starts.

Writes OUT.safetensors:
  q, k, v                               the inputs, float32, [1, H, 78, 128]
  {cell}/quantized                      int32 [forwards]: 1 where the pass ran on
                                        the quantized cache
  {cell}/out/{i}                        the attention output of pass i, float32
                                        (dense passes too; compare those loosely)
  {cell}/cache/{keys,values}/{0,1,2}    the final cache (packed, scales, biases),
                                        sliced to its offset
  {cell}/offset                         int32 scalar
with cell = "{dtype}_b{bits}_g{group}_s{start}". Metadata: versions, the
chunks and the cell list.

Usage: python kv_quant_reference.py OUT.safetensors
"""

import json
import sys

import mlx.core as mx
import numpy as np
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

import mlx_lm

B, HQ, HKV, D = 1, 4, 2, 128
CHUNKS = [16, 14]
STEPS = 48
FORWARDS = CHUNKS + [1] * STEPS
T = sum(FORWARDS)
BITS = [2, 3, 4, 5, 6, 8]
GROUPS = [32, 64, 128]
STARTS = [0, 40]
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def cells():
    out = []
    for bits in BITS:
        for g in GROUPS:
            for s in STARTS:
                out.append(("float32", bits, g, s))
    for dt in ["float16", "bfloat16"]:
        for bits in BITS:
            for s in STARTS:
                out.append((dt, bits, 64, s))
    return out


def cell_name(dt, bits, g, s):
    return f"{dt}_b{bits}_g{g}_s{s}"


def inputs():
    rng = np.random.default_rng(20240601)
    channel = np.exp(rng.standard_normal(D) * 0.7).astype(np.float32)
    q = rng.standard_normal((B, HQ, T, D)).astype(np.float32)
    k = (rng.standard_normal((B, HKV, T, D)) * channel).astype(np.float32)
    v = rng.standard_normal((B, HKV, T, D)).astype(np.float32)
    return q, k, v


def run_cell(q, k, v, dtype, bits, group, start):
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    scale = D**-0.5
    prompt_cache = [KVCache()]
    pos = 0
    flags, outs = [], []
    for n in FORWARDS:
        c = prompt_cache[0]
        h = mx.zeros((B, n, 1), dtype=dtype)
        mask = create_attention_mask(h, c)
        qs, ks, vs = (x[:, :, pos : pos + n] for x in (q, k, v))
        keys, values = c.update_and_fetch(ks, vs)
        out = scaled_dot_product_attention(
            qs, keys, values, cache=c, scale=scale, mask=mask
        )
        flags.append(1 if hasattr(c, "bits") else 0)
        outs.append(out.astype(mx.float32))
        maybe_quantize_kv_cache(prompt_cache, start, group, bits)
        mx.eval(outs[-1], [x.state for x in prompt_cache])
        pos += n
    c = prompt_cache[0]
    assert hasattr(c, "bits"), "the cache never converted"
    keys, values = c.keys_and_values()
    return flags, outs, keys, values, c.offset


def main():
    out_path = sys.argv[1]
    mx.set_default_device(mx.cpu)
    qn, kn, vn = inputs()
    q, k, v = mx.array(qn), mx.array(kn), mx.array(vn)
    tensors = {"q": q, "k": k, "v": v}
    names = []
    for dt, bits, g, s in cells():
        name = cell_name(dt, bits, g, s)
        names.append(name)
        flags, outs, keys, values, offset = run_cell(q, k, v, DTYPES[dt], bits, g, s)
        tensors[f"{name}/quantized"] = mx.array(flags, dtype=mx.int32)
        for i, o in enumerate(outs):
            tensors[f"{name}/out/{i}"] = o
        for which, triple in (("keys", keys), ("values", values)):
            for j, a in enumerate(triple):
                tensors[f"{name}/cache/{which}/{j}"] = a
        tensors[f"{name}/offset"] = mx.array(offset, dtype=mx.int32)
    meta = {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "chunks": json.dumps(CHUNKS),
        "steps": str(STEPS),
        "cells": json.dumps(names),
    }
    mx.save_safetensors(out_path, tensors, metadata=meta)


if __name__ == "__main__":
    main()
