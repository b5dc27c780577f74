"""`triton-builder tune`: measured tuning of dynamic batching, instance count and max_batch_size for a
model on the RUNNING server, under a p99 latency budget, maximising throughput.

Each candidate config is loaded through Triton's model-control API with the config as JSON
(``load_model(name, config=...)``: the server must run with ``--model-control-mode=explicit``; it is
never restarted), checked to be what Triton actually loaded, then measured with the in-process
closed-loop client (builder/tuning/client.py) at rising concurrency (1, 2, 4, ...), each level until
stable (capped), stopping at the first level whose p99 exceeds the budget or once throughput stops
rising; two bisection steps then look between the last level within the budget and the first over
it (e.g. 16 ok, 32 over: 24, then 20 or 28). A level over the budget is measured a second time
before it counts as over (a moment of CPU taken by another process must not rule a candidate out).
A candidate's score is its highest throughput at a level within the budget and without failures.

Between candidates the model is unloaded and then loaded with the next config (not reloaded in
place: Triton 2.51's python backend crashed the server when requests reached a model reloaded in
place while its old instance was still unloading), so it is unavailable for a second or two each
time: tune on a server that is not taking production traffic.

The search is staged and bounded (stages 2-5 start from the best batching candidate so far;
``seconds_per_candidate`` is spread over the concurrency levels, at least 4 windows each):

1. baselines: ``no batching`` (dynamic batching off, 1 instance) and ``default`` (batching on,
   delay 0, 1 instance, the built max_batch_size);
2. instance counts (``instance_counts``);
3. queue delays (``delays`` us);
4. smaller max_batch_sizes (``max_batch_sizes``, each <= the built one);
5. preferred_batch_size = the power of two nearest the average batch Triton formed, if the best
   so far waits for batches (delay > 0).

The winner is the config with the fewest changes from the default among those within
``tie_margin`` (10 %) of the best score: smaller differences are within run-to-run noise on a
shared machine, and not worth a change. The winner, the top scorer and both baselines are then
measured once more at the concurrency that scored
(``confirm``) and each keeps the better of its two measurements (interference from other processes
only ever slows a run down), so the ratios compare the three under the same conditions.

With ``write=True`` the winner is written to ``<model>/config.pbtxt`` (header comment saying so)
and ``<model>/tuning.json`` (every candidate's measurements) through
``builder.repository.tuned.write_tuned_config``, then reloaded from disk so the server serves
exactly the file. Without it, the record goes to ``out_dir/tuning.json`` only, and the model is
reloaded from its unchanged config. Either way, the server ends serving what is on disk.

Usage::

    result = run_tune("digits_cnn", "model_repository", "127.0.0.1:8001", p99_budget_ms=10,
                      seconds_per_candidate=10, write=True)
    result["winner"]["label"], result["ratios"]["vs_no_batching"], result["exit_code"]
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from builder.errors import ServerError, UserInputError

DEFAULT_DELAYS = (0, 100, 500, 2000)
DEFAULT_INSTANCES = (1, 2)
DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)
SATURATION_GAIN = 1.05  # a level that adds less than 5 % throughput counts as saturated
REFINE_STEPS = 2  # bisection steps between the last level within the budget and the first over it


@dataclass(eq=False)  # identity: the same candidate measured twice is one candidate
class Candidate:
    label: str
    batching: bool
    delay_us: int = 0
    instances: int = 1
    max_batch_size: int = 0
    preferred: list[int] = field(default_factory=list)
    # measured
    levels: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None  # the level with the highest throughput within the budget
    error: str = ""
    confirm: dict[str, Any] | None = None

    @property
    def key(self) -> tuple:
        return (self.batching, self.delay_us if self.batching else 0, self.instances, self.max_batch_size,
                tuple(self.preferred) if self.batching else ())

    @property
    def score(self) -> float:
        return self.best["throughput_rps"] if self.best else 0.0

    def config(self, base: dict[str, Any]) -> dict[str, Any]:
        """The candidate as a Triton config (JSON form), from the config on disk."""
        cfg = copy.deepcopy(base)
        if self.max_batch_size:
            cfg["max_batch_size"] = self.max_batch_size
        if self.batching:
            batching: dict[str, Any] = {"max_queue_delay_microseconds": str(self.delay_us)}
            if self.preferred:
                batching["preferred_batch_size"] = list(self.preferred)
            cfg["dynamic_batching"] = batching
        else:
            cfg.pop("dynamic_batching", None)
        groups = cfg.get("instance_group") or [{"kind": "KIND_CPU"}]
        cfg["instance_group"] = [dict(g, count=self.instances) for g in groups]
        for warmup in cfg.get("model_warmup", []):
            if self.max_batch_size and int(warmup.get("batch_size", 1)) > self.max_batch_size:
                warmup["batch_size"] = self.max_batch_size
        return cfg

    def describe(self) -> str:
        batching = (f"batching on, delay {self.delay_us} us" + (f", preferred {self.preferred}" if self.preferred else "")
                    if self.batching else "no dynamic batching")
        return f"{batching}, {self.instances} instance(s), max_batch_size {self.max_batch_size}"

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "dynamic_batching": self.batching,
                "max_queue_delay_microseconds": self.delay_us if self.batching else None,
                "preferred_batch_size": self.preferred if self.batching else None, "instances": self.instances,
                "max_batch_size": self.max_batch_size, "throughput_within_budget_rps": self.score,
                "best_level": self.best, "levels": self.levels, "confirm_level": self.confirm, "error": self.error}


def _csv_ints(values, what: str, low: int = 0) -> list[int]:
    out = []
    for value in values:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise UserInputError(f"--{what} {value!r}: use whole numbers, e.g. 0,100,500") from None
        if number < low:
            raise UserInputError(f"--{what} {number}: must be >= {low}")
        out.append(number)
    return out


class _Server:
    """Model control and measurement against the running server (never starts one)."""

    def __init__(self, url: str, protocol: str, model: str, timeout: float = 120.0):
        self.url, self.protocol, self.model, self.timeout = url, protocol, model, timeout
        if protocol == "http":
            import tritonclient.http as module

            self.client = module.InferenceServerClient(url, connection_timeout=10, network_timeout=timeout)
        else:
            import tritonclient.grpc as module

            self.client = module.InferenceServerClient(url)

    def load(self, config: dict[str, Any] | None) -> None:
        """(Re)load the model, with ``config`` as its config or, with None, from config.pbtxt on disk.

        The model is unloaded first and the new one loaded only once the old one is gone: Triton
        2.51's python backend crashed the server (SIGSEGV in TRITONBACKEND_ModelInstanceExecute) when
        requests reached a model reloaded in place while its old instance was still unloading.
        """
        kwargs: dict[str, Any] = {"client_timeout": self.timeout} if self.protocol == "grpc" else {}
        try:
            self.client.unload_model(self.model, **kwargs)
            deadline = time.monotonic() + self.timeout
            while self._state() in ("READY", "UNLOADING"):
                if time.monotonic() > deadline:
                    raise ServerError(f"'{self.model}' was still loaded {self.timeout:g} s after the unload request")
                time.sleep(0.05)
            self.client.load_model(self.model, config=json.dumps(config) if config is not None else None, **kwargs)
        except ServerError:
            raise
        except Exception as exc:  # noqa: BLE001
            message = " ".join(str(exc).split())
            if "not allowed" in message and ("polling" in message or "explicit" in message.lower()):
                raise UserInputError(f"Triton at {self.url} refuses model control ({message}); start it with "
                                     "--model-control-mode=explicit (triton-builder serve does)") from None
            raise ServerError(f"Triton at {self.url} could not load '{self.model}': {message[:400]}") from None

    def _state(self) -> str | None:
        if self.protocol == "http":
            models = self.client.get_model_repository_index()
        else:
            models = self.client.get_model_repository_index(as_json=True).get("models", [])
        states = [m.get("state") for m in models if m.get("name") == self.model]
        return "READY" if "READY" in states else (states[0] if states else None)

    def loaded_config(self) -> dict[str, Any]:
        if self.protocol == "http":
            return self.client.get_model_config(self.model)
        return self.client.get_model_config(self.model, as_json=True)["config"]

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass


def run_tune(model: str, repository: str | Path, url: str, *, protocol: str = "grpc", p99_budget_ms: float,
             seconds_per_candidate: float = 10.0, write: bool = False, out_dir: str | Path = "runs/tune",
             payload: str | Path | None = None, delays=DEFAULT_DELAYS, instance_counts=DEFAULT_INSTANCES,
             max_batch_sizes=(), levels=DEFAULT_LEVELS, max_concurrency: int | None = None,
             max_candidates: int = 12, window_s: float = 0.5, confirm: bool = True, batch_size: int = 1,
             tie_margin: float = 0.10,
             progress: Callable[[str], object] | None = None) -> dict[str, Any]:
    """Search configs of ``model`` on the server at ``url`` (its ``protocol`` port) under ``p99_budget_ms``.

    Returns the result (also ``out_dir/tuning.json``): every candidate, the winner, both baselines, the
    ratios, ``table`` (printable lines) and ``exit_code`` (0 a winner met the budget, 1 none did).
    Raises ``UserInputError`` for bad arguments or a server without model control, ``ServerError`` if
    the model cannot be reached.
    """
    from builder.repository.config import config_as_dict
    from builder.repository.layout import model_dir
    from builder.serving.check import config_differences
    from builder.tuning.client import measure_level
    from builder.tuning.payload import fetch_model, load_samples, make_requests
    from builder.tuning.stats import StatsReader

    say = progress or (lambda message: None)
    if p99_budget_ms is None or p99_budget_ms <= 0:
        raise UserInputError(f"--p99-budget-ms {p99_budget_ms}: give the p99 latency budget in ms (> 0)")
    if seconds_per_candidate < 4 * window_s:
        raise UserInputError(f"--seconds-per-candidate {seconds_per_candidate}: needs at least {4 * window_s:g} s "
                             "(a warm-up window and three measured ones)")
    if protocol not in ("http", "grpc"):
        raise UserInputError(f"--protocol {protocol!r}: use http or grpc")
    if not 0 <= tie_margin < 1:
        raise UserInputError(f"--tie-margin {tie_margin}: a fraction within 0..1, e.g. 0.1")
    delays = _csv_ints(delays, "delays")
    instance_counts = _csv_ints(instance_counts, "instances", 1)
    max_batch_sizes = _csv_ints(max_batch_sizes, "max-batch-sizes", 1)
    levels = sorted(set(_csv_ints(levels, "levels", 1)))
    if max_concurrency is not None:
        levels = [c for c in levels if c <= max_concurrency] or [max_concurrency]
    if not levels:
        raise UserInputError("--levels: give at least one concurrency")
    config_path = model_dir(Path(repository), model) / "config.pbtxt"
    if not config_path.is_file():
        raise UserInputError(f"{config_path} is missing: model '{model}' is not in {Path(repository).resolve()}; "
                             "pass --repository (the folder the server serves)")
    base_text = config_path.read_text(encoding="utf-8")
    base = config_as_dict(base_text)
    if base.get("platform") == "ensemble":
        raise UserInputError(f"model '{model}' is an ensemble: tune its step models instead")
    built_max = int(base.get("max_batch_size", 0))
    too_big = [m for m in max_batch_sizes if m > built_max]
    if too_big:
        raise UserInputError(f"--max-batch-sizes {too_big}: must be <= the built max_batch_size {built_max} "
                             "(the model was verified up to that size)")
    if batch_size > max(built_max, 1):
        raise UserInputError(f"--batch-size {batch_size} > max_batch_size {built_max}")

    interface = fetch_model(url, protocol, model)  # ServerError if not reachable / not ready
    differences = config_differences(base, interface.config)
    if differences:
        say(f"note: the server's loaded config differs from {config_path}: {'; '.join(differences)}; "
            "tuning starts from the file")
    samples, source = load_samples(interface, payload, repository)
    requests = make_requests(samples, batch_size, interface.batching)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_level_s = max(4 * window_s, seconds_per_candidate / len(levels))

    server = _Server(url, protocol, model)
    stats = StatsReader(url, protocol)
    measured: dict[tuple, Candidate] = {}
    order: list[Candidate] = []
    client_kind = ""

    def evaluate(candidate: Candidate, confirm_round: bool = False) -> Candidate:
        if not confirm_round:
            if candidate.key in measured:
                return measured[candidate.key]
            if len(order) >= max_candidates:
                candidate.error = f"skipped: --max-candidates {max_candidates} reached"
                return candidate
            measured[candidate.key] = candidate
            order.append(candidate)
        elif candidate.best is None or candidate.error:
            return candidate  # nothing to confirm
        config = candidate.config(base)
        say(f"{'confirm' if confirm_round else 'candidate'} {candidate.label}: {candidate.describe()}")
        try:
            server.load(config)
            loaded_diff = config_differences(config, server.loaded_config())
            if loaded_diff:
                raise ServerError("Triton loaded something else: " + "; ".join(loaded_diff))
        except ServerError as exc:
            candidate.error = str(exc)
            say(f"  failed: {exc}")
            return candidate
        if confirm_round:  # once more at the concurrency that scored; the better of the two counts
            row, within = run_level(candidate.best["concurrency"])
            candidate.confirm = row
            if within and row["throughput_rps"] > candidate.best["throughput_rps"]:
                candidate.best = dict(row, from_confirm=True)
            return candidate
        rows, best, last_ok, over, previous, flat = [], None, None, None, 0.0, 0
        for concurrency in levels:
            row, within = run_level(concurrency)
            rows.append(row)
            if not within:
                over = concurrency
                break
            last_ok = concurrency
            if best is None or row["throughput_rps"] > best["throughput_rps"]:
                best = row
            flat = flat + 1 if row["throughput_rps"] < previous * SATURATION_GAIN else 0
            previous = max(previous, row["throughput_rps"])
            if flat >= 2:
                break  # saturated: more requests in flight only add latency
        for _ in range(REFINE_STEPS):  # bisect between the last level within the budget and the first over it
            if last_ok is None or over is None or over - last_ok <= 1:
                break
            middle = (last_ok + over) // 2
            row, within = run_level(middle)
            rows.append(row)
            if within:
                last_ok = middle
                if row["throughput_rps"] > best["throughput_rps"]:
                    best = row
            else:
                over = middle
        candidate.levels, candidate.best = rows, best
        return candidate

    def run_level(concurrency: int) -> tuple[dict[str, Any], bool]:
        row, within = measure_once(concurrency)
        if not within and not row["failures"]:
            # over the budget: once more before believing it (another process may have taken the CPU
            # for a moment; interference only ever slows a run down, so the better of the two counts)
            again, again_within = measure_once(concurrency)
            if again_within or (again["p99_ms"] or math.inf) < (row["p99_ms"] or math.inf):
                row, within = again, again_within
            row["measured_twice"] = True
        return row, within

    def measure_once(concurrency: int) -> tuple[dict[str, Any], bool]:
        nonlocal client_kind
        level = measure_level(url, protocol, model, requests, interface.outputs, concurrency,
                              window_s=window_s, max_s=per_level_s, stats=stats)
        client_kind = level.client
        row = level.as_row()
        row["errors"] = level.errors
        within = level.failures == 0 and level.p99_ms is not None and level.p99_ms <= p99_budget_ms
        row["within_budget"] = within
        say(f"  c={concurrency:<3d} {row['throughput_rps']:8.1f} req/s  p99 {row['p99_ms']} ms"
            f"{'' if within else '  (over budget)' if not level.failures else f'  ({level.failures} failures)'}"
            f"  avg batch {row['server_avg_batch']}")
        return row, within

    started = time.monotonic()
    try:
        with_batching = built_max > 0
        none = Candidate("no batching", False, 0, 1, built_max)
        default = Candidate("default", True, 0, 1, built_max) if with_batching else none
        evaluate(none)
        if with_batching:
            evaluate(default)
        # instances, delays, sizes: explored from the best batching candidate (from "no batching" for a
        # model without a batch dimension); the winner is the best of all, "no batching" included
        start = default
        for count in instance_counts:
            if count != start.instances:
                evaluate(Candidate(f"{count} instances", start.batching, start.delay_us, count, start.max_batch_size))
        best = _best([c for c in order if c.batching == with_batching]) or start
        if with_batching:
            for delay in delays:
                evaluate(Candidate(f"delay {delay} us", True, delay, best.instances, best.max_batch_size))
            best = _best([c for c in order if c.batching]) or best
            for size in max_batch_sizes:
                if size != best.max_batch_size:
                    evaluate(Candidate(f"max batch {size}", True, best.delay_us, best.instances, size))
            best = _best([c for c in order if c.batching]) or best
            if best.delay_us > 0 and best.best and best.best.get("server_avg_batch"):
                nearest = 2 ** round(math.log2(max(1.0, best.best["server_avg_batch"])))
                nearest = max(1, min(nearest, best.max_batch_size))
                evaluate(Candidate(f"preferred {nearest}", True, best.delay_us, best.instances,
                                   best.max_batch_size, [nearest]))
        winner = _choose(order, built_max, tie_margin)
        if confirm and winner is not None:
            for candidate in dict.fromkeys([winner, _best(order), none, default]):  # in this order, each once
                evaluate(candidate, confirm_round=True)
            winner = _choose(order, built_max, tie_margin)
    finally:
        stats.close()
        try:
            server.load(None)  # serve the file again (unchanged so far) rather than the last candidate
            restore_error = None
        except (ServerError, UserInputError) as exc:
            restore_error = exc
    if restore_error is not None:
        server.close()
        raise ServerError(f"tuning finished but '{model}' could not be reloaded from {config_path}: {restore_error}")

    elapsed = time.monotonic() - started
    ratios = {
        "vs_no_batching": _ratio(winner, none),
        "vs_default": _ratio(winner, default),
    }
    record: dict[str, Any] = {
        "model": model, "tuned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "server": url, "protocol": protocol, "client": client_kind, "payload": source, "batch_size": batch_size,
        "p99_budget_ms": p99_budget_ms, "seconds_per_candidate": seconds_per_candidate, "window_s": window_s,
        "levels": levels, "search_seconds": round(elapsed, 1),
        "scoring": "highest throughput at a concurrency level whose p99 is within the budget, with no failures",
        "winner_rule": f"the config with the fewest changes from the default among those scoring within "
                       f"{tie_margin:.0%} of the best (smaller gains are within run-to-run noise)",
        "winner": winner.as_dict() if winner else None,
        "baselines": {"no_batching": none.as_dict(), "default": default.as_dict()},
        "ratios": ratios,
        "candidates": [c.as_dict() for c in order],
        "written": False,
    }
    table = format_table(order, winner, p99_budget_ms, top=_best(order))
    for line in table:
        say(line)
    summary_line = _ratio_line(winner, none, default, ratios, p99_budget_ms)
    say(summary_line)

    if write and winner is not None:
        from builder.repository.tuned import TUNED_MARK, config_text_from_dict, original_header, write_tuned_config

        record["written"] = True
        record["files"] = {"config": str(config_path), "record": str(config_path.parent / "tuning.json")}
        header = original_header(base_text) + [
            f"{TUNED_MARK} on {record['tuned_at']}: {winner.describe()}",
            f"#   {_ratio_line(winner, none, default, ratios, p99_budget_ms)} over {protocol}",
            "#   every candidate's measurements: tuning.json beside this file",
        ]
        text = config_text_from_dict(winner.config(base), header)
        config_file, record_file = write_tuned_config(repository, model, text, record)
        server.load(None)  # serve exactly the file just written
        served = server.loaded_config()
        mismatch = config_differences(config_as_dict(text), served)
        if mismatch:
            raise ServerError(f"after writing {config_file}, Triton serves something else: {'; '.join(mismatch)}")
        say(f"wrote {config_file} and {record_file}; the server now serves the tuned config")
    server.close()
    tmp = out / "tuning.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, out / "tuning.json")
    record["table"] = table
    record["summary"] = summary_line
    record["exit_code"] = 0 if winner is not None else 1
    return record


def _changes(candidate: Candidate, built_max: int) -> int:
    """How far a candidate is from the default config (batching on, delay 0, 1 instance, built size)."""
    return (int(candidate.batching != (built_max > 0)) + int(candidate.delay_us != 0) + int(candidate.instances != 1)
            + int(candidate.max_batch_size != built_max) + int(bool(candidate.preferred)))


def _choose(candidates: list[Candidate], built_max: int, margin: float) -> Candidate | None:
    """The winner: the config closest to the default among those within ``margin`` of the best score
    (a smaller gain is within run-to-run noise, and not worth a change); the higher score on a tie."""
    top = _best(candidates)
    if top is None:
        return None
    close = [c for c in candidates if c.best is not None and not c.error and c.score * (1 + margin) >= top.score]
    return min(close, key=lambda c: (_changes(c, built_max), -c.score))


def _best(candidates: list[Candidate]) -> Candidate | None:
    eligible = [c for c in candidates if c.best is not None and not c.error]
    return max(eligible, key=lambda c: c.score) if eligible else None


def _ratio(winner: Candidate | None, baseline: Candidate) -> float | None:
    if winner is None or not baseline.score:
        return None
    return round(winner.score / baseline.score, 3)


def _ratio_line(winner, none, default, ratios, budget) -> str:
    if winner is None:
        return f"no candidate met p99 <= {budget:g} ms: nothing to write (exit 1)"
    parts = [f"winner '{winner.label}' {winner.score:.0f} req/s"]
    for name, baseline, key in (("no batching", none, "vs_no_batching"), ("default", default, "vs_default")):
        if ratios[key] is None:
            parts.append(f"{name}: never within the budget")
        else:
            parts.append(f"{ratios[key]:.2f}x {name} ({baseline.score:.0f} req/s)")
    return f"at p99 <= {budget:g} ms: " + ", ".join(parts)


def format_table(candidates: list[Candidate], winner: Candidate | None, budget: float,
                 top: Candidate | None = None) -> list[str]:
    """One line per candidate: its config, best level within the budget, and the server's view there."""
    header = (f"{'candidate':<16} {'batching':<8} {'delay us':>8} {'pref':>5} {'inst':>4} {'max b':>5} "
              f"{'conc':>4} {'req/s':>8} {'p99 ms':>7} {'avg b':>6} {'queue us':>8} {'comp us':>8}  note")
    lines = [f"candidates (score: best throughput with p99 <= {budget:g} ms)", header, "-" * len(header)]
    for c in candidates:
        b = c.best or {}
        note = "WINNER" if c is winner else (c.error[:60] if c.error else ("" if c.best else "never within budget"))
        if c is top and c is not winner:
            note = "top score, within the tie margin of the winner"
        lines.append(
            f"{c.label:<16} {'on' if c.batching else 'off':<8} {c.delay_us if c.batching else '-':>8} "
            f"{(','.join(map(str, c.preferred)) or '-') if c.batching else '-':>5} {c.instances:>4} "
            f"{c.max_batch_size:>5} {b.get('concurrency', '-'):>4} {b.get('throughput_rps', 0):>8.1f} "
            f"{_num(b.get('p99_ms')):>7} {_num(b.get('server_avg_batch')):>6} {_num(b.get('server_queue_us'), 0):>8} "
            f"{_num(b.get('server_compute_us'), 0):>8}  {note}")
    return lines


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
