"""Serving sized to the host: what the build's instances x intra-op threads choice buys over 1 x 1.

Prints this host's profile (CPU model, ISA class, usable cores), builds a model (default
examples/convnet64, ONNX FP32, a short benchmark) into a temporary repository, prints the serving
size the build chose (builder/core/host.py size_serving) and why, then serves it on the embedded
tritonserver and measures requests/s at one concurrency (perf_analyzer over gRPC when installed, the
project's measurement engine; else the in-process Python client, which says so) for each of
1 x 1 (the old default), every other instances x threads whose product fits the usable cores, and
the build's choice - each loaded through Triton's model-control API (nothing rewritten on disk).
Also prints the model's in-process batch-1 p50 with all usable cores, from the build's benchmark.
Client and server share the CPU: figures are for this machine, with the load average around them.

Usage: python benchmarks/host_sizing.py [--spec examples/convnet64/spec.yaml] [--concurrency 16] [--seconds 6]
                                        [--engine auto|perf_analyzer|python]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "convnet64" / "spec.yaml"))
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6.0, help="time cap per configuration")
    ap.add_argument("--engine", default="auto", help="auto (perf_analyzer when installed) | perf_analyzer | python")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="host-sizing-"))
    try:
        return _run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args, work: Path) -> int:
    import yaml

    from builder.core.host import host_profile
    from builder.model.measure import load_average
    from builder.pipeline import build
    from builder.repository.config import config_as_dict
    from builder.serving.embedded import EmbeddedServer
    from builder.tuning.engine import choose_engine
    from builder.tuning.payload import fetch_model, load_samples, make_requests
    from builder.tuning.search import Candidate, ModelControl

    host = host_profile()
    print(f"host: {host['cpu_model']}, ISA {host['isa_class']} ({', '.join(host['isa_flags'])}), "
          f"usable cores {host['usable_cores']} (affinity {host['affinity_cores']}, cgroup quota "
          f"{host['cgroup_cpu_quota']})", flush=True)
    repo = work / "model_repository"
    result = build(Path(args.spec), repo, variants=["onnx"], benchmark_seconds=1.0, progress=lambda m: None)
    name = result.published[0]["name"]
    meta = yaml.safe_load((repo / name / "1" / "metadata.yaml").read_text())
    bench = meta["benchmark"] or {}
    print(f"built {name}: in-process batch-1 p50 {bench.get('latency_ms_b1', {}).get('p50')} ms "
          f"({bench.get('runtime', '')}); serving chosen: {meta['serving']['instances']} x "
          f"{meta['serving']['intra_op_threads']} ({meta['serving']['sized']})", flush=True)
    base = config_as_dict((repo / name / "config.pbtxt").read_text())
    cores = host["usable_cores"]
    chosen = (meta["serving"]["instances"], meta["serving"]["intra_op_threads"])
    shapes = [(1, 1)] + [(i, t) for i in (1, 2, 4) for t in (1, 2, 4) if i * t <= cores and (i, t) != (1, 1)]
    shapes = list(dict.fromkeys(shapes + [chosen]))
    rows = []
    print(f"load average before {load_average()}", flush=True)
    engine = choose_engine(args.engine, say=print, install=False)
    print(f"measured with {engine.name}", flush=True)
    with EmbeddedServer(repo, load_models=[name]) as server:
        interface = fetch_model(server.grpc_url, "grpc", name)
        samples, _ = load_samples(interface, None, repo)
        requests = make_requests(samples, 1, interface.batching)
        engine.prepare(server.grpc_url, "grpc", interface, samples, requests, work_dir=work / "engine")
        control = ModelControl(server.grpc_url, "grpc", name)
        for instances, threads in shapes:
            config = Candidate("x", bool(base.get("dynamic_batching") is not None), 0, instances,
                               int(base.get("max_batch_size", 0)), threads=threads).config(base)
            control.load(config)
            level = engine.measure(args.concurrency, window_s=1.0, max_s=args.seconds)
            row = {"instances": instances, "intra_op_threads": threads, "chosen": (instances, threads) == chosen,
                   "throughput_rps": round(level.throughput, 1), "p99_ms": level.p99_ms, "stable": level.stable}
            rows.append(row)
            print(json.dumps(row), flush=True)
        control.close()
    print(f"load average after {load_average()}")
    one = next(r for r in rows if (r["instances"], r["intra_op_threads"]) == (1, 1))["throughput_rps"]
    best = max(rows, key=lambda r: r["throughput_rps"])
    mine = next(r for r in rows if r["chosen"])
    print(json.dumps({"engine": engine.name, "concurrency": args.concurrency, "one_by_one_rps": one, "chosen": list(chosen),
                      "chosen_rps": mine["throughput_rps"], "chosen_vs_one_by_one": round(mine["throughput_rps"] / one, 2),
                      "best": [best["instances"], best["intra_op_threads"]], "best_rps": best["throughput_rps"],
                      "chosen_vs_best": round(mine["throughput_rps"] / best["throughput_rps"], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
