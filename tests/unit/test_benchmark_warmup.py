"""The benchmark stage warms each runner up once per input shape, not twice (builder/stages/benchmark.py): ``_open``
warms batch 1 and the largest batch on the feeds they are measured with, so the first round does not warm those
again for onnxruntime / OpenVINO runners (whose first call at a shape does the one-time work); TorchScript is
warmed again before every batch size (its profiling executor re-specialises after the shape changed). The
runners and the meter are injected: nothing depends on this host's speed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from builder.model.measure import WARMUP_CALLS, Measurement, Window
from builder.pipeline import BuildOptions
from builder.spec.model import load_spec
from builder.stages import benchmark
from builder.stages.base import BuildContext, Variant
from tests.conftest import EXAMPLES


def _meter(calls, items_per_call=1, **_):
    """Stands in for measure_round_robin without calling the runners: what they see is the warm-ups only."""
    windows = [Window(calls=3, items=3 * items_per_call, seconds=0.01, latencies_ms=[1.0] * 3) for _ in range(3)]
    return {name: Measurement(windows, True, windows) for name in calls}


def test_open_warms_batch_1_and_the_largest_once_except_torchscript(monkeypatch):
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")  # max_batch_size 64: batches 1, 2, 4, ... 64
    seen: dict[str, Counter] = {}

    def fake_open(ctx, variant, feeds, sizes, threads):
        counter = seen.setdefault(variant.name, Counter())

        def run(feed):
            counter[len(next(iter(feed.values())))] += 1

        for b in (sizes[0], sizes[-1]):  # what _open does: warm_up at batch 1 and the largest
            for _ in range(WARMUP_CALLS):
                run(feeds[b][0])
        return run, {"load_seconds": 0.0, "peak_memory_mb": 1.0}

    monkeypatch.setattr(benchmark, "_open", fake_open)
    monkeypatch.setattr(benchmark, "measure_round_robin", _meter)
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=Path("/nonexistent"), benchmark_seconds=0.5),
                       workdir=Path("/nonexistent"), progress=lambda _: None)
    group = [Variant("onnx", "onnx", "fp32", Path("/nonexistent/a.onnx"), verified=True),
             Variant("openvino", "openvino", "fp32", Path("/nonexistent/a.xml"), verified=True),
             Variant("torchscript", "torchscript", "fp32", Path("/nonexistent/a.pt"), verified=True)]
    failed: dict[str, str] = {}
    records = benchmark.benchmark_group(ctx, group, 0.5, 2, failed)
    assert not failed and set(records) == {"onnx", "openvino", "torchscript"}
    sizes = [1, 2, 4, 8, 16, 32, 64]
    for name in ("onnx", "openvino"):
        assert seen[name] == Counter({b: WARMUP_CALLS for b in sizes}), name  # once per shape
    assert seen["torchscript"] == Counter({b: WARMUP_CALLS * (2 if b in (1, 64) else 1) for b in sizes})
    for name in records:
        assert sorted(records[name]["throughput_by_batch"]) == sizes  # every batch size still measured


def test_warmed_by_open():
    sizes = [1, 2, 4, 8]
    assert benchmark.warmed_by_open("onnx", 1, sizes) and benchmark.warmed_by_open("openvino", 8, sizes)
    assert not benchmark.warmed_by_open("onnx", 4, sizes)
    assert not benchmark.warmed_by_open("torchscript", 1, sizes) and not benchmark.warmed_by_open("torchscript", 8, sizes)
