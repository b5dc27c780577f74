"""Throughput of 1 vs N embedded Triton replicas behind nginx, on one model repository in object
storage (a local moto S3 endpoint standing in for S3/MinIO), driven by distributed Locust.

For each replica count it starts a ReplicaSet on the s3:// repository, warms it up, runs Locust
(1 master + --workers workers, closed loop: --users requests in flight) against the balancer, and
prints requests/s, latency percentiles, failures and how the requests spread over the replicas
(each replica's own statistics API).

On a small machine this measures contention more than scaling: every replica, the python-backend
stub processes, nginx and the Locust processes share the same cores. See README "Scale-out" for
what to expect on a cluster.

Usage:
    python benchmarks/replicas_throughput.py [--repository DIR] [--model digits_cnn]
           [--replicas 1,2] [--repeat 2] [--users 16] [--seconds 20] [--workers 2] [--protocol http|grpc]

Without --repository it builds examples/digits (ONNX variant, no benchmark) into a temp folder first.
The AWS variables the local endpoint needs are set for this process only, to throwaway values,
when they are not set already (moto accepts any).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _build(tmp: Path) -> Path:
    from builder.pipeline import build

    repo = tmp / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0,
          progress=lambda message: None)
    return repo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", help="local model repository to publish (default: build examples/digits)")
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts (default 1,2)")
    parser.add_argument("--users", type=int, default=16, help="requests in flight (Locust users)")
    parser.add_argument("--seconds", type=float, default=20.0, help="load duration per replica count")
    parser.add_argument("--workers", type=int, default=2, help="Locust worker processes (distributed mode)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the replica counts this many times, interleaved (1,2,1,2 ...): other work on "
                             "the machine then affects every count alike")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.replicas.split(",") if c.strip()] * max(1, args.repeat)

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "local-benchmark-only")  # the in-memory moto endpoint accepts anything
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

    from builder.repository.layout import latest_version
    from builder.storage.s3 import publish_repository
    from builder.storage.moto_s3 import MotoS3Server
    from builder.scaleout.replicas import ReplicaSet
    from builder.tuning.loadtest import run_loadtest

    with tempfile.TemporaryDirectory(prefix="replicas-bench-") as tmp_name:
        tmp = Path(tmp_name)
        repository = Path(args.repository).resolve() if args.repository else _build(tmp)
        version = latest_version(repository / args.model)
        payload = repository / args.model / str(version) / "reference.npz"
        rows = []
        with MotoS3Server() as s3:
            s3.create_bucket("models")
            url = s3.repository_url("models", "bench")
            publish_repository(repository, url, models=[args.model])
            for count in counts:
                with ReplicaSet(url, count, prometheus=False, load_models=[args.model]) as group:
                    target = group.http_url if args.protocol == "http" else group.grpc_url
                    run_loadtest(args.model, target, args.protocol, users=args.users, run_time_s=3,
                                 out_dir=tmp / f"warmup-{count}", payload=payload, workers=0)
                    before = group.request_counts(args.model)
                    started = time.monotonic()
                    summary = run_loadtest(args.model, target, args.protocol, users=args.users,
                                           run_time_s=args.seconds, out_dir=tmp / f"load-{count}", payload=payload,
                                           workers=args.workers)
                    elapsed = time.monotonic() - started
                    after = group.request_counts(args.model)
                    spread = {i: after.get(i, 0) - before.get(i, 0) for i in after}
                rows.append((count, summary, spread, elapsed))

    cpu = os.cpu_count()
    print(f"\n{args.model} over {args.protocol} through nginx, {args.users} users, {args.seconds:g} s, "
          f"Locust 1 master + {args.workers} workers, {cpu} CPU cores on this machine")
    print(f"{'replicas':>8} | {'req/s':>8} | {'p50 ms':>7} | {'p95 ms':>7} | {'p99 ms':>7} | {'failures':>8} | "
          "requests per replica")
    for count, summary, spread, _elapsed in rows:
        c = summary["client"]
        rps = c.get("rps") or 0.0
        per = ", ".join(f"#{i}: {n}" for i, n in sorted(spread.items()))
        print(f"{count:>8} | {rps:>8.1f} | {_ms(c.get('p50_ms')):>7} | {_ms(c.get('p95_ms')):>7} | "
              f"{_ms(c.get('p99_ms')):>7} | {c.get('failures', 0):>8} | {per}")
    means: dict[int, list[float]] = {}
    for count, summary, _spread, _elapsed in rows:
        means.setdefault(count, []).append(summary["client"].get("rps") or 0.0)
    if len(means) > 1:
        first = sum(next(iter(means.values()))) / len(next(iter(means.values())))
        print("mean req/s: " + ", ".join(
            f"{count} replica{'s' if count > 1 else ''} {sum(v) / len(v):.0f} (x{sum(v) / len(v) / first:.2f})"
            for count, v in means.items()))
    try:
        load1, _, _ = os.getloadavg()
        print(f"load average at the end: {load1:.1f} on {cpu} cores (other processes on the machine count too)")
    except OSError:
        pass
    return 0


def _ms(value) -> str:
    return "-" if value is None else f"{value:g}"


if __name__ == "__main__":
    sys.exit(main())
