#!/usr/bin/env python3
"""Writes the parity goldens: what mlx-lm does on a model, for mlx-bun to match.

Run with the oracle interpreter (scripts/oracle/setup.sh prints its path):

    "$(scripts/oracle/setup.sh)" scripts/oracle/make_goldens.py --model DIR --out goldens/

It writes three JSON files into --out:
  generate.json  prompts (raw text, chat, system+user, multi-turn, long, digits/
                 unicode/code): rendered chat text, prompt ids, greedy continuation
  tokenize.json  strings and their token ids (and the decoded text)
  logits.json    last-position logits of one prompt's prefill (top-20 and stats)
Each file carries the oracle's versions and the model's fingerprint.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm import load, stream_generate  # noqa: E402

LONG_TEXT = (
    "The printing press changed how knowledge moved through Europe. Before it, "
    "books were copied by hand, usually in monasteries, and a single volume could "
    "take a scribe many months. Around 1440, Johannes Gutenberg combined several "
    "existing ideas into one practical system: movable metal type cast from a hand "
    "mould, an oil-based ink that stuck to metal, and a screw press adapted from the "
    "presses used to make wine and paper. His workshop in Mainz printed the famous "
    "Bible of 42 lines around 1455, and within fifty years printing shops had opened "
    "in more than two hundred cities. Prices of books fell sharply, and pamphlets, "
    "calendars, maps and news sheets reached people who had never owned a book. "
    "Scholars could now compare identical copies of a text, which made it easier to "
    "correct errors and to build on each other's work. Governments and churches "
    "quickly saw both the promise and the danger of the new machine, and many of "
    "them tried to license printers or to ban certain titles. Literacy rose slowly "
    "at first and then faster, as schools used printed primers and grammars. "
    "Historians still debate how much the press caused the Reformation, the "
    "Scientific Revolution and the rise of national languages, but few doubt that "
    "it made each of them spread further and faster than before.\n\n"
    "Summarize the text above in one sentence."
)

# Each case is one prompt as a user gives it to `mlx_lm generate` (or the chat API).
CASES = [
    {"name": "raw_text", "text": "The three primary colors are", "chat": False},
    {"name": "chat", "text": "What is the capital of France?", "chat": True},
    {
        "name": "system_user",
        "system": "You are a terse assistant. Answer in one short sentence.",
        "text": "Why is the sky blue?",
        "chat": True,
    },
    {
        "name": "multi_turn",
        "messages": [
            {"role": "user", "content": "Hi! My name is Ada and I like chess."},
            {"role": "assistant", "content": "Nice to meet you, Ada! Chess is a great game."},
            {"role": "user", "content": "What is my name, and what game do I like?"},
        ],
    },
    {"name": "long", "text": LONG_TEXT, "chat": True},
    {
        "name": "digits_unicode_code",
        "text": (
            "# 2**10 = 1024, 3.14159, 1,000,000\n"
            "# café naïve Größe 日本語 😀 →\n"
            "def fibonacci(n: int) -> int:\n"
            '    """Return the n-th Fibonacci number."""\n'
        ),
        "chat": False,
    },
]

# Whose logits are recorded, and how many top entries.
LOGITS_CASE = "chat"
TOP_K = 20
# Fixed vocabulary entries whose logits are recorded too (spread over the vocabulary).
PROBE_IDS = [0, 1, 2, 17, 100, 1000, 4096, 12345, 30000, 49151]

TOKENIZE_STRINGS = [
    "Hello world",
    " leading space and trailing space ",
    "Hello, world! How are you?",
    "1234567890 and 3.14 and 1,000,000",
    "naïve café, Größe, façade",
    "日本語のテキスト",
    "emoji: 😀🚀👍🏽",
    "tabs\tand\nnew\n\nlines\r\n",
    "    indented code:\n        return x ** 2",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> special in the middle <|im_end|>",
    "fn main() { println!(\"{}\", 42); }",
    "URL https://example.org/a?b=c&d=e#f",
    "multiple     spaces   here",
    "a",
    "",
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_fingerprint(model_dir: Path) -> dict:
    weights = sorted(model_dir.glob("*.safetensors"))
    return {
        "dir_name": model_dir.name,
        "config_sha256": sha256_file(model_dir / "config.json"),
        "weights_sha256": {w.name: sha256_file(w) for w in weights},
    }


def blas_libraries() -> list[str]:
    """The BLAS libraries loaded into this process (Linux), which decide the
    float32 matmul summation order: the mlx-cpu wheel bundles reference BLAS."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    names = {Path(line.split()[-1]).name for line in maps.splitlines() if "/" in line}
    # numpy's own OpenBLAS has prefixed symbols that MLX never calls.
    return sorted(n for n in names if "blas" in n.lower() and "scipy_openblas" not in n)


def meta(model_dir: Path) -> dict:
    import tokenizers
    import transformers

    return {
        "generator": "scripts/oracle/make_goldens.py",
        "versions": {
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "blas": blas_libraries(),
        "model": model_fingerprint(model_dir),
    }


def render(tokenizer, case: dict) -> tuple[str, list[int]]:
    """The prompt text and ids, exactly as `mlx_lm generate` builds them."""
    if "messages" in case:
        messages = case["messages"]
    elif case["chat"] and tokenizer.has_chat_template:
        messages = []
        if case.get("system") is not None:
            messages.append({"role": "system", "content": case["system"]})
        messages.append({"role": "user", "content": case["text"]})
    else:
        text = case["text"]
        return text, tokenizer.encode(text, add_special_tokens=True)
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return text, tokenizer.encode(text, add_special_tokens=False)


def greedy(model, tokenizer, prompt_ids: list[int], max_tokens: int) -> dict:
    """The greedy continuation as stream_generate yields it (eos not included).

    `text` is mlx-lm's streamed text, whose detokenizer drops a leading space of
    the first generated token; `decoded` is the tokenizer's plain decode of the ids.
    """
    ids, text, finish = [], "", None
    for response in stream_generate(
        model, tokenizer, mx.array(prompt_ids), max_tokens=max_tokens
    ):
        text += response.text
        finish = response.finish_reason
        if finish != "stop":
            ids.append(int(response.token))
    decoded = tokenizer.decode(ids)
    return {"ids": ids, "text": text, "decoded": decoded, "finish_reason": finish}


def case_input(case: dict) -> dict:
    if "messages" in case:
        return {"messages": case["messages"]}
    out = {"text": case["text"], "chat": case["chat"]}
    if case.get("system") is not None:
        out["system"] = case["system"]
    return out


def generate_goldens(model, tokenizer, max_tokens: int) -> list[dict]:
    cases = []
    for case in CASES:
        rendered, prompt_ids = render(tokenizer, case)
        out = greedy(model, tokenizer, prompt_ids, max_tokens)
        print(
            f"{case['name']}: {len(prompt_ids)} prompt tokens, "
            f"{len(out['ids'])} generated ({out['finish_reason']}): {out['text']!r}",
            file=sys.stderr,
        )
        cases.append(
            {
                "name": case["name"],
                "input": case_input(case),
                "rendered": rendered,
                "prompt_ids": prompt_ids,
                "continuation_ids": out["ids"],
                "continuation_text": out["text"],
                "continuation_decoded": out["decoded"],
                "finish_reason": out["finish_reason"],
            }
        )
    return cases


def logits_golden(model, tokenizer) -> dict:
    case = next(c for c in CASES if c["name"] == LOGITS_CASE)
    _, prompt_ids = render(tokenizer, case)
    # One forward pass over the whole prompt with a fresh cache, as a prefill.
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt_ids)[None], cache=cache)[0, -1].astype(mx.float32)
    order = mx.argsort(-logits)[:TOP_K]
    mx.eval(logits, order)
    top_ids = [int(i) for i in order.tolist()]
    values = logits.tolist()
    return {
        "case": LOGITS_CASE,
        "prompt_ids": prompt_ids,
        "how": "model(prompt[None]) with a fresh KV cache; logits[0, -1] in float32",
        "vocab": len(values),
        "top_ids": top_ids,
        "top_values": [values[i] for i in top_ids],
        "probe_ids": PROBE_IDS,
        "probe_values": [values[i] for i in PROBE_IDS],
        "stats": {
            "mean": mx.mean(logits).item(),
            "std": mx.std(logits).item(),
            "min": mx.min(logits).item(),
            "max": mx.max(logits).item(),
            "logsumexp": mx.logsumexp(logits).item(),
        },
    }


def tokenize_goldens(tokenizer) -> list[dict]:
    cases = []
    for text in TOKENIZE_STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        cases.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids)})
    return cases


def write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="mlx-lm model directory")
    parser.add_argument("--out", required=True, type=Path, help="goldens directory")
    parser.add_argument("--max-tokens", type=int, default=40)
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        parser.error(f"{args.model} is not a model directory (no config.json)")
    args.out.mkdir(parents=True, exist_ok=True)

    model, tokenizer = load(str(args.model))
    info = meta(args.model.resolve())
    write(args.out / "tokenize.json", {"meta": info, "cases": tokenize_goldens(tokenizer)})
    write(args.out / "logits.json", {"meta": info, **logits_golden(model, tokenizer)})
    write(
        args.out / "generate.json",
        {
            "meta": info,
            "max_tokens": args.max_tokens,
            "sampling": "greedy (argmax), mlx_lm.stream_generate defaults",
            "cases": generate_goldens(model, tokenizer, args.max_tokens),
        },
    )


if __name__ == "__main__":
    main()
