"""Load generator for scripts/bench-serve.sh (standard library only).

Sends N concurrent streaming chat requests to each server, rounds
interleaved between servers, and measures from the client side:
TTFT (request sent -> first SSE chunk with content), per-stream decode
tok/s, aggregate tok/s, and TTFT of a repeated long prompt (cold, then a
prompt-cache hit). Prints a Markdown table and writes JSON if asked.
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse
import uuid

# Banned token ids (end-of-text markers), so every stream runs to max_tokens.
BAN = {}


def quantile(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    rank = max(1, min(len(s), int(-(-q * len(s) // 1))))
    return s[rank - 1]


def stream_chat(base, messages, max_tokens):
    """One streaming request; returns (ttft_s, decode_s, tokens, total_s)."""
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    body = json.dumps(
        {
            "model": "default_model",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logit_bias": BAN,
        }
    )
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{base}: HTTP {resp.status}: {resp.read()[:300]!r}")
    first = last = None
    chunks = 0
    usage_tokens = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage_tokens = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    end = time.perf_counter()
    conn.close()
    tokens = usage_tokens if usage_tokens is not None else chunks
    first = first or end
    last = last or end
    return first - start, last - first, tokens, end - start


def concurrent_round(base, clients, max_tokens, tag):
    results = [None] * clients
    errors = []

    def one(i):
        messages = [{"role": "user", "content": f"Request {tag}-{i}: describe a city you like."}]
        try:
            results[i] = stream_chat(base, messages, max_tokens)
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{base}: {errors[0]}")
    return results, wall


def long_prompt_ttft(base, words):
    """TTFT of a fresh long prompt, then of the same prompt again."""
    nonce = uuid.uuid4().hex[:8]
    text = " ".join(f"item{nonce}-{i}" if i % 17 == 0 else "the quick brown fox" for i in range(words))
    messages = [
        {"role": "system", "content": f"Session {nonce}. Summarize the user's text."},
        {"role": "user", "content": text},
    ]
    cold = stream_chat(base, messages, 4)[0]
    warm = stream_chat(base, messages, 4)[0]
    return cold, warm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", required=True, help="NAME=URL (repeat)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--long-words", type=int, default=30)
    ap.add_argument("--ban-ids", default="0,2", help="token ids to ban (default: SmolLM2's end tokens)")
    ap.add_argument("--json", help="write raw results here")
    args = ap.parse_args()
    BAN.update({i.strip(): -100 for i in args.ban_ids.split(",") if i.strip()})
    servers = [s.split("=", 1) for s in args.server]

    for name, base in servers:  # warm-up: first-use costs are not what we measure
        stream_chat(base, [{"role": "user", "content": "warm up"}], 2)

    stats = {name: {"ttft": [], "stream_tps": [], "agg_tps": []} for name, _ in servers}
    for r in range(args.rounds):
        order = servers if r % 2 == 0 else list(reversed(servers))
        for name, base in order:
            results, wall = concurrent_round(base, args.clients, args.max_tokens, f"{r}{name}")
            s = stats[name]
            s["ttft"] += [x[0] for x in results]
            s["stream_tps"] += [(x[2] - 1) / x[1] for x in results if x[2] > 1 and x[1] > 0]
            s["agg_tps"].append(sum(x[2] for x in results) / wall)

    cache = {}
    for name, base in servers:
        cache[name] = long_prompt_ttft(base, args.long_words)

    print(f"\n{args.clients} concurrent streaming clients, {args.max_tokens} tokens each, "
          f"{args.rounds} interleaved rounds; long prompt {args.long_words * 4} words\n")
    print("| server | TTFT p50 (s) | TTFT p95 (s) | per-stream decode tok/s (median) | aggregate tok/s (mean) | long prompt TTFT cold (s) | repeated (s) |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in servers:
        s = stats[name]
        cold, warm = cache[name]
        print(
            f"| {name} | {quantile(s['ttft'], 0.5):.2f} | {quantile(s['ttft'], 0.95):.2f} | "
            f"{statistics.median(s['stream_tps']) if s['stream_tps'] else float('nan'):.1f} | "
            f"{statistics.mean(s['agg_tps']):.1f} | {cold:.2f} | {warm:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stats": stats, "cache": cache, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
