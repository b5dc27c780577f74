"""Where the time of an ensemble's request goes, step by step, from Triton's statistics of each step.

An ensemble (a Hugging Face pipeline: tokenizer -> model -> post-processing; a monitored model: model ->
monitor) is one request to the client and several to the server: Triton keeps statistics
(``/v2/models/<m>/stats``) for the ensemble and for each step it calls. Snapshots of all of them before
and after a measurement give, per ensemble request:

- each step's queue time and compute time (input + infer; + output for the last step). A step's
  compute_output ends only once the ensemble has taken its outputs over, and the next step is already
  running by then (measured on the MiniLM pipeline at concurrency 1: the tokenizer's compute_output read
  2.1 ms while the model step ran; counted in full, the steps added up to 124 % of the ensemble's time):
  it is reported apart as ``handover_us`` and not added. A step that batches adds a whole batch's
  compute time to every request in it: that is the latency the request saw, not the step's cost per
  request;
- ``end_to_end_us``: the ensemble's own request duration (``success.ns``: arrival to final response);
- ``overhead_us``: end to end minus the steps' queue + compute: the ensemble scheduler's own work between
  the steps (it can read a little negative where the steps' timings overlap).

Other clients calling a step directly in the same window (``<name>__model`` with ids) count too.

Usage::

    steps = ensemble_steps(interface.config)       # [] for a model that is no ensemble
    model_step("minilm_sentiment", steps)          # "minilm_sentiment__model": its formed batches are the ones to read
    timer = StepTimer(reader, "minilm_sentiment", steps)
    before = timer.snapshot(); ...; split = timer.split(before, timer.snapshot())
    say(format_step_table([(4, split)]))
"""

from __future__ import annotations

from typing import Any

from builder.core.errors import ServerError
from builder.tuning.stats import StatsReader, StatsSnapshot

#: step name suffix -> what the step does (builder/repository/layout.py names them)
ROLES = (("__preprocess", "tokenizer"), ("__model", "model"), ("__postprocess", "post-processing"),
         ("__monitor", "monitor"))
_COMPUTE = ("compute_input", "compute_infer", "compute_output")


def ensemble_steps(config: dict[str, Any]) -> list[str]:
    """The models an ensemble calls, in its step order (its config as Triton reports it, JSON form);
    [] when the model is no ensemble."""
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    names = []
    for step in steps:
        name = step.get("model_name") or step.get("modelName")
        if name and name not in names:
            names.append(name)
    return names


def model_step(ensemble: str, steps: list[str]) -> str | None:
    """The step that runs the model (``<ensemble>__model``): the one whose formed batches say whether the
    ensemble batches at all (its python steps gather requests without delay)."""
    return next((s for s in steps if step_role(ensemble, s) == "model"), None)


def step_role(ensemble: str, step: str) -> str:
    """"tokenizer", "model", ... for the steps named after the ensemble; the step's own name otherwise."""
    for suffix, role in ROLES:
        if step == ensemble + suffix:
            return role
    return step


def step_split(ensemble: str, steps: list[str], before: dict[str, StatsSnapshot],
               after: dict[str, StatsSnapshot]) -> dict[str, Any]:
    """Per ensemble request, in microseconds: each step's queue and compute time, the ensemble's end-to-end
    time and its overhead (module doc); ``error`` set when the counters give no answer."""
    requests = after[ensemble].success - before[ensemble].success
    if requests < 0 or any(after[s].success < before[s].success for s in steps):
        return {"error": "statistics went backwards (a model was reloaded during the measurement)", "requests": 0}
    if requests == 0:
        return {"error": "the ensemble answered no request in the window", "requests": 0}

    def per_request(ns: int) -> float:
        return round(ns / requests / 1e3, 1)

    end_to_end = per_request(after[ensemble].success_ns - before[ensemble].success_ns)
    rows = []
    for index, step in enumerate(steps):
        queue = per_request(after[step].ns["queue"] - before[step].ns["queue"])
        last = index == len(steps) - 1
        compute = per_request(sum(after[step].ns[p] - before[step].ns[p] for p in _COMPUTE[:3 if last else 2]))
        handover = 0.0 if last else per_request(after[step].ns["compute_output"] - before[step].ns["compute_output"])
        executions = after[step].executions - before[step].executions
        inferences = after[step].inferences - before[step].inferences
        batches = {str(size): after[step].batches.get(size, 0) - before[step].batches.get(size, 0)
                   for size in sorted(set(after[step].batches) | set(before[step].batches))}
        rows.append({"step": step, "role": step_role(ensemble, step), "queue_us": queue, "compute_us": compute,
                     "total_us": round(queue + compute, 1), "handover_us": handover,
                     "share": round((queue + compute) / end_to_end, 3) if end_to_end > 0 else None,
                     "average_batch_size": round(inferences / executions, 2) if executions > 0 else None,
                     "batch_sizes": {size: count for size, count in batches.items() if count > 0}})
    overhead = round(end_to_end - sum(r["total_us"] for r in rows), 1)
    return {"requests": requests, "end_to_end_us": end_to_end, "steps": rows, "overhead_us": overhead,
            "overhead_share": round(overhead / end_to_end, 3) if end_to_end > 0 else None, "error": None}


class StepTimer:
    """Snapshots of an ensemble and its steps through one ``StatsReader``."""

    def __init__(self, reader: StatsReader, ensemble: str, steps: list[str]):
        self.reader, self.ensemble, self.steps = reader, ensemble, list(steps)

    def snapshot(self) -> dict[str, StatsSnapshot] | None:
        """Every counter now; None when a step's statistics cannot be read (the split is left out then)."""
        try:
            return {name: self.reader.snapshot(name) for name in [self.ensemble, *self.steps]}
        except ServerError:
            return None

    def split(self, before: dict[str, StatsSnapshot] | None, after: dict[str, StatsSnapshot] | None) -> dict[str, Any]:
        if before is None or after is None:
            return {"error": "statistics of the ensemble's steps unavailable", "requests": 0}
        return step_split(self.ensemble, self.steps, before, after)


def _cell(total: float | None, queue: float | None = None, share: float | None = None) -> str:
    if total is None:
        return "-"
    text = f"{queue:,.0f} + {total - queue:,.0f}" if queue is not None else f"{total:,.0f}"
    return text + (f" ({share:.0%})" if share is not None else "")


def format_step_table(levels: list[tuple[int, dict[str, Any]]]) -> str:
    """A table: one row per step (queue + compute us per request, share of end to end), the ensemble's
    overhead and end-to-end time; one column per concurrency level."""
    levels = [(c, split) for c, split in levels if not split.get("error")]
    if not levels:
        return ""
    first = levels[0][1]
    names = [(r["role"] if r["role"] == r["step"] else f"{r['role']} ({r['step']})") for r in first["steps"]]
    table = [["step: queue + compute us per request (share)"] + [f"c={c}" for c, _ in levels]]
    for index, name in enumerate(names):
        table.append([name] + [_cell(s["steps"][index]["total_us"], s["steps"][index]["queue_us"],
                                     s["steps"][index]["share"]) for _, s in levels])
    table.append(["ensemble overhead (hand-offs)"] + [_cell(s["overhead_us"], None, s["overhead_share"])
                                                      for _, s in levels])
    table.append(["end to end in the server"] + [_cell(s["end_to_end_us"]) for _, s in levels])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)
