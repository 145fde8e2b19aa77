#!/usr/bin/env python3
"""Load and abuse test of `mlx-bun serve` (standard library only).

Starts the server on a free port, sends N mixed requests from C client
threads, then checks: no crash, no wedged request (each one ends within
--timeout), every answer has the expected status, the server still answers
/health, its RSS is back near the warm baseline, and SIGTERM ends it with
status 0. Prints a JSON summary; exits 1 on any failure.

    scripts/load-test.py [--requests 1000] [--clients 32] [--binary target/release/mlx-bun]
                         [--server-arg=--prompt-cache=0 ...]

Request mix (by weight): valid chat, valid streamed completion, streamed chat
whose client disconnects after the first chunk, json_schema-constrained chat,
malformed JSON, invalid field values, oversized body (413), prompt longer than
the context (400).
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}

MIX = [
    ("chat", 30),
    ("stream_completion", 20),
    ("stream_disconnect", 10),
    ("json_schema", 10),
    ("malformed_json", 10),
    ("invalid_field", 10),
    ("huge_body", 5),
    ("over_context", 5),
]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Result:
    def __init__(self, kind):
        self.kind = kind
        self.status = None
        self.error = None
        self.seconds = 0.0
        self.ok = False


def request(host, port, kind, timeout, max_body):
    r = Result(kind)
    t = time.time()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        path = "/v1/chat/completions"
        expect = 200
        stream = False
        disconnect = False
        if kind == "chat":
            body = json.dumps({"messages": [{"role": "user", "content": f"Say hi #{random.randint(0, 9999)}"}], "max_tokens": 3})
        elif kind == "stream_completion":
            path = "/v1/completions"
            body = json.dumps({"prompt": f"Once upon a time {random.randint(0, 9999)}", "max_tokens": 3, "stream": True})
            stream = True
        elif kind == "stream_disconnect":
            body = json.dumps({"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 64, "stream": True})
            stream = disconnect = True
        elif kind == "json_schema":
            body = json.dumps({
                "messages": [{"role": "user", "content": "A person as JSON."}],
                "max_tokens": 6,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
            })
        elif kind == "malformed_json":
            body = random.choice(['{"messages": [', "not json", '{"messages": 5}', "", '{"prompt": "x", "max_tokens": "ten"}'])
            path = random.choice(["/v1/chat/completions", "/v1/completions"])
            expect = {400, 415, 422}
        elif kind == "invalid_field":
            body = json.dumps(random.choice([
                {"messages": [{"role": "user", "content": "x"}], "temperature": -1},
                {"messages": [{"role": "wizard", "content": "x"}]},
                {"prompt": [99999999]},
                {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            ]))
            path = "/v1/completions" if "prompt" in body else path
            expect = 400
        elif kind == "huge_body":
            body = json.dumps({"prompt": "x" * (max_body + 1000), "max_tokens": 1})
            path = "/v1/completions"
            expect = 413
        elif kind == "over_context":
            body = json.dumps({"prompt": "hello " * 9000, "max_tokens": 1})
            path = "/v1/completions"
            expect = 400
        conn.request("POST", path, body=body.encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        r.status = resp.status
        if disconnect and resp.status == 200:
            resp.read(1)  # the first bytes of the stream, then hang up
            conn.sock.close()
            r.ok = True
        else:
            data = resp.read()
            wanted = expect if isinstance(expect, set) else {expect}
            r.ok = resp.status in wanted
            if r.ok and resp.status == 200:
                if stream:
                    r.ok = data.rstrip().endswith(b"data: [DONE]")
                elif kind == "json_schema":
                    out = json.loads(data)
                    content = out["choices"][0]["message"]["content"]
                    # max_tokens 6 may cut the object; what exists must be a JSON prefix.
                    r.ok = content.startswith("{")
            if not r.ok:
                r.error = f"status {resp.status}: {data[:200]!r}"
    except Exception as e:  # a wedged or dropped request
        r.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    r.seconds = time.time() - t
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--binary", default="target/release/mlx-bun")
    ap.add_argument("--max-body-bytes", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra flag for serve, e.g. --server-arg=--prompt-cache=0")
    args = ap.parse_args()
    random.seed(args.seed)

    server = subprocess.Popen(
        [args.binary, "serve", "--port", "0", "--max-queue", str(args.clients * 2),
         "--max-body-bytes", str(args.max_body_bytes), "--log-level", "error", *args.server_arg],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = server.stdout.readline()
    m = re.search(r"http://([\d.]+):(\d+)", ready)
    if not m:
        print("server did not start:", ready, server.stderr.read(), file=sys.stderr)
        return 1
    host, port = m.group(1), int(m.group(2))
    stderr_lines = []
    threading.Thread(target=lambda: stderr_lines.extend(server.stderr), daemon=True).start()

    # Warm: one of each generating kind, then the baseline.
    for kind in ("chat", "stream_completion", "json_schema"):
        request(host, port, kind, args.timeout, args.max_body_bytes)
    baseline = rss_kb(server.pid)

    kinds = [k for k, w in MIX for _ in range(w)]
    plan = [random.choice(kinds) for _ in range(args.requests)]
    results = []
    lock = threading.Lock()
    it = iter(plan)
    peak = [baseline]

    def client():
        while True:
            with lock:
                kind = next(it, None)
            if kind is None:
                return
            r = request(host, port, kind, args.timeout, args.max_body_bytes)
            with lock:
                results.append(r)
                peak[0] = max(peak[0], rss_kb(server.pid))

    started = time.time()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - started

    time.sleep(2)
    alive = server.poll() is None
    health = None
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/health")
        health = c.getresponse().status
    except Exception as e:
        health = str(e)
    after = rss_kb(server.pid) if alive else 0
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
        code = "did not stop"

    by_kind = defaultdict(Counter)
    for r in results:
        by_kind[r.kind]["ok" if r.ok else "failed"] += 1
    failures = [f"{r.kind}: {r.error}" for r in results if not r.ok]
    lat = sorted(r.seconds for r in results)
    summary = {
        "requests": len(results),
        "clients": args.clients,
        "wall_seconds": round(wall, 1),
        "ok": sum(r.ok for r in results),
        "failed": len(failures),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "latency_p50_s": round(lat[len(lat) // 2], 2) if lat else None,
        "latency_max_s": round(lat[-1], 2) if lat else None,
        "server_alive_after": alive,
        "health_after": health,
        "rss_baseline_mb": round(baseline / 1024, 1),
        "rss_peak_mb": round(peak[0] / 1024, 1),
        "rss_after_mb": round(after / 1024, 1),
        "exit_code_after_sigterm": code,
        "panics_in_log": sum("panicked" in l for l in stderr_lines),
        "first_failures": failures[:10],
    }
    print(json.dumps(summary, indent=2))
    passed = (
        not failures and alive and health == 200 and code == 0
        and summary["panics_in_log"] == 0 and after < baseline * 1.5 + 50 * 1024
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
