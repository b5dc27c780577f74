"""The static INT8 recipe search on this machine (a benchmark, not a test).

Builds an example (default examples/digits) with variants onnx + onnx_int8_static and
``quantization.search: true`` into a temporary folder, then prints the host (CPU model, ISA flags,
usable cores), the search table (candidate, what changed, rel L2, accuracy drop, speed vs FP32,
verdict), the chosen recipe, the search's seconds and the final verify / benchmark figures.

Usage: python benchmarks/quant_search.py [--example digits|convnet64] [--budget 120] [--seconds 1]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def host_line() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = sorted(set(re.findall(r"\b(avx512_vnni|avx512f|avx2|amx_tile|avx_vnni)\b", text)))
    return f"CPU: {model}; ISA flags: {' '.join(flags) or 'none of avx2/avx512f/avx512_vnni/amx_tile'}"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from builder.model.measure import cpu_cores
    from builder.pipeline import build
    from builder.optimise.quant_search import Candidate, Row, summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="digits")
    parser.add_argument("--budget", type=float, default=120.0, help="quantization.search_seconds")
    parser.add_argument("--seconds", type=float, default=1.0, help="benchmark cap per variant afterwards")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / args.example
        shutil.copytree(ROOT / "examples" / args.example, folder, ignore=shutil.ignore_patterns("__pycache__"))
        spec = yaml.safe_load((folder / "spec.yaml").read_text())
        spec["quantization"] = {**(spec.get("quantization") or {}), "search": True, "search_seconds": args.budget}
        (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
        started = time.perf_counter()
        result = build(folder / "spec.yaml", Path(tmp) / "repo", variants=["onnx", "onnx_int8_static"],
                       benchmark_seconds=args.seconds, progress=lambda m: None)
        total = time.perf_counter() - started
        ctx = result.context
        static = ctx.variant("onnx_int8_static")
        stage = next(r for r in ctx.results if r.stage == "quantize")
        print(host_line())
        print(f"usable cores: {cpu_cores()}; example {args.example}; search budget {args.budget:g} s")
        print(f"quantize stage (search included): {stage.seconds:.1f} s; whole build {total:.1f} s")
        rows = [Row(Candidate(), None, r["verdict"]) for r in static.search or []]
        print()
        print(next((n.split("\n", 1)[1] for n in static.notes if n.startswith("quantisation search")), "(no table)"))
        print()
        print(next((n for n in static.notes if n.startswith("search:")), summary(rows) if rows else ""))
        print(f"published recipe: {static.passes[-1]}")
        for v in ctx.variants:
            bench = v.benchmark or {}
            rel = max((m.get("rel_l2", 0) for m in (v.verification or {}).get("metrics", {}).values()), default=None)
            print(f"  {v.name}: verified={v.verified} rel L2 {rel} top-1 drop {(v.accuracy or {}).get('drop')} "
                  f"best {bench.get('best_throughput', 0):.0f} inf/s, p50 b1 "
                  f"{(bench.get('latency_ms_b1') or {}).get('p50')} ms; {v.selection_reason}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
