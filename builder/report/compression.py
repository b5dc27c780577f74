"""The report's compression view: size, parameters, FLOPs, speed and accuracy per variant, how each
was verified, and the Pareto front of accuracy against speed (builder/report/build_report.py draws it).

Usage::

    pareto_front([("onnx", 1.0, 0.0), ("onnx_pruned", 1.9, 0.0), ("slow", 0.8, 0.5)])
    # ['onnx_pruned']: nothing is both at least as fast and at least as accurate
    compression_lines(rows)   # the "## Compression" markdown section ([] when no row has model stats)
"""

from __future__ import annotations

from typing import Any


def pareto_front(points: list[tuple[str, float, float]]) -> list[str]:
    """Names of the points (name, speed-up: higher is better, accuracy drop: lower is better) that no
    other point beats on one axis while matching it on the other; ordered by speed."""
    front = []
    for name, x, y in points:
        dominated = any((ox >= x and oy <= y) and (ox > x or oy < y) for other, ox, oy in points if other != name)
        if not dominated:
            front.append((x, name))
    return [name for _, name in sorted(front)]


def row_fields(variant) -> dict[str, Any]:
    """The compression columns of one variant's report row."""
    stats = variant.stats or {}
    return {"verified_by": variant.verified_by, "params": stats.get("params"), "flops": stats.get("flops"),
            "accuracy": (variant.accuracy or {}).get("variant"), "compression": variant.compression}


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def compression_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not any(r.get("params") for r in rows):
        return []
    measured = [(r["variant"], r["x onnx"], r["acc drop"]) for r in rows
                if r.get("x onnx") is not None and r.get("acc drop") is not None and r["eligible"]]
    front = set(pareto_front(measured))
    lines = ["", "## Compression", "",
             "Variants from stage compress change the function by design: they are verified by task accuracy on the "
             "labelled validation data within verify.max_accuracy_drop (not by closeness to the reference), and "
             "their published reference.npz holds their own outputs, which `check` compares the served answers "
             "with. Unstructured (mask) pruning is not offered: zeros in a dense weight make no dense kernel faster.",
             "", "| variant | verified by | params | MFLOPs/sample | size MB | p50 ms (b=1) | best inf/s | x onnx | "
                 "top-1 % | drop | Pareto |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verified = "task accuracy" if r.get("verified_by") == "task_accuracy" else "closeness to the reference"
        flops = None if r.get("flops") is None else r["flops"] / 1e6
        lines.append(f"| {r['variant']} | verified by {verified} | {_cell(r.get('params'), ',')} | "
                     f"{_cell(flops, '.3f')} | {_cell(r['size MB'], '.3f')} | {_cell(r['p50 ms (b=1)'], '.3f')} | "
                     f"{_cell(r['throughput'], '.0f')} | {_cell(r['x onnx'], '.2f')} | {_cell(r.get('accuracy'), '.2f')} | "
                     f"{_cell(r['acc drop'], '+.2f')} | {'yes' if r['variant'] in front else ''} |")
    lines += _qat_vs_ptq(rows)
    for r in rows:
        record = r.get("compression") or {}
        if record:
            lines.append(f"- **{r['variant']}**: {record.get('method')}; "
                         + "; ".join(f"{k} {record[k]}" for k in ("ratio", "student", "stopped_by", "training", "budget")
                                     if record.get(k) is not None))
    return lines


def _qat_vs_ptq(rows: list[dict[str, Any]]) -> list[str]:
    """onnx_qat_int8 next to the post-training onnx_int8_static, on accuracy and speed."""
    by_name = {r["variant"]: r for r in rows}
    qat, ptq = by_name.get("onnx_qat_int8"), by_name.get("onnx_int8_static")
    if qat is None:
        return []
    if ptq is None:
        return ["", "onnx_qat_int8 vs post-training INT8: build onnx_int8_static too (--variants ...,onnx_int8_static) "
                    "to compare them here."]
    return ["", f"onnx_qat_int8 (quantisation-aware) vs onnx_int8_static (post-training): top-1 "
                f"{_cell(qat.get('accuracy'), '.2f')}% vs {_cell(ptq.get('accuracy'), '.2f')}%, best throughput "
                f"{_cell(qat['throughput'], '.0f')} vs {_cell(ptq['throughput'], '.0f')} inf/s, p50 (b=1) "
                f"{_cell(qat['p50 ms (b=1)'], '.3f')} vs {_cell(ptq['p50 ms (b=1)'], '.3f')} ms."]
