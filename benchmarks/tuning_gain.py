"""What measured tuning buys: digits_cnn built, served on the embedded Triton, tuned under a p99 budget.

Builds examples/digits (ONNX variant) into a temporary repository, serves it on the embedded
tritonserver (python backend), runs ``run_tune`` over the default grid (dynamic batching off / on
with max_queue_delay_microseconds 0, 100, 500, 2000; 1 or 2 instances; max_batch_size 64, 32, 16;
preferred batch size when a delay wins) with the in-process gRPC closed-loop client, and prints the
table of candidates and the winner's throughput within the budget against the two baselines:
no dynamic batching, and the default config (batching on, delay 0, one instance).

Client and server share this machine's CPU cores: the figures are for this machine, and the load
average before and after is printed so a busy machine shows.

Usage: python benchmarks/tuning_gain.py [--p99-budget-ms 10] [--seconds-per-candidate 10] [--out DIR] [--keep]
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
    ap.add_argument("--p99-budget-ms", type=float, default=10.0)
    ap.add_argument("--seconds-per-candidate", type=float, default=10.0)
    ap.add_argument("--max-batch-sizes", default="32,16")
    ap.add_argument("--out", default=None, help="where tuning.json goes (default: the temp folder, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary repository with the tuned config")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tuning-gain-"))
    try:
        return _run(args, work)
    finally:
        if args.keep:
            print(f"kept {work} (tuned config: {work / 'model_repository' / 'digits_cnn' / 'config.pbtxt'})")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(args, work: Path) -> int:
    from builder.model.measure import cpu_cores, load_average
    from builder.pipeline import build
    from builder.serving.embedded import EmbeddedServer
    from builder.tuning.tune import run_tune

    repo = work / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0,
          progress=lambda message: None)
    print(f"cores {cpu_cores()}, load average before {load_average()}", flush=True)
    with EmbeddedServer(repo, load_models=["digits_cnn"]) as server:
        result = run_tune("digits_cnn", repo, server.grpc_url, protocol="grpc", p99_budget_ms=args.p99_budget_ms,
                          seconds_per_candidate=args.seconds_per_candidate, write=True,
                          out_dir=args.out or work / "tune",
                          max_batch_sizes=[int(x) for x in args.max_batch_sizes.split(",") if x],
                          progress=lambda line: print(line, flush=True))
        print(f"load average after {load_average()}")
        print(f"client: {result['client']}")
        print(f"search: {len(result['candidates'])} candidates in {result['search_seconds']} s")
    ratios = result["ratios"]
    winner = result["winner"]
    if winner is None:
        print(f"no candidate met p99 <= {args.p99_budget_ms} ms")
        return 1
    print(json.dumps({"p99_budget_ms": args.p99_budget_ms, "winner": winner["label"],
                      "winner_rps": winner["throughput_within_budget_rps"],
                      "no_batching_rps": result["baselines"]["no_batching"]["throughput_within_budget_rps"],
                      "default_rps": result["baselines"]["default"]["throughput_within_budget_rps"],
                      "tuned_vs_no_batching": ratios["vs_no_batching"], "tuned_vs_default": ratios["vs_default"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
