"""`triton-builder select`: on the serving host, re-measure a build's verified variants and publish the
winner, sized to this host, as a new version of the model (no re-export).

The candidates are the variants the repository holds for model ``<name>`` from the build that made its
latest (served) version: each variant among the versions of ``<name>`` itself, and the
``<name>__<variant>`` models a build published with ``--publish-variants`` (without it, only the served
variant is a candidate: select then re-sizes serving to this host). A version of another build (other
weights or model code, another interface: metadata.yaml ``source`` and ``spec``) is listed as excluded
with what differs, and so is one whose files no longer match its metadata.yaml's hashes or, with a key,
its signature (builder/repository/provenance.py): each candidate is replayed against its own
reference.npz, which another model - or a tampered one - passes as well. The served version failing
those checks refuses the whole select. Each candidate is replayed against its version's reference.npz (else
``<name>``'s latest version's; the candidate's own tolerance) and measured in-process here; the best
by the build's objective (throughput or latency; a candidate further from the reference only when it is
faster by more than the noise: builder/model/objective.py prefer_accurate) is published with this host's profile, its
serving size (builder/core/host.py size_serving; only where the build sized it, not where the spec set
deploy.instances, `tune --publish` chose it on the running server, or the target is a GPU), its batching
delay re-sized from the winner measured here at batch 1 and at a larger batch (host.size_queue_delay; only
where the build sized the delay, not where the spec set it) and these measurements as its metadata.yaml
``benchmark`` (the build host's figures under ``benchmark_on_build_host``, with that host). Objective
``tradeoff`` ranks by the build's J (builder/model/objective.py: the candidate's build-time accuracy, its p50
measured here, its recorded peak memory, the weights the build used). Where the winner,
the size and the delay are what the latest version already serves, measured on a host like this one, nothing is
published. Republishing the files (also `tune --publish`): builder/repository/republish.py.

Usage::

    report = select_for_host(Path("model_repository"), "digits_cnn", progress=print)
    report.published    # {"name": ..., "version": 3, ...} or None; report.lines() says why
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures, worst_metric
from builder.core.errors import UserInputError
from builder.core.host import compare_hosts, host_profile, size_queue_delay, size_serving
from builder.model.measure import AFTER_SLOW_START, measure, warm_up
from builder.model.objective import prefer_accurate, speed, tradeoff_terms
from builder.model.runtime import open_runner
from builder.repository.layout import existing_versions, latest_version, model_dir, not_in_repository, require_writable
from builder.repository.metadata import read_metadata, read_reference
from builder.repository.provenance import build_difference, integrity_failure, verifying_key
from builder.repository.republish import (COPIED_EXTRAS, TUNED, refuse_monitored, renamed_config, republish,
                                          version_model_files)
from builder.repository.signing import SIGNATURE_FILE, require_key_if_signed, resolve_signing_key
from builder.spec.model import TRADEOFF_DEFAULTS

# measure(candidate label, runner, batch-1 inputs, threads) -> {"throughput": inferences/s, "p50_ms": ...}
Measure = Callable[[str, Callable, dict[str, np.ndarray], int], dict[str, float]]
BUILD_BENCHMARK = "benchmark_on_build_host"  # metadata.yaml of a version select published: its build's figures


@dataclass
class Candidate:
    label: str  # "<model>/<version>"
    variant: str
    folder: Path
    meta: dict[str, Any]
    measured: dict[str, float] = field(default_factory=dict)
    excluded: str = ""
    runner: Callable | None = field(default=None, repr=False)  # the variant opened here (builder/model/runtime.py)
    rel_l2: float | None = None  # worst rel L2 of its replay against the reference (None: verified by task accuracy)


@dataclass
class SelectReport:
    model: str
    objective: str
    candidates: list[Candidate] = field(default_factory=list)
    winner: Candidate | None = None
    sizing: tuple[int, int] | None = None
    size_kept: str | None = None  # why the served instances x threads are kept (spec, tune); None: sized here
    config_size: tuple[int, int | None] | None = None  # written into the winner's config (None: kept as it is)
    batched: tuple[int, float] | None = None  # (batch, samples/s) of the winner measured here for the delay
    delay: tuple[int, str] | None = None  # (max_queue_delay_microseconds, why) re-sized here; None: kept as built
    published: dict[str, Any] | None = None
    why: str = ""
    weights: dict[str, float] | None = None  # objective tradeoff: J's alpha, beta, gamma
    tie_rule: str | None = None  # why the fastest was passed over for a candidate closer to the reference

    def lines(self) -> list[str]:
        out = []
        for c in self.candidates:
            if c.excluded:
                out.append(f"  {c.variant:24s} {c.label}: excluded ({c.excluded})")
            else:
                out.append(f"  {c.variant:24s} {c.label}: {c.measured.get('throughput', 0):.1f} inf/s, "
                           f"p50 {c.measured.get('p50_ms', 0):.3f} ms"
                           + (f", J {c.measured['J']:.3f}" if "J" in c.measured else ""))
        if self.tie_rule:
            out.append(f"  {self.winner.variant}: {self.tie_rule}")
        out.append(self.why)
        return out


def default_measure(seconds: float = 2.0, clock: Callable[[], float] | None = None) -> Measure:
    """Batch-1 throughput and p50 latency in-process (builder/model/measure.py's warm-up and stability rule;
    ``clock`` times the windows, injectable: tests)."""
    import time


    def run(label: str, runner: Callable, inputs: dict[str, np.ndarray], threads: int) -> dict[str, float]:
        warm_up(lambda: runner(inputs))
        # a slow start that outlasts the warm-up (a TorchScript module read 8.8 inf/s here) must not be
        # all the time cap leaves: AFTER_SLOW_START windows let the fastest-windows rule drop it
        m = measure(lambda: runner(inputs), 1, window_seconds=min(0.2, seconds / (AFTER_SLOW_START + 1)),
                    max_seconds=seconds, min_windows=AFTER_SLOW_START, clock=clock or time.perf_counter)
        return {"throughput": float(m.throughput), "p50_ms": float(m.percentiles_ms()["p50"])}
    return run


def _candidates(repository: Path, name: str, served: dict[str, Any], served_number: int) -> list[Candidate]:
    """One candidate per variant: its newest version from the served version's build (provenance.py
    build_difference). A version of another build met first (the one select took before it checked
    builds) is listed too, excluded with what differs, so the user sees why it was passed over."""
    main = model_dir(repository, name)
    found: dict[str, Candidate] = {}
    other: dict[str, Candidate] = {}
    folders = [(name, main)] + sorted((p.name, p) for p in repository.iterdir()
                                      if p.is_dir() and p.name.startswith(f"{name}__"))
    for model, folder in folders:
        for number in reversed(existing_versions(folder)):  # newest first: one candidate per variant
            meta_path = folder / str(number) / "metadata.yaml"
            if not meta_path.is_file():
                continue
            meta = read_metadata(meta_path)
            variant = meta["artifact"]["variant"]
            if variant in found:
                continue
            candidate = Candidate(f"{model}/{number}", variant, folder / str(number), meta,
                                  excluded=build_difference(meta, served, served_number))
            if not candidate.excluded:
                found[variant] = candidate
            else:
                other.setdefault(variant, candidate)
    return list(found.values()) + list(other.values())


def _checked_candidates(repository: Path, name: str, number: int, served: dict[str, Any], key,
                        public_key) -> list[Candidate]:
    """The candidates (``_candidates``), each checked to be what was published (provenance.py
    integrity_failure: files_sha256, the signature where there is a key) before anything is replayed:
    select copies the winner and signs the copy, so a tampered version would come out re-signed. The
    served version failing it refuses the whole select (UserInputError)."""

    main = model_dir(repository, name)
    served_folder = main / str(number)
    signed = (served_folder / SIGNATURE_FILE).is_file()
    with verifying_key(public_key, key, repository) as verify_with:
        why = integrity_failure(served_folder, number, verify_with, signed)
        if why:
            rotated = ("; if it was signed with another key (a key change), give that key's public half: "
                       "--public-key PEM or $TRITON_BUILDER_PUBLIC_KEY" if public_key is None and "signature" in why
                       else "")
            raise UserInputError(f"{served_folder}: {name} version {number}, the served version select starts from, "
                                 f"is not what was published ({why}); run `triton-builder validate {main}` to see "
                                 f"every problem: nothing was measured or published{rotated}")
        candidates = _candidates(repository, name, served, number)
        for c in candidates:
            if not c.excluded and c.folder != served_folder:
                c.excluded = integrity_failure(c.folder, int(c.folder.name), verify_with, signed)
    return candidates


def _batch1(inputs: dict[str, np.ndarray], batching: bool) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v[:1]) for k, v in inputs.items()} if batching else dict(inputs)


def _score(measured: dict[str, float], objective: str) -> float:
    if objective == "tradeoff":
        return measured["J"]
    return -measured["p50_ms"] if objective == "latency" else measured["throughput"]


def _weights(served: dict[str, Any]) -> dict[str, float]:
    """J's weights as the build used them: metadata's selection.weights, else those in the served
    variant's benchmark, else the spec's defaults."""

    recorded = (served.get("selection") or {}).get("weights") or (_build_benchmark(served).get("tradeoff") or {})
    return {k: float(recorded.get(k, v)) for k, v in TRADEOFF_DEFAULTS.items()}


def _build_benchmark(meta: dict[str, Any]) -> dict[str, Any]:
    """The benchmark its build recorded: a version select published holds select's measurements under
    ``benchmark`` and its build's under BUILD_BENCHMARK (``_publish``)."""
    return (meta[BUILD_BENCHMARK] if BUILD_BENCHMARK in meta else meta.get("benchmark")) or {}


def _add_tradeoff(c: Candidate, weights: dict[str, float]) -> None:
    """J of a measured candidate: its build-time accuracy, its p50 here, its peak memory (measured here
    when the measure reports it, else as recorded by its build)."""
    memory = c.measured.get("peak_memory_mb", _build_benchmark(c.meta).get("peak_memory_mb"))
    terms = tradeoff_terms(c.meta.get("accuracy"), c.measured.get("p50_ms"), memory, weights)
    if terms is not None:
        c.measured.update({"J": terms["J"], "accuracy": terms["accuracy"], "memory_mb": terms["memory_mb"]})


def select_for_host(repository: str | Path, name: str, *, measure: Measure | None = None,
                    current_host: dict[str, Any] | None = None, dry_run: bool = False, signing_key=None,
                    public_key: str | Path | None = None,
                    progress: Callable[[str], object] = lambda message: None) -> SelectReport:
    """Re-measure ``name``'s variants on this host and publish the winner as a new version (see the
    module's docstring). ``measure`` and ``current_host`` are injectable (tests; default: measured here).
    ``signing_key`` (a PEM path or SigningKey; default $TRITON_BUILDER_SIGNING_KEY) signs the new version;
    ``public_key`` (default $TRITON_BUILDER_PUBLIC_KEY, else the signing key's public half) verifies the
    signatures of the served version and the candidates first."""

    repository = Path(repository)
    key = resolve_signing_key(signing_key, repository)  # a bad key fails before any measuring
    if not dry_run:  # likewise a repository the winner could not be published into
        require_writable(repository)
        refuse_monitored(repository, name)
    main = model_dir(repository, name)
    if not main.is_dir():
        raise not_in_repository(name, repository)
    number = latest_version(main)
    if number is None:
        raise UserInputError(f"model '{name}' has no version in {repository.resolve()}; build it first "
                             "(triton-builder build)")
    if not dry_run:
        require_key_if_signed(repository, name, key)
    served = read_metadata(main / str(number) / "metadata.yaml")
    candidates = _checked_candidates(repository, name, number, served, key, public_key)
    cases, outputs = read_reference(main / str(number) / "reference.npz")
    host = current_host if current_host is not None else host_profile()
    cores = int(host.get("usable_cores") or 1)
    measure = measure or default_measure()
    objective = (served.get("selection") or {}).get("objective") or "throughput"
    batching = int(served["spec"].get("max_batch_size") or 0) > 0
    report = SelectReport(name, objective, weights=_weights(served) if objective == "tradeoff" else None)
    for c in candidates:
        report.candidates.append(c)
        if c.excluded:  # another build's, or not what was published (_checked_candidates)
            continue
        artifact = c.meta["artifact"]
        output_names = [o["name"] for o in c.meta["spec"]["outputs"]]
        input_names = [i["name"] for i in c.meta["spec"]["inputs"]]
        try:
            runner = open_runner(artifact["format"], c.folder / artifact["file"], output_names, input_names,
                                 threads=cores)
        except Exception as exc:  # noqa: BLE001 - a variant this host cannot run is not a candidate here
            c.excluded = f"cannot run here: {str(exc).splitlines()[0][:200]}"
            continue
        # each candidate against its own version's reference.npz: a variant verified by task accuracy
        # (stage compress) stores its own outputs there, the others the model's reference outputs
        own = c.folder / "reference.npz"
        c_cases, c_outputs = read_reference(own) if own.is_file() else (cases, outputs)
        metrics = merge_case_metrics([compare_outputs(ref, runner(case["inputs"]))
                                      for case, ref in zip(c_cases, c_outputs)])
        tolerance = (c.meta.get("verification") or {}).get("tolerance") or {"rel_l2": 1e-5}
        failures = tolerance_failures(metrics, tolerance)
        if failures:
            c.excluded = "differs from the reference: " + "; ".join(failures)[:300]
            continue
        if (c.meta.get("verification") or {}).get("verified_by", "reference") == "reference":
            c.rel_l2 = worst_metric(metrics)
        progress(f"select: measuring {c.variant} ({c.label}) on this host")
        c.measured = measure(c.label, runner, _batch1(cases[0]["inputs"], batching), cores)
        c.runner = runner
        if report.weights is not None:
            _add_tradeoff(c, report.weights)
    ranked = [c for c in report.candidates if not c.excluded and (report.weights is None or "J" in c.measured)]
    if not ranked:
        raise UserInputError(f"select {name}: no variant of it runs and matches its reference on this host: "
                             + "; ".join(f"{c.variant}: {c.excluded}" for c in report.candidates))
    winner = max(ranked, key=lambda c: _score(c.measured, objective))
    if objective != "tradeoff":  # the build's tie rule: further from the reference needs more than noise
        speeds = {c.label: speed(objective, c.measured["throughput"], c.measured["p50_ms"]) for c in ranked}
        choice = prefer_accurate(speeds, {c.label: c.rel_l2 for c in ranked})
        if choice.why:
            winner, report.tie_rule = next(c for c in ranked if c.label == choice.name), choice.why
        incumbent = _incumbent(ranked, served["artifact"]["variant"], f"{name}/{number}")
        if incumbent is not None and winner.variant != incumbent.variant:
            winner = _confirm_change(winner, incumbent, measure, _batch1(cases[0]["inputs"], batching), cores,
                                     objective, report, progress)
    report.winner = winner
    serving = served.get("serving") or {}
    served_variant = served["artifact"]["variant"]
    if _size_was_sized(serving):
        report.sizing = size_serving(cores, winner.measured["p50_ms"] / 1000.0)
        report.config_size = report.sizing
    else:  # the user's choice (deploy.instances), tune's (measured on the server) or a GPU target's: kept
        report.sizing = (int(serving.get("instances") or 1), int(serving.get("intra_op_threads") or 1))
        report.size_kept = str(serving.get("sized") or "from the spec")
        if report.size_kept.startswith(TUNED) and winner.folder.parent != main:
            # the served config is the tuned one; another model folder's config was never tuned: size it as tuned
            report.config_size = (report.sizing[0], serving.get("intra_op_threads"))
    if batching and _delay_was_sized(serving):
        delay_us, delay_why, report.batched = _size_delay(winner, cases[0]["inputs"], measure, cores,
                                                          int(served["spec"]["max_batch_size"]), progress)
        report.delay = (delay_us, delay_why)
    served_size = (serving.get("instances"), serving.get("intra_op_threads"))
    # the same decision on the same kind of host: nothing to publish (a different host is recorded anew,
    # so serve/check/validate stop warning)
    same = (winner.variant == served_variant and (report.size_kept is not None or served_size == report.sizing)
            and (report.delay is None or report.delay[0] == serving.get("max_queue_delay_microseconds"))
            and not compare_hosts(served.get("host"), host, model=name))
    where = f"{host.get('cpu_model')} ({host.get('isa_class')}, {cores} usable cores)"
    delay = f", batching delay {report.delay[0]} us" if report.delay else ""
    delay += f" (instances kept: {report.size_kept})" if report.size_kept else ""
    if report.size_kept and report.size_kept.startswith(TUNED) and winner.variant != served_variant:
        delay += (f" - tuned for {served_variant}: run `triton-builder tune --publish` again for {winner.variant} "
                  "(its batching delay and batch sizes are its build's)")
    if same:
        report.why = (f"{name} version {number} already serves {served_variant} with {report.sizing[0]} instance(s) x "
                      f"{report.sizing[1]} thread(s){delay}, the best on {where}: nothing published")
        return report
    if dry_run:
        report.why = (f"would publish {winner.variant} ({report.sizing[0]} x {report.sizing[1]}{delay}) as a new version "
                      f"of {name} (now {served_variant}); --dry-run: nothing published")
        return report
    report.published = _publish(repository, name, number, winner, report, host, key)
    report.why = (f"{name} version {report.published['version']}: {winner.variant} with {report.sizing[0]} instance(s)"
                  f" x {report.sizing[1]} intra-op thread(s){delay}, measured on {where} (was {served_variant}, "
                  f"version {number})")
    return report


SWITCH_MARGIN = 0.10  # a change of variant must beat the served one by more than this, re-measured


def _incumbent(ranked: list[Candidate], served_variant: str, served_label: str) -> Candidate | None:
    """The candidate serving now: the served version itself, else another version of its variant."""
    same = [c for c in ranked if c.variant == served_variant]
    return next((c for c in same if c.label == served_label), same[0] if same else None)


def _confirm_change(winner: Candidate, incumbent: Candidate, measure: Measure, inputs: dict[str, np.ndarray],
                    cores: int, objective: str, report: "SelectReport", progress) -> Candidate:
    """Measure the served variant and the challenger again, back to back, twice (each keeps its best
    reading of these): single readings taken one after the other on a busy host differ by 2x (86k vs
    47k inf/s seen), and a republish on that noise flips the served variant back and forth. The
    change stands only if it still wins by more than SWITCH_MARGIN."""
    progress(f"select: {winner.variant} read fastest: measuring it and the served {incumbent.variant} again, "
             "back to back")
    best: dict[str, dict[str, float]] = {}
    for candidate in (incumbent, winner, incumbent, winner):
        again = measure(candidate.label, candidate.runner, inputs, cores)
        if candidate.label not in best or _score(again, objective) > _score(best[candidate.label], objective):
            best[candidate.label] = again
    for candidate in (incumbent, winner):
        candidate.measured = {**candidate.measured, **best[candidate.label]}
    new, old = _score(winner.measured, objective), _score(incumbent.measured, objective)
    gain = (new / old if objective != "latency" else old / new) if new and old else float("inf")
    if gain > 1 + SWITCH_MARGIN:
        return winner
    report.tie_rule = (f"kept: {winner.variant} read only {gain:.2f}x the served {incumbent.variant} when both were "
                       f"measured again (a change needs more than {1 + SWITCH_MARGIN:.2f}x)")
    return incumbent


def _size_was_sized(serving: dict[str, Any]) -> bool:
    """The served instances x threads were sized from an in-process measurement: not set by the spec, not
    a GPU target's, and not chosen by `tune --publish` (measured on the running server under load, which
    select's batch-1 in-process figures cannot overrule)."""
    return not str(serving.get("sized") or "").startswith(("from the spec", "GPU target", TUNED))


def _delay_was_sized(serving: dict[str, Any]) -> bool:
    """The served batching delay was sized from a measurement (not set by the spec, not a GPU target's)."""
    why = str(serving.get("delay_sized") or "")
    return "max_queue_delay_microseconds" in serving and not why.startswith(("from the spec", "GPU target"))


def _size_delay(winner: Candidate, inputs: dict[str, np.ndarray], measure: Measure, cores: int, max_batch: int,
                progress) -> tuple[int, str, tuple[int, float]]:
    """host.size_queue_delay from the winner measured here at batch 1 (already) and at a larger batch: the
    best batch of its build's benchmark, else the max batch size (at most 32). Also (that batch, its
    samples/s here): the new version's benchmark records it."""
    built = _build_benchmark(winner.meta).get("best_batch")
    batch = int(built) if built and 1 < int(built) <= max_batch else min(max_batch, 32)
    progress(f"select: measuring {winner.variant} at batch {batch} on this host (the batching delay)")
    batched = {k: np.concatenate([v[:1]] * batch) for k, v in inputs.items()}
    per_call = measure(f"{winner.label} batch {batch}", winner.runner, batched, cores)["throughput"]
    rates = {1: winner.measured["throughput"], batch: per_call * batch}
    delay, why = size_queue_delay(winner.measured["p50_ms"] / 1000.0, rates)
    return delay, f"{why} (measured on this host by triton-builder select)", (batch, rates[batch])


def _publish(repository: Path, name: str, served_number: int, winner: Candidate, report: SelectReport,
             host: dict[str, Any], key=None) -> dict[str, Any]:
    text, config = renamed_config(winner.folder.parent, name, report.config_size,
                                  delay_us=report.delay[0] if report.delay else None)
    artifact = winner.meta["artifact"]
    model_files = version_model_files(winner.folder, artifact)
    runtime = {n: winner.folder / n for n in ("model.py", "drift.py") if (winner.folder / n).is_file()}
    own = winner.folder / "reference.npz"  # the winner's own reference (its outputs, if it changed the function)
    extra: dict[str, bytes] = {"reference.npz": (own if own.is_file() else
                                                 model_dir(repository, name) / str(served_number) / "reference.npz")
                               .read_bytes()}
    extra.update({n: (winner.folder / n).read_bytes() for n in COPIED_EXTRAS if (winner.folder / n).is_file()})
    record = dict(winner.meta)
    record.update({
        "model_name": name,
        "build_date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        # this host's figures (select's, batch 1): `host` says where; the build host's stay under their own key
        "benchmark": _benchmark_here(winner, report, host),
        BUILD_BENCHMARK: _build_host_figures(winner.meta),
        "serving": {"instances": report.sizing[0], "intra_op_threads": report.sizing[1],
                    "sized": (report.size_kept
                              or f"by triton-builder select on this host ({host.get('usable_cores')} usable cores)"),
                    **({"max_queue_delay_microseconds": report.delay[0], "delay_sized": report.delay[1]}
                       if report.delay else {})},
        "selection": {"objective": report.objective, "selected": True,
                      **({"weights": report.weights} if report.weights is not None else {}),
                      "why": (f"best {report.objective} of the candidates re-measured on this host by "
                              f"triton-builder select" + (f"; {report.tie_rule}" if report.tie_rule else "")),
                      "candidates": _candidate_record(report.candidates)},
        "reselected_from": {"model": winner.label, "served_version": served_number,
                            "measured_on": winner.meta.get("host")},
    })
    return republish(repository, name, artifact["format"], model_files, runtime, extra, record, text, config,
                     winner.folder.parent, key)


def _benchmark_here(winner: Candidate, report: SelectReport, host: dict[str, Any]) -> dict[str, Any]:
    """The new version's ``benchmark``: the winner as select measured it on this host (in-process, batch 1,
    and the larger batch it measured for the batching delay), in the build benchmark's keys."""
    rates = {"1": round(winner.measured["throughput"], 1)}
    if report.batched:
        rates[str(report.batched[0])] = round(report.batched[1], 1)
    best = max(rates, key=lambda batch: rates[batch])
    return {"measured_by": (f"triton-builder select on this host ({host.get('cpu_model')}, {host.get('usable_cores')} "
                            f"usable cores): in-process, batch {' and '.join(rates)}"),
            "latency_ms_b1": {"p50": round(winner.measured["p50_ms"], 4)},
            "throughput_by_batch": rates, "best_throughput": rates[best], "best_batch": int(best),
            "threads": host.get("usable_cores"),
            **({"peak_memory_mb": winner.measured["peak_memory_mb"]} if "peak_memory_mb" in winner.measured else {})}


def _build_host_figures(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The build's benchmark with the host it was measured on (kept as it is where ``meta`` is already a
    copy select made); None where the build measured nothing."""
    if BUILD_BENCHMARK in meta:
        return meta[BUILD_BENCHMARK]
    figures = meta.get("benchmark")
    return {"host": meta.get("host"), **figures} if isinstance(figures, dict) and figures else None


def _candidate_record(candidates: list[Candidate]) -> dict[str, Any]:
    """metadata.yaml selection.candidates: by variant; a variant's version from another build, excluded,
    by its label when the variant's candidate already holds the key."""
    record: dict[str, Any] = {}
    for c in sorted(candidates, key=lambda c: bool(c.excluded)):
        record[c.variant if c.variant not in record else c.label] = c.excluded or c.measured
    return record
