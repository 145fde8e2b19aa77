"""Driver of scripts/bench-peers.sh (standard library only).

Runs mlx-bun, mlx-lm and llama.cpp on the same model with the same thread
count, rounds interleaved (each round runs every program once, the order
rotating between rounds), and writes what each run measured as metric rows
(JSON lines: name, value, unit, higher_is_better) for `mlx-bun evals import`,
with every command's output kept under --out/logs.

Scenarios:
  generate  one sequence: a random prompt of -p tokens, then -g tokens
            (mlx-bun bench generate, mlx_lm.benchmark, llama-bench)
  serve     C concurrent streaming chat clients, C in --clients: aggregate
            decode tok/s and TTFT p50/p95 (mlx-bun serve, mlx_lm.server,
            llama-server)
Metric names are `<scenario>/<metric>/<program>`, e.g.
`serve-c4/agg_tps/llama.cpp`.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import bench_serve  # noqa: E402

PROGRAMS = ["mlx-bun", "mlx-lm", "llama.cpp"]
# mlx-bun with its CPU kernel's integer dot products (--with-int8): not
# mlx-lm's arithmetic, llama.cpp's kind.
INT8 = "mlx-bun-int8"


class Runner:
    def __init__(self, a):
        self.a = a
        self.rows = []
        self.logs = os.path.join(a.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.env = dict(os.environ)
        # Every program gets the same cores: OpenBLAS and OpenMP pools, our
        # CPU kernel, llama.cpp's -t.
        threads = str(a.threads)
        self.env.update(
            OPENBLAS_NUM_THREADS=threads,
            OMP_NUM_THREADS=threads,
            MLX_BUN_CPU_THREADS=threads,
            HF_HUB_OFFLINE="1",
        )

    def record(self, scenario, metric, program, value, unit, higher_is_better):
        self.rows.append(
            {
                "name": f"{scenario}/{metric}/{program}",
                "value": value,
                "unit": unit,
                "higher_is_better": higher_is_better,
            }
        )

    def log_path(self, name):
        return os.path.join(self.logs, name + ".log")

    def env_for(self, program):
        if program == INT8:
            return dict(self.env, MLX_BUN_CPU_INT8_DOT="1")
        return self.env

    def run(self, name, argv, program):
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env_for(program))
        with open(self.log_path(name), "w") as f:
            f.write("$ " + " ".join(argv) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(
                f"{name} failed ({proc.returncode}); log: {self.log_path(name)}\n"
                + (proc.stdout + proc.stderr)[-2000:]
            )
        print(f"  {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        return proc.stdout

    # --- one sequence -------------------------------------------------------

    def generate(self, program, r):
        a = self.a
        p, g = str(a.prompt_tokens), str(a.generation_tokens)
        name = f"generate-{program}-r{r}"
        if program == "llama.cpp":
            out = self.run(
                name,
                [os.path.join(a.llama_bin, "llama-bench"), "-m", a.gguf, "-p", p, "-n", g,
                 "-t", str(a.threads), "-r", "1", "-o", "json"],
                program,
            )
            for test in json.loads(out):
                if test.get("n_prompt", 0) > 0 and test.get("n_gen", 0) == 0:
                    self.record("generate", "prompt_tps", program, test["avg_ts"], "tok/s", True)
                elif test.get("n_gen", 0) > 0 and test.get("n_prompt", 0) == 0:
                    self.record("generate", "generation_tps", program, test["avg_ts"], "tok/s", True)
            return
        if program.startswith("mlx-bun"):
            argv = [a.binary, "bench", "generate", "-m", a.model, "--no-db"]
        else:
            argv = [a.oracle_python, "-m", "mlx_lm", "benchmark", "--model", a.model]
        out = self.run(name, argv + ["-p", p, "-g", g, "-n", "1"], program)
        trial = re.search(r"Trial 1:\s+prompt_tps=([\d.]+), generation_tps=([\d.]+)", out)
        if not trial:
            raise SystemExit(f"{name}: no trial line; log: {self.log_path(name)}")
        self.record("generate", "prompt_tps", program, float(trial.group(1)), "tok/s", True)
        self.record("generate", "generation_tps", program, float(trial.group(2)), "tok/s", True)

    # --- serving ------------------------------------------------------------

    def server_argv(self, program, port):
        a = self.a
        width = str(max(a.clients))
        if program.startswith("mlx-bun"):
            return [a.binary, "serve", "--model", a.model, "--port", str(port),
                    "--log-level", "warn", "--decode-concurrency", width]
        if program == "mlx-lm":
            return [a.oracle_python, "-m", "mlx_lm", "server", "--model", a.model,
                    "--port", str(port), "--log-level", "WARNING",
                    "--decode-concurrency", width]
        return [os.path.join(a.llama_bin, "llama-server"), "-m", a.gguf, "--port", str(port),
                "-np", width, "-c", str(4096 * int(width)), "-t", str(a.threads),
                "--log-disable"]

    def serve(self, program, r):
        port = free_port()
        name = f"serve-{program}-r{r}"
        log = open(self.log_path(name), "w")
        argv = self.server_argv(program, port)
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  env=self.env_for(program),
                                  start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, server, self.log_path(name))
            bench_serve.stream_chat(base, [{"role": "user", "content": "warm up"}], 2)
            for c in self.a.clients:
                results, wall = bench_serve.concurrent_round(
                    base, c, self.a.serve_tokens, f"{program}{c}.{r}")
                ttft = [x[0] for x in results]
                scenario = f"serve-c{c}"
                self.record(scenario, "agg_tps", program, sum(x[2] for x in results) / wall,
                            "tok/s", True)
                self.record(scenario, "ttft_p50", program, bench_serve.quantile(ttft, 0.5),
                            "s", False)
                self.record(scenario, "ttft_p95", program, bench_serve.quantile(ttft, 0.95),
                            "s", False)
                print(f"  {name} c={c}: {self.rows[-3]['value']:.1f} tok/s", file=sys.stderr)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            log.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_healthy(base, server, log, seconds=600):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"server exited ({server.returncode}); log: {log}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server at {base} not healthy in {seconds} s; log: {log}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--oracle-python", required=True)
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench, llama-server")
    ap.add_argument("--model", required=True, help="the MLX model folder")
    ap.add_argument("--gguf", required=True, help="the same weights as GGUF, for llama.cpp")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--generation-tokens", type=int, default=128)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--serve-tokens", type=int, default=64)
    ap.add_argument("--ban-ids", default="0,2", help="end-of-text ids banned while serving")
    ap.add_argument("--scenarios", default="generate,serve")
    ap.add_argument("--with-int8", action="store_true",
                    help=f"also run {INT8}: mlx-bun with MLX_BUN_CPU_INT8_DOT=1")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.clients = [int(c) for c in a.clients.split(",")]
    bench_serve.BAN.update({i.strip(): -100 for i in a.ban_ids.split(",") if i.strip()})
    runner = Runner(a)
    scenarios = a.scenarios.split(",")
    programs = PROGRAMS + ([INT8] if a.with_int8 else [])
    for r in range(a.rounds):
        shift = r % len(programs)
        order = programs[shift:] + programs[:shift]
        print(f"round {r + 1}/{a.rounds}: {', '.join(order)}", file=sys.stderr)
        for program in order:
            if "generate" in scenarios:
                runner.generate(program, r)
        for program in order:
            if "serve" in scenarios:
                runner.serve(program, r)
    with open(os.path.join(a.out, "metrics.jsonl"), "w") as f:
        for row in runner.rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
