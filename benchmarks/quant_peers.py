"""Our published variant against its peers, side by side on this host (a benchmark, not a test).

For each example (digits, convnet64) in one run:

  1. builds it with ``--variants onnx,onnx_int8_static,openvino,openvino_int8`` (the quantisation search
     on auto, every eligible variant published) and notes what the selection published;
  2. makes the peer onnxruntime users get by default: ``quantize_static`` QDQ S8S8 per-channel MinMax on
     the same calibration data, from the same ONNX export;
  3. times, in-process at the spec's max batch with threads = usable cores, ONNX Runtime FP32, our best
     INT8 (onnx_int8_static as the search left it), the ORT default INT8, OpenVINO FP32 and OpenVINO INT8
     (NNCF): interleaved windows (each variant in turn, repeated), the median window reported;
  4. top-1 accuracy of each on the labelled validation set (reference: the PyTorch model, as verified);
  5. the host's ceiling: a 1024^3 FP32 MatMul in onnxruntime and numpy (GFLOP/s) and a u8s8
     MatMulInteger (GOP/s), measured in turns, best call of each; each variant's fraction of it =
     throughput x the model's GFLOP/sample (Conv/Gemm/MatMul multiply-adds x 2, counted from the ONNX
     graph) / the FP32 ceiling (INT8 variants: / the u8s8 one). A fraction over 1 means the GEMM
     figure itself was disturbed (a busy host) or the model's kernels beat a plain 1024^3 MatMul.

Prints the CPU model and ISA flags first. Figures from a shared host vary run to run: the interleaving
spreads other processes' load over all variants alike.

Usage: python benchmarks/quant_peers.py [--examples digits,convnet64] [--rounds 7] [--window 0.4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ["onnx", "onnx_int8_static", "openvino", "openvino_int8"]
DEFAULT_RECIPE = "quantize_static(QDQ, per_channel=True, activations QInt8, weights QInt8, calibration minmax)"


def gemm_ceiling(n: int = 1024, seconds: float = 3.0, threads: int = 1) -> dict[str, float]:
    """FP32 MatMul GFLOP/s (onnxruntime, numpy) and u8s8 MatMulInteger GOP/s (onnxruntime) at n^3."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def session(op, a_type, b_type, out_type):
        node = helper.make_node(op, ["a", "b"], ["c"])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", a_type, [n, n]),
                                                helper.make_tensor_value_info("b", b_type, [n, n])],
                                  [helper.make_tensor_value_info("c", out_type, [n, n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def rates(calls: dict) -> dict[str, float]:
        """The best GFLOP/s of each call, the calls taking turns (a busy host slows all alike)."""
        best = {name: 0.0 for name in calls}
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                best[name] = max(best[name], 2.0 * n ** 3 / (time.perf_counter() - start) / 1e9)
        return best

    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    fp32 = session("MatMul", TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.FLOAT)
    ua, sb = rng.integers(0, 255, (n, n), dtype=np.uint8), rng.integers(-127, 127, (n, n), dtype=np.int8)
    int8 = session("MatMulInteger", TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32)
    return rates({"ort_fp32": lambda: fp32.run(None, {"a": a, "b": b}), "numpy_fp32": lambda: a @ b,
                  "ort_u8s8": lambda: int8.run(None, {"a": ua, "b": sb})})


def gflop_per_sample(onnx_path: Path) -> float:
    """2 x multiply-adds of Conv / Gemm / MatMul for one sample (shapes inferred at batch 1)."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = onnx.load(str(onnx_path))
    for tensor in model.graph.input:
        for dim in tensor.type.tensor_type.shape.dim:
            if dim.dim_param or dim.dim_value == 0:
                dim.Clear()
                dim.dim_value = 1
    model = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    weights = {t.name: list(numpy_helper.to_array(t).shape) for t in model.graph.initializer}
    shapes.update(weights)
    macs = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            w, out = shapes.get(node.input[1]), shapes.get(node.output[0])
            if w and out:
                macs += int(np.prod(out[1:])) * int(np.prod(w[1:]))
        elif node.op_type in ("Gemm", "MatMul"):
            a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
            if a and b:
                transposed = node.op_type == "Gemm" and any(x.name == "transB" and x.i for x in node.attribute)
                n = b[0] if transposed else b[-1]
                macs += int(np.prod(a)) * n
    return 2.0 * macs / 1e9


def ort_default_int8(onnx_path: Path, calibration: dict[str, np.ndarray], target: Path) -> Path:
    """onnxruntime's quantize_static as its docs show it: QDQ, S8S8, per-channel, MinMax (pre-processed)."""
    import contextlib
    import io
    import warnings

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    feeds = [{k: v[i:i + 16] for k, v in calibration.items()} for i in range(0, len(next(iter(calibration.values()))), 16)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    pre = target.with_name("pre.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(target.parent):
        warnings.simplefilter("ignore")
        quant_pre_process(str(onnx_path), str(pre))
        quantize_static(str(pre), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return target


def interleaved(calls: dict[str, object], rounds: int, window: float, batch: int) -> dict[str, float]:
    """Median inferences/s of ``rounds`` windows per call, the calls taking turns window by window."""
    rates = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < window:
                call()
                done += 1
            rates[name].append(done * batch / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def top1(run, inputs: dict[str, np.ndarray], labels: np.ndarray, output: str, batch: int) -> float:
    count = len(labels)
    hits = 0
    for i in range(0, count, batch):
        logits = run({k: v[i:i + batch] for k, v in inputs.items()})[output]
        hits += int((np.argmax(logits, axis=-1) == labels[i:i + batch]).sum())
    return 100.0 * hits / count


def bench_example(example: str, work: Path, rounds: int, window: float, ceiling: dict[str, float],
                  threads: int) -> list[str]:
    from builder.pipeline import build
    from builder.model.runtime import open_runner
    from builder.spec.model import load_spec
    from builder.accuracy.tensors import top1_accuracy

    spec_path = ROOT / "examples" / example / "spec.yaml"
    spec = load_spec(spec_path)
    repo = work / example
    started = time.perf_counter()
    result = build(spec_path, repo, variants=VARIANTS, benchmark_seconds=2.0, publish_variants=True,
                   progress=lambda m: None)
    build_s = time.perf_counter() - started
    ctx = result.context
    published = ctx.selected.name
    folders = {}
    for folder in repo.iterdir():
        meta = folder / "1" / "metadata.yaml"
        if meta.is_file():
            folders[yaml.safe_load(meta.read_text())["artifact"]["variant"]] = folder / "1"
    onnx_file = folders["onnx"] / "model.onnx"
    names = ([o.name for o in spec.outputs], [t.name for t in spec.inputs])
    with np.load(spec.data.calibration) as archive:
        calibration = {t.name: archive[t.name].astype(t.dtype)[:spec.quantization.calibration_samples]
                       for t in spec.inputs}
    peers_dir = work / f"{example}_peers"
    peers_dir.mkdir()
    files = {"ONNX Runtime FP32": ("onnx", onnx_file),
             "ORT quantize_static default (QDQ S8S8 per-channel MinMax)": ("onnx", ort_default_int8(
                 onnx_file, calibration, peers_dir / "model.onnx"))}
    labels = {"onnx_int8_static": "ours: onnx_int8_static (search)", "openvino": "OpenVINO FP32",
              "openvino_int8": "OpenVINO INT8 (NNCF)"}
    for variant, label in labels.items():
        if variant in folders:
            files[label] = ("openvino" if variant.startswith("openvino") else "onnx",
                            folders[variant] / ("model.xml" if variant.startswith("openvino") else "model.onnx"))
    notes = [f"{v.name}: rejected ({v.rejected.splitlines()[0]})" for v in ctx.variants if v.rejected
             and v.name in labels]
    with np.load(spec.data.validation) as archive:
        val = {t.name: archive[t.name].astype(t.dtype) for t in spec.inputs}
        y = archive["labels"]
    batch = spec.max_batch_size
    feed = {k: np.ascontiguousarray(v[:batch]) for k, v in val.items()}
    runners = {label: open_runner(fmt, path, *names, threads=threads) for label, (fmt, path) in files.items()}
    first = names[0][0]
    accuracy = {label: top1(run, val, y, first, batch) for label, run in runners.items()}
    ref_top1 = top1_accuracy(ctx.reference.validation_outputs[first], ctx.reference.labels)
    speed = interleaved({label: (lambda run=run: run(feed)) for label, run in runners.items()}, rounds, window, batch)
    gflop = gflop_per_sample(onnx_file)
    fp32 = speed["ONNX Runtime FP32"]
    published_label = {"onnx": "ONNX Runtime FP32", **labels}.get(published, published)
    peers = {k: v for k, v in speed.items() if k != published_label and not k.startswith("ours")}
    best_peer = max(peers, key=peers.get)
    lines = [f"## {example}: {gflop:.4f} GFLOP/sample, batch {batch}, {threads} threads; build {build_s:.0f} s; "
             f"published: {published} ({ctx.selected.selection_reason[:110]})",
             f"{'variant':58s} {'inf/s':>9s} {'x FP32':>7s} {'top-1 %':>8s} {'drop':>6s} {'of ceiling':>11s}"]
    for label in files:
        mark = " <- published" if label == published_label else ""
        limit = ceiling["fp32"] if "FP32" in label else ceiling["int8"]
        lines.append(f"{label:58s} {speed[label]:9.0f} {speed[label] / fp32:7.2f} {accuracy[label]:8.2f} "
                     f"{ref_top1 - accuracy[label]:+6.2f} {speed[label] * gflop / limit:11.2f}{mark}")
    lines.append(f"reference top-1 (PyTorch) {ref_top1:.2f} %; published / best other peer ({best_peer}): "
                 f"{speed[published_label] / speed[best_peer]:.2f}x; of ceiling = inf/s x GFLOP/sample / the "
                 "FP32 GEMM GFLOP/s (INT8 rows: / the u8s8 GEMM GOP/s)")
    lines += [f"note: {n}" for n in notes]
    search = ctx.variant("onnx_int8_static")
    if search is not None:
        lines += [n for n in search.notes if n.startswith("search:")]
        if search.passes and search.passes[-1] == DEFAULT_RECIPE:
            lines.append("(ours kept the default recipe: ours and the ORT default are the same model, so the gap "
                         "between their figures is this run's measurement noise)")
    return lines


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from builder.core.host import host_profile, usable_cores
    from builder.model.measure import load_average

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default="digits,convnet64")
    parser.add_argument("--rounds", type=int, default=9, help="windows per variant (default %(default)s)")
    parser.add_argument("--window", type=float, default=0.4, help="seconds per window (default %(default)s)")
    args = parser.parse_args(argv)
    host = host_profile(with_gpu=False)
    threads = usable_cores()
    print(f"host: {host['cpu_model']}; ISA flags: {', '.join(host['isa_flags'])} ({host['isa_class']}); "
          f"{threads} usable cores; load average {load_average()} (a shared host: other processes disturb windows)")
    ceiling = gemm_ceiling(threads=threads)
    print(f"GEMM 1024^3 ceiling ({threads} threads): onnxruntime MatMul FP32 {ceiling['ort_fp32']:.1f} GFLOP/s, "
          f"numpy FP32 {ceiling['numpy_fp32']:.1f} GFLOP/s, onnxruntime MatMulInteger u8s8 {ceiling['ort_u8s8']:.1f} "
          f"GOP/s ({ceiling['ort_u8s8'] / ceiling['ort_fp32']:.2f}x FP32: the headroom INT8 has here)")
    top = {"fp32": max(ceiling["ort_fp32"], ceiling["numpy_fp32"]), "int8": ceiling["ort_u8s8"]}
    with tempfile.TemporaryDirectory(prefix="quant-peers-") as tmp:
        for example in args.examples.split(","):
            print()
            print("\n".join(bench_example(example.strip(), Path(tmp), args.rounds, args.window, top, threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
