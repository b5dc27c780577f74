"""The build report: made from the pipeline's records (stage results and variants) only.

Usage::

    rows = variant_rows(ctx)          # list of dicts, one per variant
    print(format_table(rows))         # the summary table the CLI ends with
    write_reports(folder, ctx)        # build_report.md + build_report.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = ["variant", "size MB", "exporter", "rel L2", "max abs", "acc drop", "p50 ms (b=1)",
           "throughput", "status"]


def _worst(variant, key: str) -> float | None:
    metrics = (variant.verification or {}).get("metrics") or {}
    values = [m[key] for m in metrics.values() if isinstance(m.get(key), (int, float))]
    return max(values) if values else None


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def variant_rows(ctx) -> list[dict[str, Any]]:
    rows = []
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
            "status": status,
            "why": v.selection_reason,
            "rejected": v.rejected,
            "notes": list(v.notes),
        })
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    formats = {"size MB": ".3f", "rel L2": ".1e", "max abs": ".1e", "acc drop": "+.2f", "p50 ms (b=1)": ".3f",
               "throughput": ".0f"}
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
    }


def write_reports(folder: Path, ctx) -> None:
    data = report_dict(ctx)
    (folder / "build_report.json").write_text(json.dumps(data, indent=2, default=str))
    lines = [f"# Build report: {ctx.spec.name}", "",
             f"- target: {ctx.target}; objective: {ctx.spec.objective}; reference: {ctx.reference_kind}",
             f"- selected: {data['selected']}", "", "## Variants", "", "```", format_table(data["variants"]), "```", ""]
    for row in data["variants"]:
        lines.append(f"- **{row['variant']}**: {row['why'] or row['status']}")
        lines.extend(f"  - {n}" for n in row["notes"])
        if row["rejected"]:
            lines.extend(f"  {line}" for line in row["rejected"].splitlines())
    if ctx.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in ctx.notes]
    lines += ["", "## Stages", "", "| stage | status | seconds | reason |", "|---|---|---|---|"]
    lines += [f"| {r.stage} | {r.status.value} | {r.seconds:.2f} | {r.reason.splitlines()[0] if r.reason else ''} |"
              for r in ctx.results]
    for extra in sorted(folder.glob("*.png")):
        lines += ["", f"![{extra.stem}]({extra.name})"]
    (folder / "build_report.md").write_text("\n".join(lines) + "\n")
