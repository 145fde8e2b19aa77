"""Few-shot example rows as lm-evaluation-harness picks them, for
tests/eval_data.rs.

The harness (lm_eval/api/samplers.py, lm_eval/api/task.py) gives each task a
sampler holding `random.Random(fewshot_random_seed)`; `mlx_lm.evaluate` sets
that seed to its `--seed`. For every evaluated document, in order, the
default sampler draws `rnd.sample(fewshot_docs, k + 1)` when the few-shot
pool is the evaluated split, drops every drawn document equal to the
evaluated one and keeps the first k; the generator's state carries over from
document to document. MMLU's config uses the `first_n` sampler: the first k
documents of the pool (its subject's), minus the evaluated one.

Here the pool is the task file itself (mlx-bun reads one file per task).
Prints JSON: {"shots": [[row, ...] per evaluated row], "dropped_self": n},
rows 0-based in file order; `dropped_self` counts the draws that held the
evaluated document.

Usage: fewshot_reference.py --task T --file F.jsonl --num-shots K --seed S [--limit N]
"""

import argparse
import json
import random


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--task", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--num-shots", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--limit", type=int)
    a = p.parse_args()
    with open(a.file) as f:
        docs = [json.loads(line) for line in f if line.strip()]
    evaluated = docs if a.limit is None else docs[: a.limit]
    k = a.num_shots
    rnd = random.Random(a.seed)
    shots, dropped = [], 0
    for doc in evaluated:
        if a.task == "mmlu":
            same = [d for d in docs if d.get("subject") == doc.get("subject")]
            chosen = [d for d in same if d != doc][:k]
        else:
            drawn = rnd.sample(list(docs), k + 1)
            kept = [d for d in drawn if d != doc]
            dropped += len(kept) < len(drawn)
            chosen = kept[:k]
        assert len(chosen) == k, "not enough few-shot documents"
        # Map the drawn documents back to their rows by identity.
        ids = {id(d): i for i, d in enumerate(docs)}
        shots.append([ids[id(d)] for d in chosen])
    print(json.dumps({"shots": shots, "dropped_self": dropped}))


if __name__ == "__main__":
    main()
