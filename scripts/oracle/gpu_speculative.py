"""Speculative decoding on a GPU: mlx-lm's `stream_generate` with a draft
model against `mlx-bun generate --draft-model`, same model as its own draft,
same number of drafted tokens, greedy: the token ids must be equal (both
verify the same drafts with the same batched forward). Also reports whether
each equals its own plain greedy run (in bf16 a batched verify forward can
round differently from one-token steps).

    python gpu_speculative.py --bin run.sh --model DIR [--num-draft 3]
"""

import argparse
import json
import subprocess
import sys
import tempfile

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

MESSAGES = [{"role": "user", "content": "Explain in detail how a bicycle works."}]


def theirs(model, tok, ids, n, draft):
    out = []
    kw = dict(draft_model=model, num_draft_tokens=draft) if draft else {}
    for r in stream_generate(model, tok, mx.array(ids), max_tokens=n, sampler=make_sampler(temp=0.0), **kw):
        if r.finish_reason is not None and r.token in tok.eos_token_ids:
            break
        out.append(r.token)
    return out


def ours(binary, model_dir, n, draft):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(MESSAGES, f)
    cmd = [binary, "generate", "--model", model_dir, "--messages-file", f.name, "-n", str(n), "--json"]
    if draft:
        cmd += ["--draft-model", model_dir, "--num-draft-tokens", str(draft)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["token_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-draft", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    model, tok = load(a.model)
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    spec_theirs = theirs(model, tok, ids, a.max_tokens, a.num_draft)
    plain_theirs = theirs(model, tok, ids, a.max_tokens, 0)
    spec_ours = ours(a.bin, a.model, a.max_tokens, a.num_draft)
    plain_ours = ours(a.bin, a.model, a.max_tokens, 0)
    equal = bool(spec_theirs) and spec_ours == spec_theirs
    print(f"  speculative (self-draft, k={a.num_draft}) equals mlx-lm's speculative: {equal} "
          f"({len(spec_ours)} tokens); plain equal to speculative: mlx-lm {plain_theirs == spec_theirs}, "
          f"mlx-bun {plain_ours == spec_ours}; plain equal to mlx-lm's plain: {plain_ours == plain_theirs}")
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
