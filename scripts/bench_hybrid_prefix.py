"""Second-turn time to first token on a hybrid model, mlx-bun's server and
mlx-lm's side by side (run by scripts/bench-hybrid-prefix.sh; standard
library only).

Each round opens a new conversation on each server (servers alternate
which goes first): turn 1 is a long user message (about WORDS words, new
text every round), turn 2 sends the reply back with a short question.
TTFT is measured from the client (request sent -> first streamed content).
Prints a Markdown table with medians and ranges, and writes JSON if asked.
"""

import argparse
import http.client
import json
import random
import statistics
import time
import urllib.parse

WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city community "
    "name president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education"
).split()


def stream_chat(base, messages, max_tokens):
    """One streaming chat request: (ttft_s, reply text, cached prompt tokens)."""
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=1200)
    body = json.dumps(
        {
            "model": "default_model",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{base}: HTTP {resp.status}: {resp.read()[:300]!r}")
    first = None
    text = []
    cached = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        usage = chunk.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if "cached_tokens" in details:
            cached = details["cached_tokens"]
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                first = first or time.perf_counter()
                text.append(piece)
    end = time.perf_counter()
    conn.close()
    return (first or end) - start, "".join(text), cached


def conversation(base, first_message, max_tokens):
    messages = [{"role": "user", "content": first_message}]
    ttft1, reply, cached1 = stream_chat(base, messages, max_tokens)
    messages += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Summarize that in one line."},
    ]
    ttft2, _, cached2 = stream_chat(base, messages, max_tokens)
    return {"ttft1": ttft1, "ttft2": ttft2, "cached1": cached1, "cached2": cached2}


def spread(xs):
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", required=True, help="NAME=URL")
    ap.add_argument("--words", type=int, default=1900)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    servers = [s.split("=", 1) for s in a.server]
    rows = {name: [] for name, _ in servers}
    rng = random.Random(5)
    # Warm-up: a short conversation on each server.
    for _, base in servers:
        conversation(base, "Hello, how are you?", 4)
    for r in range(a.rounds):
        text = " ".join(rng.choice(WORDS) for _ in range(a.words))
        order = servers if r % 2 == 0 else servers[::-1]
        for name, base in order:
            result = conversation(base, f"Round {r}. {text}\nWhat is this about?", a.max_tokens)
            rows[name].append(result)
            print(f"round {r} {name}: {result}", flush=True)
    print()
    print("| server | TTFT turn 1 (s) | TTFT turn 2 (s) | turn 2 / turn 1 | cached tokens turn 2 |")
    print("|---|---|---|---|---|")
    summary = {}
    for name, _ in servers:
        rs = rows[name]
        t1 = [x["ttft1"] for x in rs]
        t2 = [x["ttft2"] for x in rs]
        ratio = [x["ttft2"] / x["ttft1"] for x in rs]
        cached = [x["cached2"] for x in rs]
        summary[name] = {"rounds": rs, "ratio_median": statistics.median(ratio)}
        print(f"| {name} | {spread(t1)} | {spread(t2)} | {spread(ratio)} | {cached} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"words": a.words, "rounds": a.rounds, "servers": summary}, f, indent=2)


if __name__ == "__main__":
    main()
