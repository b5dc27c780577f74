"""Training-time compression on digits: parameters, FLOPs, size, speed and accuracy per variant
(a benchmark that prints figures, not a test).

Builds examples/digits with onnx, onnx_int8_static (post-training INT8), onnx_pruned, onnx_distilled
and onnx_qat_int8 (the spec's defaults, or --steps / --seconds), publishes every eligible variant
into a temporary repository, then measures the published model files in-process with onnxruntime
(intra-op threads = usable cores), the variants taking turns window by window (same windows,
interleaved, builder/model/measure.py), at batch 1 and batch 64, and their top-1 accuracy on
data/val.npz.

Usage: python benchmarks/compression.py [--seconds-per-variant 3] [--steps 300] [--train-seconds 60]
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import yaml

from builder.core.host import host_profile
from builder.model.measure import cpu_cores, measure_round_robin
from builder.pipeline import build
from builder.model.runtime import open_runner

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ["onnx", "onnx_int8_static", "onnx_pruned", "onnx_distilled", "onnx_qat_int8"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-variant", type=float, default=3.0, help="measuring cap per variant and batch")
    parser.add_argument("--steps", type=int, default=None, help="compression.steps (default: the spec's)")
    parser.add_argument("--train-seconds", type=float, default=None, help="compression.seconds (default: the spec's)")
    args = parser.parse_args()

    profile = host_profile(with_gpu=False)
    flags = [f for f in profile.get("isa_flags", []) if re.fullmatch(r"avx512_vnni|avx512f|avx2|amx_tile", f)]
    print(f"host: {profile.get('cpu_model')}; ISA: {', '.join(flags) or '-'}; usable cores {cpu_cores()} "
          "(a shared host: other processes ran alongside)")

    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        folder = Path(tmp) / "digits"
        shutil.copytree(ROOT / "examples" / "digits", folder, ignore=shutil.ignore_patterns("__pycache__"))
        spec = yaml.safe_load((folder / "spec.yaml").read_text())
        settings = {k: v for k, v in (("steps", args.steps), ("seconds", args.train_seconds)) if v is not None}
        if settings:
            spec["compression"] = settings
            (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
        repo = Path(tmp) / "repo"
        result = build(folder / "spec.yaml", repo, variants=VARIANTS, benchmark_seconds=0, publish_variants=True,
                       progress=lambda line: print(line) if "compress" in line or "accuracy" in line else None)
        ctx = result.context
        val = dict(np.load(folder / "data" / "val.npz"))
        files, runners = {}, {}
        for v in ctx.variants:
            if not v.published_as:
                print(f"{v.name}: not published ({v.rejected.splitlines()[0] if v.rejected else 'not eligible'})")
                continue
            files[v.name] = repo / v.published_as / "1" / "model.onnx"
            runners[v.name] = open_runner("onnx", files[v.name], ["logits"], ["image"], threads=cpu_cores())
        accuracy = {n: float((run({"image": val["image"]})["logits"].argmax(1) == val["labels"]).mean() * 100)
                    for n, run in runners.items()}
        speed = {}
        for batch in (1, 64):
            feed = {"image": np.ascontiguousarray(val["image"][:batch])}
            for run in runners.values():
                run(feed)
            calls = {n: (lambda run=run: run(feed)) for n, run in runners.items()}
            speed[batch] = measure_round_robin(calls, batch, window_seconds=0.1, max_seconds=args.seconds_per_variant)

        base = speed[64]["onnx"].throughput
        print()
        print("| variant | verified by | params | MFLOPs/sample | size KB | p50 ms b=1 | inf/s b=1 | inf/s b=64 | "
              "x onnx b=64 | top-1 % | stable |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name in runners:
            v = ctx.variant(name)
            stats = v.stats or {}
            m1, m64 = speed[1][name], speed[64][name]
            print(f"| {name} | {v.verified_by} | {stats.get('params', '-')} | "
                  f"{stats.get('flops', 0) / 1e6:.3f} | {files[name].stat().st_size / 1e3:.1f} | "
                  f"{m1.percentiles_ms()['p50']:.4f} | {m1.throughput:.0f} | {m64.throughput:.0f} | "
                  f"{m64.throughput / base:.2f} | {accuracy[name]:.2f} | "
                  f"{'yes' if m1.stable and m64.stable else 'no (fastest 3 windows)'} |")
        pruned = ctx.variant("onnx_pruned")
        if pruned is not None and pruned.stats and ctx.variant("onnx").stats:
            fewer = 1 - pruned.stats["params"] / ctx.variant("onnx").stats["params"]
            print(f"\nonnx_pruned: {fewer * 100:.1f}% fewer parameters (ratio {pruned.compression['ratio']:.2f}, "
                  f"{pruned.compression['stopped_by']}); accuracy {accuracy.get('onnx_pruned', float('nan')):.2f}% vs "
                  f"onnx {accuracy.get('onnx', float('nan')):.2f}%")
        for name in ("onnx_pruned", "onnx_distilled", "onnx_qat_int8"):
            v = ctx.variant(name)
            if v is not None and v.compression:
                training = v.compression.get("training") or {}
                budget = v.compression.get("budget") or {}
                print(f"{name}: {budget.get('used_steps')} steps in {budget.get('used_seconds')} s "
                      f"({training.get('stopped_by') or v.compression.get('stopped_by')})")


if __name__ == "__main__":
    main()
