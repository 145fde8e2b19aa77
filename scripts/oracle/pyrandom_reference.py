"""`random.Random(seed).sample(range(n), k)` sequences, for tests/eval_data.rs
(src/eval/pyrandom.rs must give the same indices).

Input (argv[1]): JSON list of {"seed": s, "draws": [[n, k], ...]}; the draws
of one entry run on one generator, one after another. Prints JSON: per
entry, the list of samples; plus, per entry, getrandbits(40) and
getrandbits(64) taken after its draws.
"""

import json
import random
import sys


def main():
    cases = json.loads(sys.argv[1])
    out = []
    for case in cases:
        rnd = random.Random(case["seed"])
        samples = [rnd.sample(range(n), k) for n, k in case["draws"]]
        bits = [rnd.getrandbits(40), rnd.getrandbits(64)]
        out.append({"samples": samples, "bits": bits})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
