"""Cost of drift monitoring on the served request path (a benchmark, not a test).

Serves digits_cnn (python backend, onnxruntime) on the embedded tritonserver with the model's
``drift`` config parameter off, on (every request sampled, the default) and on with
``drift_sample_every`` 10, and drives each with closed-loop clients (separate processes, one
single-row request at a time each) at concurrency 1 and 8. Prints, per case:

  req/s            completed requests per second (client side)
  p50 / p99 ms     client-side request latency
  server us/req    Triton's mean request duration (statistics API, success.ns / count)
  infer us/exec    Triton's mean compute_infer time per model execution: this is where the python
                   model runs onnxruntime *and* DriftWindow.observe() (+ publishing the gauges every
                   ``drift_publish_every`` executions), so on - off is the drift cost per execution
  batch            mean formed batch size (rows per execution)

Cases run one server at a time, in interleaved rounds (off, on, on/10, off, on, ...); the
median over rounds is printed.

Usage:
  python benchmarks/drift_served_overhead.py [--repository DIR] [--seconds 5] [--rounds 3]
Without --repository, examples/digits is built (onnx variant, no build benchmark) into a temp dir.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = "digits_cnn"
CASES = {  # name -> config parameters set on the copy of the model
    "drift off": {"drift": "off"},
    "drift on": {"drift": "on"},
    "drift on, sample 1/10": {"drift": "on", "drift_sample_every": "10"},
}


def _set_parameter(config: str, key: str, value: str) -> str:
    block = re.compile(r'parameters\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value\s*\{\s*string_value:\s*"[^"]*"\s*\}\s*\}')
    entry = f'parameters {{\n  key: "{key}"\n  value {{ string_value: "{value}" }}\n}}'
    return block.sub(entry, config) if block.search(config) else config.rstrip("\n") + "\n" + entry + "\n"


def _repository_for(source: Path, target: Path, params: dict[str, str]) -> Path:
    shutil.copytree(source / MODEL, target / MODEL)
    config = target / MODEL / "config.pbtxt"
    text = config.read_text()
    for key, value in params.items():
        text = _set_parameter(text, key, value)
    config.write_text(text)
    return target


def _client(http_url: str, images: np.ndarray, seconds: float, ready, go, seed: int, out) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url, network_timeout=60)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(images))
    latencies = []
    i = 0

    def one():
        nonlocal i
        row = images[order[i % len(order)]][None]
        i += 1
        item = httpclient.InferInput("image", list(row.shape), "FP32")
        item.set_data_from_numpy(row)
        client.infer(MODEL, [item])

    for _ in range(20):  # connection + warm-up
        one()
    ready.put(seed)
    go.wait()  # every client is warm, and the main process has read the statistics
    stop_at = time.time() + seconds
    while True:
        t0 = time.perf_counter()
        one()
        now = time.time()
        if now > stop_at:
            break
        latencies.append(time.perf_counter() - t0)
    client.close()
    out.put(latencies)


def _stats(http_url: str) -> dict:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://{http_url}/v2/models/{MODEL}/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    inf = stats["inference_stats"]
    return {"requests": inf["success"]["count"], "request_ns": inf["success"]["ns"],
            "executions": stats["execution_count"], "infer_ns": inf["compute_infer"]["ns"],
            "rows": stats["inference_count"]}


def _load(http_url: str, images: np.ndarray, concurrency: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_client, args=(http_url, images, seconds, ready, go, k, out)) for k in range(concurrency)]
    for p in procs:
        p.start()
    warm, deadline = 0, time.time() + 120
    while warm < concurrency:  # the clients import tritonclient and warm up (or die trying)
        try:
            ready.get(timeout=1.0)
            warm += 1
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.time() > deadline:
                for p in procs:
                    p.terminate()
                raise RuntimeError(f"load clients failed while starting (exit codes {dead}) or timed out")
    before = _stats(http_url)
    go.set()
    latencies, received = [], 0
    deadline = time.time() + seconds + 120
    while received < len(procs):
        try:
            latencies += out.get(timeout=1.0)
            received += 1
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.time() > deadline:
                for p in procs:
                    p.terminate()
                raise RuntimeError(f"load clients failed (exit codes {dead}) or timed out")
    after = _stats(http_url)
    for p in procs:
        p.join(30)
    d = {k: after[k] - before[k] for k in before}
    lat = np.asarray(latencies) * 1e3
    return {
        "rps": len(latencies) / seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "server_us": d["request_ns"] / max(d["requests"], 1) / 1e3,
        "infer_us": d["infer_ns"] / max(d["executions"], 1) / 1e3,
        "batch": d["rows"] / max(d["executions"], 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", type=Path, help="a repository holding digits_cnn (default: build it)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per case (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from builder.serving.embedded import EmbeddedServer

    work = Path(tempfile.mkdtemp(prefix="drift-served-bench-"))
    try:
        source = args.repository
        if source is None:
            from builder.pipeline import build

            print("building examples/digits (onnx) ...", flush=True)
            source = work / "built"
            build(ROOT / "examples" / "digits" / "spec.yaml", source, variants=["onnx"], benchmark_seconds=0,
                  progress=lambda m: None)
        repos = {name: _repository_for(source, work / f"case{i}", params) for i, (name, params) in enumerate(CASES.items())}
        images = np.load(ROOT / "examples" / "digits" / "data" / "val.npz")["image"].astype(np.float32)
        results: dict[tuple[str, int], list[dict]] = {}
        for r in range(args.rounds):
            for name, repo in repos.items():
                with EmbeddedServer(repo, ready_timeout=90) as server:
                    for c in args.concurrency:
                        results.setdefault((name, c), []).append(_load(server.http_url, images, c, args.seconds))
                print(f"round {r + 1}/{args.rounds}: {name} done", flush=True)

        import onnxruntime
        import platform

        print(f"\n{MODEL} on the embedded tritonserver (python backend, onnxruntime {onnxruntime.__version__}, "
              f"1 instance, dynamic batching), {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
              f"single-row HTTP requests, closed loop; medians of {args.rounds} rounds x {args.seconds:g} s")
        head = f"{'case':<24}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'server us/req':>15}{'infer us/exec':>15}{'batch':>7}"
        print(head)
        print("-" * len(head))
        med = {}
        for (name, c), runs in sorted(results.items(), key=lambda kv: (kv[0][1], list(CASES).index(kv[0][0]))):
            m = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            med[(name, c)] = m
            print(f"{name:<24}{c:>5}{m['rps']:>9.0f}{m['p50_ms']:>9.2f}{m['p99_ms']:>9.2f}"
                  f"{m['server_us']:>15.0f}{m['infer_us']:>15.0f}{m['batch']:>7.2f}")
        print()
        for c in args.concurrency:
            off = med[("drift off", c)]
            for name in list(CASES)[1:]:
                on = med[(name, c)]
                print(f"concurrency {c}, {name} vs off: throughput {100 * (on['rps'] / off['rps'] - 1):+.1f} %, "
                      f"p50 {on['p50_ms'] - off['p50_ms']:+.3f} ms, p99 {on['p99_ms'] - off['p99_ms']:+.3f} ms, "
                      f"compute_infer {on['infer_us'] - off['infer_us']:+.0f} us/exec")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
