"""Stage `benchmark`: measure every variant that passed verification, so selection goes by numbers.

In-process on this machine with intra-op threads = the cores this process may use (onnxruntime
``intra_op_num_threads``, ``torch.set_num_threads``), per variant: file size; warm-up; latency
p50/p95/p99 at batch 1; throughput (inferences/s) at batch 1, 2, 4, ... up to max_batch_size; the
RSS growth from loading it and running its largest batch (peak memory, approximate: allocator caches
included).

Each batch size is measured in windows repeated until the last three agree within 10 %
(perf_analyzer's stability rule, builder/model/measure.py) or the variant's share of its time cap is
spent (``--benchmark-seconds``, default 2 s per variant; every batch size gets at least one
window; 0 skips the stage). The variants take turns window by window (round robin), so a burst of
load from other processes falls on all of them alike; models too big to hold together (over
``INTERLEAVE_LIMIT_MB`` in all) are measured one after the other instead.

A close call is measured again: when the leader's margin over the runner-up (on the spec's
objective) is inside what the windows can tell apart - the larger of their spreads and
``CONFIRM_NOISE`` - every measured variant is measured once more, in turns as in the first round,
at the batch sizes that decide the call and each variant's best batch (``confirmation_batches``):
the two for another cap, the others for the time the first round gave them at those batch sizes
(their figures need to come from the same round, not to be more precise than before). Each
variant's best throughput (and p50 at batch 1 when batch 1 is among them) is then taken from that
round alone (the first figures stay under ``confirmed.first_round``): the ranking, the "x onnx"
ratios and the selection's reasons all read numbers taken side by side, never the pair's second
figures against the others' first ones.
"""

from __future__ import annotations

import gc
import time
from typing import Callable

import numpy as np

from builder.accuracy.tensors import generated_inputs
from builder.huggingface.step_timing import time_steps
from builder.model.measure import (STABLE_TOLERANCE, STABLE_WINDOWS, batch_sizes, cpu_cores, human, load_average,
                                   measure_round_robin, rss_mb, warm_up)
from builder.model.runtime import open_runner
from builder.optimise.openvino_tools import version
from builder.stages.base import BuildContext, StageResult, Variant

STAGE = "benchmark"
DEFAULT_SECONDS = 2.0  # cap per variant: 6 digits variants measure in under ~15 s
MIN_WINDOW_SECONDS = 0.02
MAX_WINDOW_SECONDS = 1.0
INTERLEAVE_LIMIT_MB = 1000.0  # above this (all variants' files together) measure one variant at a time
CONFIRM_NOISE = 0.05  # margins below this (or below the windows' spread) are re-measured head to head
# a variant this far behind the leader at batch 1 and the largest batch is not measured at the batch sizes between:
# throughput grows or levels off with the batch, it does not jump 1.5x between the ends and back
FAR_BEHIND = 1.5


def _inputs(ctx: BuildContext, batch: int) -> tuple[dict[str, np.ndarray], str]:
    spec, ref = ctx.spec, ctx.reference
    if ref is not None and ref.validation_inputs is not None and not spec.has_dynamic_dims:
        if not spec.batching:
            return dict(ref.validation_inputs), "validation inputs"
        count = len(next(iter(ref.validation_inputs.values())))
        index = np.arange(batch) % count
        return ({n: np.ascontiguousarray(v[index]) for n, v in ref.validation_inputs.items()},
                "validation inputs")
    rng = np.random.default_rng(spec.verify.seed + 11)
    dyn = "opt" if spec.has_dynamic_dims else 0
    where = "generated inputs" + (" (dynamic dims at their opt_shape sizes)" if dyn else "")
    return generated_inputs(spec, batch if spec.batching else None, dyn, rng), where


def _order(sizes: list[int]) -> list[int]:
    """Batch 1 first (latency), then the largest (usually the best throughput), then the rest."""
    return list(dict.fromkeys([sizes[0], sizes[-1], *sizes[1:-1]]))


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def measuring_device(ctx: BuildContext, variant: Variant, gpu_here: bool) -> str:
    """Where a variant is measured: plans on the GPU; TorchScript on the GPU when the version serves on a
    GPU instance and this machine has one (``gpu_here``); everything else on this machine's CPU."""
    if variant.format == "plan":
        return "cuda"
    if variant.format == "torchscript" and gpu_here and ctx.spec.deploy.kind_for(ctx.target) == "KIND_GPU":
        return "cuda"
    return "cpu"


def _runtime(variant: Variant, threads: int, device: str = "cpu") -> str:
    if variant.format == "torchscript" and device != "cpu":
        import torch
        return (f"libtorch {torch.__version__} on {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}); "
                "inputs copied to the GPU and outputs back on every call")
    if variant.format == "onnx":
        import onnxruntime as ort
        return f"onnxruntime {ort.__version__} CPUExecutionProvider, intra_op_num_threads={threads} (all cores)"
    if variant.format == "plan":
        return "TensorRT on the first CUDA GPU (builder.model.runtime plan runner)"
    if variant.format == "openvino":
        return (f"openvino {version()} CPU plugin, PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS={threads}, "
                "inference precision f32, one synchronous request")
    import torch
    return f"libtorch {torch.__version__} CPU, torch.set_num_threads({threads}) (all cores)"


def _open(ctx: BuildContext, variant: Variant, feeds: dict, sizes: list[int], threads: int) -> tuple[Callable, dict]:
    """Load the variant and warm it up (batch 1 and the largest); RSS growth and load time."""
    gc.collect()
    before = rss_mb()
    start = time.perf_counter()
    device = measuring_device(ctx, variant, cuda_available())
    run = open_runner(variant.format, variant.path, [o.name for o in ctx.spec.outputs],
                      [t.name for t in ctx.spec.inputs], threads=threads, device=device)
    loaded = time.perf_counter() - start
    for b in (sizes[0], sizes[-1]):
        warm_up(lambda: run(feeds[b][0]))
    return run, {"load_seconds": round(loaded, 3), "peak_memory_mb": round(max(rss_mb() - before, 0.0), 1),
                 "device": device}


def far_behind(rates: dict[str, dict[int, float]], selectable: set[str],
               factor: float = FAR_BEHIND) -> tuple[list[str], str]:
    """The variants whose every throughput so far (``rates``: name -> {batch: inf/s}, the same batch sizes each)
    is below 1/``factor`` of the best figure of a ``selectable`` variant - they cannot win at the batch sizes
    between - and why, in one phrase."""
    figures = [(rate, name, b) for name, by_batch in rates.items() if name in selectable
               for b, rate in by_batch.items()]
    if not figures:
        return [], ""
    top, leader, at = max(figures)
    names = [name for name, by_batch in rates.items() if by_batch and max(by_batch.values()) * factor < top]
    if not names:
        return [], ""
    measured = sorted({b for name in names for b in rates[name]})
    return names, (f"below 1/{factor:g} of {leader}'s {human(top)} inf/s (batch {at}) at batch "
                   f"{' and '.join(map(str, measured))}")


def warmed_by_open(fmt: str, batch: int, sizes: list[int]) -> bool:
    """Whether ``_open`` has already warmed a runner up at ``batch`` with the feed it is measured on (batch 1 and
    the largest): another warm-up there buys nothing for onnxruntime, OpenVINO and TensorRT, whose first call
    at a shape does the one-time work. TorchScript is warmed again right before each batch size: its profiling
    executor re-specialises when the shape changes (the largest batch came between)."""
    return fmt != "torchscript" and batch in (sizes[0], sizes[-1])


def _shares(batches: list[int]) -> dict[int, int]:
    """Each batch size's share of a variant's cap: batch 1 twice (its latency percentiles need more calls)."""
    return {b: 2 if b == 1 else 1 for b in batches}


def benchmark_group(ctx: BuildContext, group: list[Variant], cap: float | dict[str, float], threads: int,
                    failed: dict[str, str], batches: list[int] | None = None, window: float | None = None,
                    label: str = "batch", selectable: set[str] | None = None) -> dict[str, dict]:
    """Measure the variants of ``group`` together (round robin); returns {name: benchmark record}.
    ``cap``: seconds of windows per variant (one for all, or by name). ``batches`` (default: every batch
    size) and ``window`` (default: from the cap) serve the confirmation round, whose records hold those
    batches only (``merge_confirmed``). ``selectable``: the variants that may be published; given, a variant
    ``far_behind`` the best of them at batch 1 and the largest is not measured at the sizes between."""
    spec = ctx.spec
    sizes = batch_sizes(spec.max_batch_size) if spec.batching else [1]
    order = _order(sizes) if batches is None else list(batches)
    feeds = {b: _inputs(ctx, b) for b in dict.fromkeys([*order, sizes[0], sizes[-1]])}  # + _open's warm-up sizes
    runners, records = {}, {}
    for variant in group:
        try:
            runners[variant.name], records[variant.name] = _open(ctx, variant, feeds, sizes, threads)
        except Exception as exc:  # noqa: BLE001 - recorded per variant
            failed[variant.name] = " ".join(str(exc).split())[:300] or type(exc).__name__
    shares = _shares(order)
    caps_total = cap if isinstance(cap, dict) else {v.name: cap for v in group}
    if window is None:
        longest = max(caps_total.values(), default=0.0)
        window = min(MAX_WINDOW_SECONDS, max(MIN_WINDOW_SECONDS, longest / (sum(shares.values()) * 5)))
    spent = {name: 0.0 for name in runners}
    results: dict[str, dict] = {name: {} for name in runners}
    formats = {v.name: v.format for v in group}
    behind, why_behind = [], ""
    for i, b in enumerate(order):
        if selectable is not None and batches is None and i == 2:  # batch 1 and the largest are measured
            behind, why_behind = far_behind({name: {x: m.throughput for x, m in results[name].items()}
                                             for name in runners}, selectable)
            for name in behind:
                del runners[name]
            if behind:
                ctx.progress(f"    batch {', '.join(map(str, order[2:]))}: not measuring {', '.join(behind)} "
                             f"({why_behind})")
        todo = sum(shares[x] for x in order[i:])
        calls, caps = {}, {}
        for name, run in list(runners.items()):
            feed = feeds[b][0]
            try:
                if not warmed_by_open(formats[name], b, sizes):
                    warm_up(lambda: run(feed))  # a JIT (TorchScript profiling executor) specialises per shape
            except Exception as exc:  # noqa: BLE001
                failed[name] = " ".join(str(exc).split())[:300] or type(exc).__name__
                del runners[name]
                continue
            calls[name] = (lambda run=run, feed=feed: run(feed))
            # every batch size gets at least one window; the cap limits the repeats
            caps[name] = max(caps_total[name] - spent[name], 0.0) * shares[b] / todo
        if not calls:
            break
        started = time.perf_counter()
        measured = measure_round_robin(calls, b if spec.batching else 1, window_seconds=window, max_seconds=caps)
        for name, m in measured.items():
            results[name][b] = m
            spent[name] += sum(w.seconds for w in m.windows)
        ctx.progress(f"    {label} {b}: " + ", ".join(f"{n} {human(m.throughput)}/s" for n, m in measured.items())
                     + f" ({time.perf_counter() - started:.1f} s)")
    runners.clear()
    gc.collect()

    out = {}
    for variant in group:
        if variant.name in failed or variant.name not in results:
            continue
        res = results[variant.name]
        by_batch = {b: round(res[b].throughput, 1) for b in sizes if b in res}
        if not by_batch:
            continue
        best_batch = max(by_batch, key=by_batch.get)
        out[variant.name] = {
            "latency_ms_b1": ({k: round(v, 4) for k, v in res[sizes[0]].percentiles_ms().items()}
                              if sizes[0] in res else None),
            "throughput_by_batch": by_batch,
            "best_throughput": by_batch[best_batch],
            "best_batch": best_batch,
            "threads": threads,
            **records[variant.name],
            "windows": {b: len(m.windows) for b, m in res.items()},
            "stable": {b: m.stable for b, m in res.items()},
            "spread": {b: round(m.spread, 3) for b, m in res.items()},
            "seconds": round(spent[variant.name], 2),
            "size_mb": round(variant.size_mb, 3),
            "window_seconds": round(window, 3),
            "inputs": feeds[sizes[0]][1],
            **({"not_measured": {"batches": [b for b in order if b not in res],
                                 "why": f"{why_behind}: cannot win at the batch sizes between"}}
               if variant.name in behind else {}),
            "measured_with": [v.name for v in group if v.name in results],
            "load_average": load_average(),
            "runtime": _runtime(variant, threads, records[variant.name].get("device", "cpu")),
            "rule": f"windows repeated until the last {STABLE_WINDOWS} agree within {STABLE_TOLERANCE:.0%} "
                    f"(throughput and p50 latency) or {caps_total[variant.name]:g} s of windows per variant; if never "
                    f"stable, the {STABLE_WINDOWS} fastest windows; variants measured in turns, window by window",
        }
    return out


def close_call(leader: float, runner_up: float, spreads: list[float], noise: float = CONFIRM_NOISE) -> bool:
    """True when ``leader`` (higher is better) beats ``runner_up`` by no more than the measurement can
    tell apart: the larger of ``noise`` and the windows' spreads (max / min - 1) behind the two figures."""
    if runner_up <= 0 or leader <= 0:
        return False
    finite = [x for x in spreads if x == x and x != float("inf")]
    return leader / runner_up - 1.0 <= max([noise, *finite])


def _score(bench: dict, objective: str) -> float | None:
    """Higher is better: best throughput, or 1 / p50 at batch 1 (latency; the tradeoff's J reads it)."""
    if objective == "throughput":
        return bench.get("best_throughput")
    p50 = (bench.get("latency_ms_b1") or {}).get("p50")
    return 1.0 / p50 if p50 else None


def finalists(variants: list[Variant], objective: str) -> tuple[list[Variant], list[int]] | None:
    """The leader and runner-up, and the batch sizes to re-measure them at, when their figures are a
    close call (see ``close_call``); None otherwise."""
    scored = [(v, _score(v.benchmark or {}, objective)) for v in variants if v.benchmark]
    scored = sorted([(v, x) for v, x in scored if x], key=lambda item: -item[1])
    if len(scored) < 2:
        return None
    (a, x), (b, y) = scored[:2]
    batches = sorted({a.benchmark["best_batch"], b.benchmark["best_batch"]}) if objective == "throughput" else [1]
    spreads = [v.benchmark["spread"].get(k, float("inf")) for v in (a, b) for k in batches]
    return ([a, b], batches) if close_call(x, y, spreads) else None


def confirmation_batches(measured: list[Variant], decisive: list[int]) -> list[int]:
    """The batch sizes of a confirmation round: those that decide the close call and every measured
    variant's best batch, so that each variant's ranked figure and its "x onnx" ratio come from that round."""
    return sorted({*decisive, *(v.benchmark["best_batch"] for v in measured)})


def merge_confirmed(variant: Variant, record: dict, pair: list[str], measured_with: list[str]) -> None:
    """Put a confirmation round's ``record`` (``benchmark_group`` at the round's batches) into ``variant``'s
    benchmark record; the first round's figures that it replaces stay under ``confirmed.first_round``."""
    bench, batches = variant.benchmark, sorted(record["throughput_by_batch"])
    first = {"throughput_by_batch": {b: bench["throughput_by_batch"].get(b) for b in batches},
             "best_batch": bench["best_batch"], "best_throughput": bench["best_throughput"]}
    for key in ("throughput_by_batch", "stable", "spread", "windows"):
        bench[key].update(record[key])
    if record["latency_ms_b1"] is not None:
        first["latency_ms_b1"] = bench["latency_ms_b1"]
        bench["latency_ms_b1"] = record["latency_ms_b1"]
    # the best of this round only: a first-round figure at another batch size may read higher, but ranking
    # it against the others' second-round figures is the mix this round exists to avoid
    bench["best_batch"], bench["best_throughput"] = record["best_batch"], record["best_throughput"]
    bench["seconds"] = round(bench["seconds"] + record["seconds"], 2)
    bench["confirmed"] = {
        "batches": batches, "pair": pair, "measured_with": measured_with, "first_round": first,
        "why": f"{' and '.join(pair)} were a close call: every measured variant was measured again at these "
               "batch sizes; best_throughput (and p50 when batch 1 is among them) come from that round alone"}


def confirm_round(ctx: BuildContext, measured: list[Variant], pair: list[Variant], batches: list[int], cap: float,
                  threads: int, together: bool, failed: dict[str, str]) -> None:
    """Measure every variant of ``measured`` again at ``batches`` (in turns when ``together``, else one at
    a time, as the first round) and rank by that round (``merge_confirmed``). Every variant, not only the
    pair: the selection ranks them all and states ratios against the winner and onnx, so a figure left
    from the first round would be compared across rounds. The pair gets another ``cap``; the others the
    first round's time at ``batches``: the round costs two caps and a fraction of one per other variant,
    not a cap per variant."""
    window = max(v.benchmark["window_seconds"] for v in measured)
    sizes = batch_sizes(ctx.spec.max_batch_size) if ctx.spec.batching else [1]
    share = sum(_shares(batches).values()) / sum(_shares(sizes).values())
    caps = {v.name: cap if v.name in {p.name for p in pair} else cap * min(share, 1.0) for v in measured}
    names = [v.name for v in measured]
    before = set(failed)
    merged = set()
    for group in ([measured] if together else [[v] for v in measured]):
        for name, record in benchmark_group(ctx, group, caps, threads, failed, batches, window,
                                            "confirming at batch").items():
            merge_confirmed(ctx.variant(name), record, [v.name for v in pair], names)
            merged.add(name)
    for v in measured:
        if v.name not in merged:  # its first figures alone would be ranked against the others' second ones
            why = failed.get(v.name) if v.name not in before else None
            failed[v.name] = f"when measured again (a close call): {why or 'no figures'}"
            v.benchmark = None


def run(ctx: BuildContext) -> StageResult:
    cap = ctx.options.benchmark_seconds
    cap = DEFAULT_SECONDS if cap is None else cap
    if cap <= 0:
        return StageResult.skipped(STAGE, "measuring disabled (--benchmark-seconds 0): selection falls back to "
                                          "the target's preference order")
    candidates = [v for v in ctx.variants if v.verified]
    if not candidates:
        return StageResult.skipped(STAGE, "no variant passed verification: nothing to measure")
    threads = cpu_cores()
    load = load_average()
    if load is not None and load > 0.5 * threads:
        ctx.notes.append(f"the machine was busy when measuring (load average {load} on {threads} cores): "
                         "other processes disturb the numbers; measurements that never settled are marked")
    if ctx.spec.deploy.kind_for(ctx.target) == "KIND_GPU":
        if cuda_available():
            ctx.notes.append("TorchScript variants (and TensorRT plans) measured on this machine's GPU, the others on "
                             "its CPU (onnxruntime CPUExecutionProvider): selection ranks the GPU-measured ones")
        else:
            ctx.notes.append("measured on this machine's CPU (onnxruntime CPUExecutionProvider / LibTorch CPU): "
                             "on the GPU serving host the ranking may differ")
    together = sum(v.size_mb for v in candidates) <= INTERLEAVE_LIMIT_MB
    groups = [candidates] if together else [[v] for v in candidates]
    ctx.progress(f"  measuring {', '.join(v.name for v in candidates)} (up to {cap:g} s each, {threads} threads"
                 f"{', in turns' if together and len(candidates) > 1 else ''}) ...")
    failed: dict[str, str] = {}
    # the intermediate batch sizes are skipped for variants far behind on throughput only; a text pipeline ranks
    # its variants by how they batch as served (select's served_text_rate), which reads every batch size
    selectable = ({v.name for v in candidates if v.name not in ctx.base_only}
                  if ctx.spec.objective == "throughput" and ctx.pipeline is None else None)
    torch, restore = None, None
    if any(v.format == "torchscript" for v in candidates):
        import torch  # the TorchScript variants run on torch's intra-op pool
        restore = torch.get_num_threads()
        torch.set_num_threads(threads)
    try:
        for group in groups:
            for name, bench in benchmark_group(ctx, group, cap, threads, failed, selectable=selectable).items():
                ctx.variant(name).benchmark = bench
        measured = [v for v in candidates if v.name not in failed and v.benchmark]
        close = finalists([v for v in measured if v.name not in ctx.base_only], ctx.spec.objective)
        if close is not None:
            pair, decisive = close
            batches = confirmation_batches(measured, decisive)
            ctx.progress(f"  {pair[0].name} and {pair[1].name} are a close call: measuring all {len(measured)} "
                         f"variants again at batch {', '.join(map(str, batches))}")
            confirm_round(ctx, measured, pair, batches, cap, threads, together, failed)
    finally:
        if torch is not None:
            torch.set_num_threads(restore)
    summary = {}
    for variant in candidates:
        if variant.name in failed:
            variant.notes.append(f"benchmark failed: {failed[variant.name]}")
            continue
        bench = variant.benchmark
        unstable = [str(b) for b, ok in bench["stable"].items() if not ok]
        summary[variant.name] = (f"p50 {bench['latency_ms_b1'].get('p50', 0):.3f} ms at b=1, "
                                 f"{human(bench['best_throughput'])} inf/s at b={bench['best_batch']}")
        ctx.progress(f"  {variant.name}: {summary[variant.name]}"
                     + (f" (not stable within the cap at batch {', '.join(unstable)})" if unstable else ""))
    if ctx.pipeline is not None and summary:  # the build report's split of a request's time between the steps
        ctx.step_timings.update(time_steps(ctx.pipeline, seconds=min(1.0, cap / 4)))
    text = "; ".join([f"{k}: {v}" for k, v in summary.items()] + [f"{k} FAILED: {v}" for k, v in failed.items()])
    outputs = {"threads": threads, "cap_seconds": cap, "measured": summary, "failed": failed,
               "interleaved": together}
    if not summary:
        return StageResult.fail(STAGE, text, **outputs)
    return StageResult.ok(STAGE, f"{threads} threads; " + text, **outputs)
