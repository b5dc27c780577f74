"""The standard folder served through the embedded server's stand-in backend against today's python-backend
model of the same variant, side by side (issue 34's no-regression target; a benchmark, not a test).

For each example (default digits, overhead-bound, and convnet64, a conv net) this builds the ONNX variant
twice with the same sizing (no benchmark: 1 instance x 1 thread for both): ``--target embedded`` (a
python-backend folder: config backend "python" + model.py wrapping onnxruntime) and ``--target cpu`` (the
standard folder: platform "onnxruntime_onnx" + model.onnx, served here by the Python-based stand-in, on the
NGC image by the C++ onnxruntime backend). Both are served at once by one embedded tritonserver each and
measured in turns (python, standard, python, standard, ...) with Triton's perf_analyzer over gRPC at
concurrency 1, 8 and 16 (batch-1 requests from reference.npz, time windows until stable); the median of the
rounds is reported. Target: the standard folder reaches at least the python model's req/s and at most its
p99 at each level (within the host's run-to-run spread, printed as min-max of the rounds).

Prints the CPU model and ISA flags first, one JSON line per measurement, then a table.

Usage: python benchmarks/standin_vs_python.py [--models digits,convnet64] [--rounds 3] [--levels 1,8,16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LAYOUTS = {"python": "embedded", "standard": "cpu"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="digits,convnet64", help="examples/<name>/spec.yaml, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="measurements of each layout and level, in turns")
    ap.add_argument("--levels", default="1,8,16", help="concurrency levels")
    ap.add_argument("--seconds", type=float, default=6.0, help="time cap per measured level")
    args = ap.parse_args(argv)
    from builder.host import host_profile
    from builder.pipeline import build
    from builder.serving.embedded import EmbeddedServer
    from builder.tuning.sweep import run_sweep

    host = host_profile(with_gpu=False)
    print(f"host: {host['cpu_model']}; ISA flags: {', '.join(host['isa_flags'])}; usable cores {host.get('usable_cores')}",
          flush=True)
    levels = [int(x) for x in args.levels.split(",")]
    table = []
    with tempfile.TemporaryDirectory(prefix="standin-bench-") as work:
        for example in args.models.split(","):
            spec = ROOT / "examples" / example / "spec.yaml"
            repos, names = {}, {}
            for layout, target in LAYOUTS.items():
                repos[layout] = Path(work) / example / layout
                result = build(spec, repos[layout], variants=["onnx"], target=target, benchmark_seconds=0,
                               progress=lambda m: None)
                names[layout] = result.published[0]["name"]
                print(f"{example}: {layout} folder published as {result.published[0]['backend']}", flush=True)
            figures: dict[tuple[str, int], list[tuple[float, float]]] = {}
            servers = {layout: EmbeddedServer(repos[layout], ready_timeout=120) for layout in LAYOUTS}
            try:
                for server in servers.values():
                    server.start()
                for round_number in range(args.rounds):
                    for layout, server in servers.items():
                        swept = run_sweep(names[layout], server.grpc_url, "grpc", levels=levels,
                                          out_dir=Path(work) / "sweeps" / f"{example}-{layout}-{round_number}",
                                          repository=repos[layout], max_seconds_per_level=args.seconds,
                                          engine="perf_analyzer")
                        for row in swept["levels"]:
                            figures.setdefault((layout, row["concurrency"]), []).append(
                                (row["throughput_rps"], row["p99_ms"]))
                            print(json.dumps({"example": example, "layout": layout, "round": round_number, **row}),
                                  flush=True)
            finally:
                for server in servers.values():
                    server.stop()
            for level in levels:
                cells = [example, str(level)]
                for layout in LAYOUTS:
                    rps = [f[0] for f in figures[(layout, level)]]
                    p99 = [f[1] for f in figures[(layout, level)]]
                    cells.append(f"{statistics.median(rps):,.0f} ({min(rps):,.0f}-{max(rps):,.0f})")
                    cells.append(f"{statistics.median(p99):.2f} ({min(p99):.2f}-{max(p99):.2f})")
                py_rps = statistics.median(f[0] for f in figures[("python", level)])
                std_rps = statistics.median(f[0] for f in figures[("standard", level)])
                cells.append(f"{std_rps / py_rps:.2f}")
                table.append(cells)
    head = ["example", "c", "python req/s (min-max)", "python p99 ms", "standard req/s (min-max)", "standard p99 ms",
            "standard / python"]
    widths = [max(len(row[i]) for row in [head, *table]) for i in range(len(head))]
    print()
    for row in [head, ["-" * w for w in widths], *table]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
