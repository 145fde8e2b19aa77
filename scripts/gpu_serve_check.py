"""Checks a running `mlx-bun serve` on a GPU: first-request TTFT, a sampled
request (top-p, log-probabilities), and 8 concurrent streaming requests
through the batch lane. Prints one JSON object; exits 1 if a request failed.

    python3 scripts/gpu_serve_check.py http://127.0.0.1:PORT
"""

import json
import sys
import threading
import time
import urllib.request

BASE = sys.argv[1]


def post(body, stream):
    req = urllib.request.Request(
        BASE + "/v1/chat/completions",
        data=json.dumps(dict(body, stream=stream)).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    ttft = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=300) as resp:
        if not stream:
            data = json.loads(resp.read())
            return {"seconds": time.perf_counter() - start, "body": data}
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            if delta.get("content"):
                tokens += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
    return {"seconds": time.perf_counter() - start, "ttft": ttft, "chunks": tokens}


def chat(prompt, **kw):
    return dict({"messages": [{"role": "user", "content": prompt}], "max_tokens": 32}, **kw)


result = {"ok": True}
try:
    result["first_request"] = post(chat("Say hello.", temperature=0), stream=True)
    sampled = post(chat("Name a color.", temperature=0.7, top_p=0.9, logprobs=True, top_logprobs=2), stream=False)
    result["sampled"] = {
        "seconds": sampled["seconds"],
        "text": sampled["body"]["choices"][0]["message"]["content"],
        "has_logprobs": bool(sampled["body"]["choices"][0].get("logprobs")),
    }
    outs = [None] * 8
    errors = []

    def worker(i):
        try:
            outs[i] = post(chat(f"Count from {i} to {i + 20}.", temperature=0, max_tokens=64), stream=True)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [o for o in outs if o]
    result["concurrent8"] = {
        "wall_s": wall,
        "chunks": sum(o["chunks"] for o in done),
        "chunks_per_s": sum(o["chunks"] for o in done) / wall,
        "ttft_max": max((o["ttft"] or 0) for o in done) if done else None,
        "errors": errors,
    }
    if errors:
        result["ok"] = False
    with urllib.request.urlopen(BASE + "/stats", timeout=30) as resp:
        result["stats"] = json.loads(resp.read())
except Exception as e:  # noqa: BLE001
    result["ok"] = False
    result["error"] = repr(e)
print(json.dumps(result, indent=1))
sys.exit(0 if result["ok"] else 1)
