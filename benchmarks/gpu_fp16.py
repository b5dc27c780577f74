"""FP32 vs FP16 on a CUDA GPU, in-process: what the GPU variants buy and what they cost in accuracy.

For each model - the examples (their spec's model and validation data, loaded the way ``build`` loads
them) and a ResNet-50 (torchvision, random weights: no network on the GPU hosts, so its accuracy is
the top-1 agreement with FP32 on random images, not a dataset's) - and each precision:

- ``fp32``: FP32 with TF32 off (cuDNN/cuBLAS in full FP32: the strict reference)
- ``fp32_tf32``: FP32 as torch runs it by default on Ampere+ (cuDNN convolutions in TF32)
- ``autocast_fp16``: ``torch.autocast("cuda", torch.float16)`` around the FP32 model
- ``ts_fp16``: ``.half()`` weights, traced to TorchScript (what ``torchscript_fp16`` publishes)
- ``ts_fp16_cl``: the same in channels_last memory format (4-D inputs only)

it prints latency p50/p95/p99 at batch 1 and the best throughput over the batch sizes, end to end
from a host numpy array to a host numpy array (the copies a server makes are counted), the accuracy
drop vs FP32 in points where the data has labels, and the rel L2 vs the FP32 CPU reference; and the
throughput on the device (the model alone on a batch already on the GPU, up to batch 1024 for the
examples: the precision's own ceiling, which the copies hide at small models). Timing:
a warm-up, then repeated synchronised runs (each latency sample is one request; throughput is the
median of 5 timed windows). It exits 1 on a machine without a CUDA GPU.

Usage: python benchmarks/gpu_fp16.py [--models digits,convnet64,resnet50] [--seconds 1.0]
                                     [--results benchmarks/results/gpu_fp16.md]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "fp32_tf32", "autocast_fp16", "ts_fp16", "ts_fp16_cl")
TARGET_SPEEDUP, TARGET_DROP_POINTS = 3.0, 1.0


def load_example(name: str, workdir: Path):
    """(model, validation inputs, labels or None, FP32 CPU reference outputs, max batch) of an example."""
    from builder.spec.model import load_spec
    from builder.stages import load
    from builder.stages.base import BuildContext, BuildOptions

    spec = load_spec(ROOT / "examples" / name / "spec.yaml")
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=workdir / "repo", target="gpu"), workdir=workdir,
                       progress=lambda m: None)
    result = load.run(ctx)
    if result.status.value != "OK":
        raise SystemExit(f"{name}: loading failed: {result.reason}")
    inputs = ctx.reference.validation_inputs
    if inputs is None or len(spec.inputs) != 1:
        raise SystemExit(f"{name}: this benchmark needs one input and data.validation")
    x = np.ascontiguousarray(inputs[spec.inputs[0].name], dtype=np.float32)
    ref = ctx.reference.validation_outputs[spec.outputs[0].name if ctx.reference.top1_output is None
                                           else ctx.reference.top1_output]
    return ctx.model.eval(), x, ctx.reference.labels, np.asarray(ref, dtype=np.float32), spec.max_batch_size or 1


def load_resnet50(samples: int = 256):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = np.random.default_rng(0).standard_normal((samples, 3, 224, 224)).astype(np.float32)
    with torch.inference_mode():
        ref = torch.cat([model(torch.from_numpy(x[i:i + 32])) for i in range(0, samples, 32)]).numpy()
    return model, x, None, ref, 256


def make_runner(model, precision: str, example: np.ndarray):
    """run(numpy batch) -> numpy FP32 outputs, on cuda:0, in the given precision."""
    import torch

    torch.backends.cudnn.allow_tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = precision != "fp32"
    device = torch.device("cuda:0")
    channels_last = precision == "ts_fp16_cl"
    model = copy.deepcopy(model)  # each precision gets its own weights
    if precision in ("fp32", "fp32_tf32", "autocast_fp16"):
        module = model.float().to(device)
    else:
        half = model.half().to(device)
        sample = torch.from_numpy(example[:2]).to(device).half()
        if channels_last:
            half = half.to(memory_format=torch.channels_last)
            sample = sample.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            module = torch.jit.freeze(torch.jit.trace(half, sample, check_trace=False).eval())

    def staged(batch: np.ndarray):
        """A call that runs the model alone on a batch already on the GPU (no copies, no casts timed)."""
        x = torch.from_numpy(batch).to(device)
        if precision.startswith("ts_fp16"):
            x = x.half()
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)

        def call():
            with torch.inference_mode():
                if precision == "autocast_fp16":
                    with torch.autocast("cuda", dtype=torch.float16):
                        return module(x)
                return module(x)
        return call

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            x = torch.from_numpy(batch).to(device, non_blocking=False)
            if precision.startswith("ts_fp16"):
                x = x.half()
                if channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
            if precision == "autocast_fp16":
                with torch.autocast("cuda", dtype=torch.float16):
                    y = module(x)
            else:
                y = module(x)
            if isinstance(y, (tuple, list)):
                y = y[0]
            return y.float().cpu().numpy()
    run.staged = staged
    return run


def accuracy(run, x: np.ndarray, labels, ref: np.ndarray, batch: int) -> dict:
    outputs = np.concatenate([run(x[i:i + batch]) for i in range(0, len(x), batch)])
    rel_l2 = float(np.linalg.norm(outputs - ref) / max(np.linalg.norm(ref), 1e-30))
    record = {"rel_l2_vs_fp32_cpu": rel_l2, "finite": bool(np.isfinite(outputs).all())}
    if outputs.ndim == 2:
        record["top1_agreement"] = float((outputs.argmax(1) == ref.argmax(1)).mean())
        if labels is not None:
            record["top1"] = float((outputs.argmax(1) == np.asarray(labels).reshape(-1)).mean())
    return record


def latency_ms(run, sample: np.ndarray, seconds: float) -> dict:
    import torch

    for _ in range(20):
        run(sample)
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 50:
        start = time.perf_counter()
        run(sample)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    q = np.percentile(times, [50, 95, 99])
    return {"p50": float(q[0]), "p95": float(q[1]), "p99": float(q[2]), "n": len(times)}


def throughput(run, x: np.ndarray, batches: list[int], seconds: float, on_device: bool = False) -> dict:
    """inf/s per batch size: end to end (numpy in, numpy out), or ``on_device`` (the model alone on a batch
    already on the GPU, synchronised once per window)."""
    import torch

    by_batch = {}
    for b in batches:
        data = np.ascontiguousarray(np.resize(x, (b,) + x.shape[1:]))
        call = run.staged(data) if on_device else (lambda data=data: run(data))
        for _ in range(5):
            call()
        windows = []
        for _ in range(5):
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 5:
                call()
                n += b
            torch.cuda.synchronize()
            windows.append(n / (time.perf_counter() - start))
        by_batch[b] = statistics.median(windows)
    best = max(by_batch, key=by_batch.get)
    return {"by_batch": by_batch, "best_batch": best, "best": by_batch[best]}


def device_facts() -> dict:
    import torch

    from builder.core.host import host_profile

    profile = host_profile()
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "driver": (profile.get("gpus") or [{}])[0].get("driver"), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__, "python": platform.python_version(),
            "cpu": profile["cpu_model"], "host_profile_gpus": profile.get("gpus")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="digits,convnet64,resnet50")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per latency run and per throughput batch size")
    ap.add_argument("--results", type=Path, default=None, help="write a markdown table and JSON here (.md/.json)")
    args = ap.parse_args(argv)
    import tempfile

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here (torch.cuda.is_available() is False): nothing to measure", file=sys.stderr)
        return 1
    facts = device_facts()
    print(json.dumps(facts), flush=True)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name == "resnet50":
            model, x, labels, ref, max_batch = load_resnet50()
            batches, device_batches = [1, 8, 32, 128, 256], []
        else:
            model, x, labels, ref, max_batch = load_example(name, Path(tempfile.mkdtemp(prefix="gpu-fp16-")))
            batches = sorted({1, 8, min(32, max_batch), max_batch})
            device_batches = [256, 1024]  # the model's own ceiling, past the spec's max_batch_size
        for precision in PRECISIONS:
            if precision == "ts_fp16_cl" and x.ndim != 4:
                continue
            run = make_runner(model, precision, x)
            row = {"model": name, "precision": precision, **accuracy(run, x, labels, ref, min(64, max_batch)),
                   "latency_b1_ms": latency_ms(run, x[:1], args.seconds),
                   "throughput": throughput(run, x, batches, args.seconds),
                   "throughput_on_device": throughput(run, x, sorted({*batches, *device_batches}), args.seconds,
                                                      on_device=True)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    table = render(facts, rows)
    print(table)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.with_suffix(".md").write_text(table)
        args.results.with_suffix(".json").write_text(json.dumps({"device": facts, "rows": rows}, indent=1))
    return 0


def render(facts: dict, rows: list[dict]) -> str:
    lines = [f"GPU {facts['gpu']} (compute capability {facts['compute_capability']}), driver {facts['driver']}, "
             f"CUDA {facts['cuda']}, cuDNN {facts['cudnn']}, torch {facts['torch']}, Python {facts['python']}; "
             f"host CPU {facts['cpu']}", "",
             "| model | precision | p50 / p95 / p99 ms at b=1 | best inf/s (batch), end to end | x fp32 | x fp32_tf32 "
             "| on-device inf/s (batch) | x fp32 | top-1 % (drop, points) | rel L2 vs FP32 CPU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["model"], r["precision"]): r for r in rows}
    verdicts = []
    for r in rows:
        strict = base[(r["model"], "fp32")]["throughput"]["best"]
        tf32 = base[(r["model"], "fp32_tf32")]["throughput"]["best"]
        lat, tp, dev = r["latency_b1_ms"], r["throughput"], r["throughput_on_device"]
        dev_strict = base[(r["model"], "fp32")]["throughput_on_device"]["best"]
        top1 = "-"
        if "top1" in r:
            drop = (base[(r["model"], "fp32")]["top1"] - r["top1"]) * 100
            top1 = f"{r['top1'] * 100:.2f} ({drop:+.2f})"
        elif "top1_agreement" in r:
            top1 = f"agrees {r['top1_agreement'] * 100:.1f} % with FP32 CPU"
        lines.append(f"| {r['model']} | {r['precision']} | {lat['p50']:.3f} / {lat['p95']:.3f} / {lat['p99']:.3f} "
                     f"| {tp['best']:,.0f} ({tp['best_batch']}) | {tp['best'] / strict:.2f} | {tp['best'] / tf32:.2f} "
                     f"| {dev['best']:,.0f} ({dev['best_batch']}) | {dev['best'] / dev_strict:.2f} | {top1} | {r['rel_l2_vs_fp32_cpu']:.1e} |")
        if r["precision"] == "ts_fp16_cl" and r["model"] != "digits":
            verdicts.append(f"{r['model']}: ts_fp16_cl (what torchscript_fp16 publishes for 4-D inputs) "
                            f"{dev['best'] / dev_strict:.2f}x strict FP32 on the device, {tp['best'] / strict:.2f}x end "
                            f"to end, {tp['best'] / tf32:.2f}x default (TF32) FP32 end to end; target >= "
                            f"{TARGET_SPEEDUP:g}x at <= {TARGET_DROP_POINTS:g} point drop")
    return "\n".join(lines + [""] + verdicts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
