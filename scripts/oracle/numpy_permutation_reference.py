"""`np.random.seed(s); np.random.permutation(n)` for tests/eval_data.rs
(the document order of `mlx_lm.perplexity`'s `load_data`;
src/eval/pyrandom.rs must give the same order).

Input (argv[1]): JSON list of [seed, n]. Prints JSON: one permutation each.
"""

import json
import sys

import numpy as np


def main():
    out = []
    for seed, n in json.loads(sys.argv[1]):
        np.random.seed(seed)
        out.append(np.random.permutation(n).tolist())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
