#!/usr/bin/env python3
"""Counts the random draws mlx-lm makes while it loads each model directory:
seeds, loads (the layers initialise themselves from the global key stream
before the weights replace them), then counts how many splits of key(seed)
the stream has advanced by.

Usage: init_draws.py DIR [DIR ...]   prints {"DIR": draws, ...} as JSON
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
from pathlib import Path  # noqa: E402

from mlx_lm.utils import load_model  # noqa: E402

LIMIT = 100_000


def draws(path: str) -> int:
    mx.random.seed(0)
    load_model(Path(path), lazy=True)
    state = mx.random.state[0]
    key = mx.random.key(0)
    for n in range(LIMIT):
        if mx.array_equal(key, state).item():
            return n
        key, _ = mx.random.split(key)
    raise RuntimeError(f"{path}: more than {LIMIT} draws")


def main() -> int:
    print(json.dumps({path: draws(path) for path in sys.argv[1:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
