"""Two layouts of the same ONNX variant served by the embedded tritonserver, side by side (a benchmark, not a
test). Each example (default digits, overhead-bound, and convnet64, a conv net) is built once per layout
with the same sizing (no benchmark: 1 instance x 1 thread), both repositories are served at once (one
embedded tritonserver each) and measured in turns (a, b, a, b, ...) with Triton's perf_analyzer over gRPC
at each concurrency level (batch-1 requests from reference.npz, time windows until stable); the median of
the rounds is reported with the min-max spread. Prints the CPU model and ISA flags first, one JSON line per
measurement, then a table.

Comparisons (the first argument):

standin (`make bench-standin`, issue 34's no-regression target): ``--target python`` (config backend
  "python" + model.py wrapping onnxruntime) vs ``--target cpu`` (the standard folder: platform
  "onnxruntime_onnx" + model.onnx, served here by the Python-based stand-in, on the NGC image by the C++
  onnxruntime backend). Target: the standard folder reaches at least the python model's req/s and at most
  its p99 at each level (within the host's run-to-run spread).
monitor (`make bench-monitor`, issue 34: what deploy.monitor costs): the standard folder alone vs behind the
  monitor ensemble (<name> -> <name>__model -> <name>__monitor, the python step counting NaN/Inf and
  feeding the drift window; 1 monitor instance).
native (`make bench-native`, issue 48): the same standard folder served through the Python stand-in
  ($TRITON_BUILDER_BACKENDS=standin) vs Triton's own C++ onnxruntime backend (`install-backends`; the
  benchmark builds it first if needed).

Usage: python benchmarks/served_side_by_side.py standin|monitor|native [--models digits,convnet64] [--rounds 3]
       [--levels 1,8,16] [--seconds 6]
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


#: comparison -> {label: (target, deploy.monitor, backends)}, two layouts; the second is the ratio's numerator;
#: backends: $TRITON_BUILDER_BACKENDS while that layout's server starts (native: Triton's C++ backends where built)
COMPARISONS = {"standin": {"python": ("python", None, "standin"), "standard": ("cpu", None, "standin")},
               "monitor": {"plain": ("cpu", None, "native"), "monitored": ("cpu", True, "native")},
               "native": {"standin": ("cpu", None, "standin"), "native": ("cpu", None, "native")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("comparison", choices=sorted(COMPARISONS), help="which two layouts (see above)")
    ap.add_argument("--models", default="digits,convnet64", help="examples/<name>/spec.yaml, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="measurements of each layout and level, in turns")
    ap.add_argument("--levels", default="1,8,16", help="concurrency levels")
    ap.add_argument("--seconds", type=float, default=6.0, help="time cap per measured level")
    args = ap.parse_args(argv)
    layouts = COMPARISONS[args.comparison]
    import os

    from builder.core.host import host_profile
    from builder.pipeline import build
    from builder.serving.embedded import EmbeddedServer
    from builder.serving.native_backends import install_backends
    from builder.spec.model import load_spec
    from builder.tuning.sweep import run_sweep

    host = host_profile(with_gpu=False)
    print(f"host: {host['cpu_model']}; ISA flags: {', '.join(host['isa_flags'])}; usable cores {host.get('usable_cores')}",
          flush=True)
    levels = [int(x) for x in args.levels.split(",")]
    first, second = list(layouts)
    if any(backends == "native" for *_, backends in layouts.values()):
        built = install_backends(progress=lambda m: print(m, flush=True))
        print("\n".join(built.lines()), flush=True)
    table = []
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as work:
        for example in args.models.split(","):
            repos, names = {}, {}
            for layout, (target, monitor, _) in layouts.items():
                spec = load_spec(ROOT / "examples" / example / "spec.yaml")
                spec.deploy.monitor = monitor
                repos[layout] = Path(work) / example / layout
                result = build(spec, repos[layout], variants=["onnx"], target=target, benchmark_seconds=0,
                               progress=lambda m: None)
                names[layout] = result.published[0].get("served_as", result.published[0]["name"])
                print(f"{example}: {layout} published as {names[layout]} ({result.published[0]['backend']})", flush=True)
            figures: dict[tuple[str, int], list[tuple[float, float]]] = {}
            servers = {layout: EmbeddedServer(repos[layout], ready_timeout=120) for layout in layouts}
            try:
                for layout, server in servers.items():
                    os.environ["TRITON_BUILDER_BACKENDS"] = layouts[layout][2]  # read as the server starts
                    server.start()
                    print(f"{example}: {layout} served with C++ backends {server.native_backends or 'none'}", flush=True)
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
                for layout in layouts:
                    rps = [f[0] for f in figures[(layout, level)]]
                    p99 = [f[1] for f in figures[(layout, level)]]
                    cells.append(f"{statistics.median(rps):,.0f} ({min(rps):,.0f}-{max(rps):,.0f})")
                    cells.append(f"{statistics.median(p99):.2f} ({min(p99):.2f}-{max(p99):.2f})")
                base = statistics.median(f[0] for f in figures[(first, level)])
                other = statistics.median(f[0] for f in figures[(second, level)])
                cells.append(f"{other / base:.2f}")
                table.append(cells)
    head = ["example", "c", f"{first} req/s (min-max)", f"{first} p99 ms", f"{second} req/s (min-max)",
            f"{second} p99 ms", f"{second} / {first}"]
    widths = [max(len(row[i]) for row in [head, *table]) for i in range(len(head))]
    print()
    for row in [head, ["-" * w for w in widths], *table]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
