"""Runs several `mlx_lm.convert` conversions in one process (one import of
mlx-lm and transformers instead of one per case), for the convert tests.

Usage: python convert_cases.py CASES.json
CASES.json is a list of {"hf_path": ..., "mlx_path": ..., "args": {...}}
where args are keyword arguments of mlx_lm.convert.convert (quantize,
q_bits, q_group_size, q_mode, quant_predicate, dtype, dequantize).
"""

import json
import sys

from mlx_lm.convert import convert


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        convert(case["hf_path"], case["mlx_path"], **case.get("args", {}))
        print("converted", case["mlx_path"], flush=True)


if __name__ == "__main__":
    main()
