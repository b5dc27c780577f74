"""The build report: made from the pipeline's records (stage results and variants) only.

Usage::

    rows = variant_rows(ctx)          # list of dicts, one per variant
    print(format_table(rows))         # the summary table the CLI ends with
    files = report_files(ctx)         # {name: bytes}: build_report.md/.json/.png, for the published version
"""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path
from typing import Any

from builder.accuracy.tensors import worst_metric
from builder.report.compression import compression_lines, pareto_front, row_fields

COLUMNS = ["variant", "size MB", "exporter", "rel L2", "max abs", "acc drop", "p50 ms (b=1)",
           "throughput", "x onnx", "status"]
PLOT_NAME = "build_report.png"


def _worst(variant, key: str) -> float | None:
    """The worst ``key`` over the float outputs: integer and bool outputs are judged by their share of
    differing values (max_mismatch), so their rel L2 (2 flips in 400 bools: 1.6e-1) read as a breach."""
    metrics = (variant.verification or {}).get("metrics") or {}
    return worst_metric({name: m for name, m in metrics.items() if not m.get("integer")}, key)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def variant_rows(ctx) -> list[dict[str, Any]]:
    rows = []
    plain = next((v for v in ctx.variants if v.name == "onnx" and v.benchmark), None)
    for v in ctx.variants:
        bench = v.benchmark or {}
        if v.selected:
            status = f"published as {ctx.spec.name}"
        elif v.published_as:
            status = f"published as {v.published_as}"
        elif v.rejected:
            status = "rejected: " + v.rejected.splitlines()[0].rstrip(":")
        elif v.verified:
            status = "passed, not selected"
        else:
            status = "not verified"
        rows.append({
            "variant": v.name,
            "format": v.format,
            "precision": v.precision,
            "size MB": round(v.size_mb, 3) if v.path.exists() else None,
            "exporter": v.exporter or "-",
            "rel L2": _worst(v, "rel_l2"),
            "max abs": _worst(v, "max_abs"),
            "acc drop": (v.accuracy or {}).get("drop"),
            "p50 ms (b=1)": (bench.get("latency_ms_b1") or {}).get("p50"),
            "throughput": bench.get("best_throughput"),
            "x onnx": (bench["best_throughput"] / plain.benchmark["best_throughput"]
                       if plain is not None and bench.get("best_throughput") else None),
            "status": status,
            "precision_tolerance": (v.verification or {}).get("tolerance"),
            "throughput_by_batch": dict(bench.get("throughput_by_batch") or {}),
            "best_batch": bench.get("best_batch"),
            "selected": v.selected,
            "eligible": v.eligible,
            "why": v.selection_reason,
            "rejected": v.rejected,
            "notes": list(v.notes),
            "search": v.search,
            "tradeoff": bench.get("tradeoff"),  # objective tradeoff: J and its terms
            **row_fields(v),  # verified_by, params, flops, accuracy, compression (builder/report/compression.py)
        })
    made = {v.name for v in ctx.variants}
    rows += [_not_made_row(name, kind, why) for name, (kind, why) in ctx.not_made.items() if name not in made]
    return rows


def _not_made_row(name: str, kind: str, why: str) -> dict[str, Any]:
    """A requested variant no stage could make: in the table, so nothing asked for goes missing silently."""
    status = ("skipped: " if kind == "skipped" else "FAILED to make: ") + textwrap.shorten(why, 160, placeholder=" ...")
    return {"variant": name, "format": None, "precision": None, "size MB": None, "exporter": "-", "rel L2": None,
            "max abs": None, "acc drop": None, "p50 ms (b=1)": None, "throughput": None, "x onnx": None,
            "status": status, "precision_tolerance": None, "throughput_by_batch": {}, "best_batch": None,
            "selected": False, "eligible": False, "why": "", "rejected": status, "notes": [], "search": None,
            "tradeoff": None}


def format_table(rows: list[dict[str, Any]]) -> str:
    formats = {"size MB": ".3f", "rel L2": ".1e", "max abs": ".1e", "acc drop": "+.2f", "p50 ms (b=1)": ".3f",
               "throughput": ".0f", "x onnx": ".2f"}
    cells = [[_fmt(r[c], formats[c]) if c in formats else str(r[c]) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(COLUMNS)]
    line = lambda values: " | ".join(v.ljust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(COLUMNS), "-+-".join("-" * w for w in widths), *(line(r) for r in cells)])


def report_dict(ctx) -> dict[str, Any]:
    return {
        "model": ctx.spec.name,
        "target": ctx.target,
        "objective": ctx.spec.objective,
        "reference": ctx.reference_kind,
        "selected": ctx.selected.name if ctx.selected else None,
        "stages": [r.to_dict() for r in ctx.results],
        "variants": variant_rows(ctx),
        "notes": list(ctx.notes),
        **({"steps": step_rows(ctx)} if step_rows(ctx) else {}),
        "generated_inputs": generated_inputs(ctx),
        "variant_seconds": dict(ctx.variant_seconds),
    }


def generated_inputs(ctx) -> dict[str, str]:
    """{input: the rule that made its generated values}, as stage load recorded it ({} before it ran)."""
    load = next((r for r in ctx.results if r.stage == "load"), None)
    return dict(load.outputs.get("generated_inputs") or {}) if load else {}


def report_files(ctx) -> dict[str, bytes]:
    """build_report.png (when anything was measured), build_report.json and build_report.md, by name."""
    data = report_dict(ctx)
    files: dict[str, bytes] = {}
    try:
        png = plot_png(data["variants"], ctx.spec.verify.max_accuracy_drop)
        if png is not None:
            files[PLOT_NAME] = png
    except Exception as exc:  # noqa: BLE001 - a figure must never stop a publish; the report says why
        data["notes"].append(f"plot not drawn: {type(exc).__name__}: {exc}")
    files["build_report.json"] = json.dumps(data, indent=2, default=str).encode()
    lines = [f"# Build report: {ctx.spec.name}", "",
             f"- target: {ctx.target}; objective: {ctx.spec.objective}; reference: {ctx.reference_kind}",
             f"- selected: {data['selected']}", "", "## Variants", "", "```", format_table(data["variants"]), "```", ""]
    for row in data["variants"]:
        lines.append(f"- **{row['variant']}**: {row['why'] or row['status']}")
        lines.extend(f"  - {n}" for n in row["notes"] if "\n" not in n)  # tables get their own section
        if "\n" in row["rejected"]:  # a one-line reason is already in `why`
            lines.extend(f"  {line}" for line in row["rejected"].splitlines())
    if data["generated_inputs"]:  # which rule made each input's generated cases (builder/accuracy/input_rules.py)
        lines += ["## Generated inputs", ""] + [f"- {k}: {v}" for k, v in data["generated_inputs"].items()] + [""]
    lines += _measurement_lines(ctx) + step_lines(ctx) + _tradeoff_lines(data["variants"])
    lines += _search_lines(data["variants"])
    lines += compression_lines(data["variants"])
    if data["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    lines += ["", "## Stages", "", "| stage | status | seconds | reason |", "|---|---|---|---|"]
    lines += [f"| {r.stage} | {r.status.value} | {r.seconds:.2f} | {r.reason.splitlines()[0] if r.reason else ''} |"
              for r in ctx.results]
    if data["variant_seconds"]:  # where a stage's time went: the variants it made, one by one
        lines += ["", "Variants made (seconds, within their stage): "
                  + ", ".join(f"{name} {seconds:.1f}" for name, seconds in data["variant_seconds"].items()) + "."]
    for name in sorted(n for n in files if n.endswith(".png")):
        lines += ["", f"![{Path(name).stem}]({name})"]
    files["build_report.md"] = ("\n".join(lines) + "\n").encode()
    return files


def _tradeoff_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Objective tradeoff: J = alpha*accuracy - beta*latency - gamma*memory per measured variant."""
    scored = [r for r in rows if r.get("tradeoff")]
    if not scored:
        return []
    w = scored[0]["tradeoff"]
    lines = ["", f"## Objective J = {w['alpha']:g}*accuracy - {w['beta']:g}*p50 ms - {w['gamma']:g}*memory MB", "",
             "| variant | J | accuracy | p50 ms (b=1) | memory MB | status |", "|---|---|---|---|---|---|"]
    for r in sorted(scored, key=lambda r: -r["tradeoff"]["J"]):
        t = r["tradeoff"]
        lines.append(f"| {r['variant']} | {t['J']:.3f} | {t['accuracy']:.2f} | {t['latency_ms']:.3f} | "
                     f"{t['memory_mb']:.1f} | {r['status']} |")
    return lines


def _search_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The quantisation search table of each variant that ran one (builder/optimise/quant_search.py)."""
    lines = []
    for row in rows:
        if not row.get("search"):
            continue
        lines += ["", f"## Quantisation search: {row['variant']}", "",
                  "| # | candidate | changed | rel L2 | acc drop | vs FP32 | verdict |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(row["search"], 1):
            speed = "-" if r["speed_vs_fp32"] is None else f"{r['speed_vs_fp32']:.2f}x"
            lines.append(f"| {i} | {r['candidate']} | {r['changed']} | {_fmt(r['rel_l2'], '.3g')} | "
                         f"{_fmt(r['accuracy_drop'], '+.2f')} | {speed} | {r['verdict']} |")
        lines += [""] + [n for n in row["notes"] if n.startswith("search: ")]
    return lines


def _measurement_lines(ctx) -> list[str]:
    measured = [v for v in ctx.variants if v.benchmark]
    if not measured:
        return []
    batches = sorted({int(b) for v in measured for b in v.benchmark["throughput_by_batch"]})
    head = ["variant", *(f"b={b} inf/s" for b in batches), "p50/p95/p99 ms (b=1)", "threads", "peak MB", "stable"]
    runtimes = "; ".join(dict.fromkeys(v.benchmark.get("runtime", "") for v in measured))
    lines = ["", "## Measurements", "", f"Rule: {measured[0].benchmark.get('rule', '')}.", "",
             f"Runtimes: {runtimes}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in measured:
        bench = v.benchmark
        by_batch = {int(b): ips for b, ips in bench["throughput_by_batch"].items()}
        lat = bench.get("latency_ms_b1") or {}
        unstable = [str(b) for b, ok in (bench.get("stable") or {}).items() if not ok]
        cells = [v.name, *(_fmt(by_batch.get(b), ".0f") for b in batches),
                 "/".join(_fmt(lat.get(k), ".3f") for k in ("p50", "p95", "p99")), str(bench.get("threads", "-")),
                 _fmt(bench.get("peak_memory_mb"), ".1f"),
                 "yes" if not unstable else f"no at b={','.join(unstable)} (fastest 3 windows)"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def step_rows(ctx) -> list[dict[str, Any]]:
    """A Hugging Face pipeline's request split between its steps, in-process at batch 1 (stage benchmark timed the
    steps' own code; the model's figure is the selected variant's p50): [] for other models or unmeasured builds."""
    timings, selected = ctx.step_timings, ctx.selected
    lat = ((selected.benchmark or {}).get("latency_ms_b1") or {}) if selected is not None else {}
    if ctx.pipeline is None or "preprocess_us" not in timings or lat.get("p50") is None:
        return []
    name = ctx.spec.name
    rows = [{"step": f"{'image step' if ctx.pipeline.images else 'tokenizer'} ({name}__preprocess, python)",
             "us": timings["preprocess_us"]},
            {"step": f"model ({name}__model, {selected.name})", "us": lat["p50"] * 1000.0}]
    if timings.get("labels_in_graph"):
        rows.append({"step": f"post-processing (in {name}__model's graph: the folded label head)", "us": None})
    elif "postprocess_us" in timings:
        rows.append({"step": f"post-processing ({name}__postprocess, python)", "us": timings["postprocess_us"]})
    return rows


def step_lines(ctx) -> list[str]:
    rows = step_rows(ctx)
    if not rows:
        return []
    total = sum(r["us"] for r in rows if r["us"] is not None)
    lines = ["", "## Where a request's time goes (in-process, one request at a time)", "",
             "| step | us per request | share |", "|---|---|---|"]
    lines += [f"| {r['step']} | {_fmt(r['us'], ',.0f')} | "
              f"{'-' if r['us'] is None else format(r['us'] / total, '.1%')} |" for r in rows]
    python_steps = sum(1 for r in rows if r["step"].endswith("python)"))
    lines += ["", f"Served, each python step is also one python-backend call ({python_steps} here: about 0.3-1 ms "
              "each on 2 cores) and the ensemble hands tensors between steps: `triton-builder sweep "
              f"{ctx.spec.name}` prints the served split from Triton's statistics of each step."]
    return lines


REL_L2_FLOOR = 1e-9  # an exact match (rel L2 0) is drawn here: a log axis has no zero and no negative range


def plot_png(rows: list[dict[str, Any]], max_accuracy_drop: float | None = None) -> bytes | None:
    """``plot_figure`` as PNG bytes; None when nothing was measured."""
    figure = plot_figure(rows, max_accuracy_drop)
    if figure is None:
        return None
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def plot_figure(rows: list[dict[str, Any]], max_accuracy_drop: float | None = None):
    """Throughput vs batch size per variant, and accuracy drop (or rel L2 on a log axis without labels)
    vs speed-up over plain onnx. Variants are named once, in one legend under both panels (colour per
    variant; * selected, x not eligible), so no label can overlap a title, a point or another label.
    A matplotlib Figure drawn from the report rows; None when nothing was measured."""
    measured = [r for r in rows if r["throughput_by_batch"]]
    if not measured:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    legend_rows = -(-len(measured) // 4)
    figure = Figure(figsize=(11, 4.4 + 0.25 * legend_rows), dpi=100)
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    colors = {row["variant"]: f"C{i % 10}" for i, row in enumerate(measured)}
    for row in measured:
        points = sorted((int(b), ips) for b, ips in row["throughput_by_batch"].items())
        style = {"linewidth": 2.5} if row["selected"] else {"linestyle": "-" if row["eligible"] else ":"}
        left.plot([b for b, _ in points], [ips for _, ips in points], marker="o", color=colors[row["variant"]],
                  **style)
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size")
    left.set_ylabel("throughput (inferences/s)")
    left.set_title("throughput vs batch size")
    left.grid(True, alpha=0.3)

    with_labels = any(r["acc drop"] is not None for r in measured)
    key, label = (("acc drop", "top-1 accuracy drop (points)") if with_labels
                  else ("rel L2", f"worst rel L2 vs reference (0 drawn at {REL_L2_FLOOR:g})"))
    for row in measured:
        x, y = row["x onnx"], row[key]
        if x is None or y is None:
            continue
        y = y if with_labels else max(float(y), REL_L2_FLOOR)
        marker = "*" if row["selected"] else ("o" if row["eligible"] else "x")
        right.scatter([x], [y], marker=marker, s=160 if row["selected"] else 60, color=colors[row["variant"]])
    points = [(r["variant"], r["x onnx"], r[key] if with_labels else max(float(r[key]), REL_L2_FLOOR))
              for r in measured if r["eligible"] and r["x onnx"] is not None and r[key] is not None]
    front = pareto_front(points)
    if len(front) > 1:
        where = {name: (x, y) for name, x, y in points}
        right.plot([where[n][0] for n in front], [where[n][1] for n in front], color="black", linestyle="--",
                   linewidth=1, zorder=0)
    right.set_xscale("log")
    right.xaxis.set_major_locator(FixedLocator([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 5, 10, 20, 50]))
    right.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    right.xaxis.set_minor_formatter(NullFormatter())
    if with_labels and max_accuracy_drop is not None:
        right.axhline(max_accuracy_drop, color="red", linestyle="--", linewidth=1)
    elif not with_labels:
        right.set_yscale("log")
        low, high = right.get_ylim()
        right.set_ylim(max(low, REL_L2_FLOOR / 2), high)
    right.axvline(1.0, color="grey", linewidth=0.8)
    right.set_xlabel("speed-up over onnx (best throughput)")
    right.set_ylabel(label)
    right.set_title("accuracy vs speed")
    right.grid(True, alpha=0.3)

    handles = [Line2D([], [], color=colors[r["variant"]], marker="*" if r["selected"] else ("o" if r["eligible"]
                      else "x"), linestyle="-" if r["eligible"] else ":", markersize=10 if r["selected"] else 6)
               for r in measured]
    names = [r["variant"] + (" (selected)" if r["selected"] else "" if r["eligible"] else " (not eligible)")
             for r in measured]
    if with_labels and max_accuracy_drop is not None:
        handles.append(Line2D([], [], color="red", linestyle="--"))
        names.append(f"max accuracy drop ({max_accuracy_drop:g})")
    if len(front) > 1:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1))
        names.append("Pareto front (eligible variants)")
    figure.legend(handles, names, loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.06 + 0.05 * legend_rows, 1, 1))
    return figure
