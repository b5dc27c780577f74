"""`triton-builder tune`: measured tuning of dynamic batching, instance count and max_batch_size for a
model on the RUNNING server, under a p99 latency budget, maximising throughput.

Each candidate config is loaded through Triton's model-control API with the config as JSON
(``load_model(name, config=...)``: the server must run with ``--model-control-mode=explicit``; it is
never restarted), checked to be what Triton actually loaded, then measured with the engine
(builder/tuning/engine.py: perf_analyzer when present, else the in-process closed-loop client) at
rising concurrency (1, 2, 4, ...), each level until
stable (capped), stopping at the first level whose p99 exceeds the budget or once throughput stops
rising; two bisection steps then look between the last level within the budget and the first over
it (e.g. 16 ok, 32 over: 24, then 20 or 28). A climbed level over the budget is measured a second time
before it counts as over (a moment of CPU taken by another process must not rule a candidate out).
A candidate's score is its highest throughput at a level within the budget and without failures.

Each candidate other than the config the model serves from its file is loaded as a copy of the
model under its own name (``<model>__tune<pid>_<n>``: the served version's files sent with the load
request, builder/tuning/search.py ``ModelControl``), and the previous copy is unloaded while the next
one loads; the model itself stays loaded and untouched. Where the files are over 64 MB (each load
sends them), several versions are served, or ``serve_copies=False``, the model itself is unloaded and
then loaded with the next config (not reloaded in place: Triton 2.51's python backend crashed the
server when requests reached a model reloaded in place while its old instance was still unloading),
so it is unavailable for a few seconds each time. Either way the candidates' measurements share the
server's CPU with any other traffic: tune on a server that is not taking production traffic.

A server that stops answering ends the search as it ends loadtest and sweep: exit 2, "server at URL
unreachable since ...". Its liveness endpoint is polled during every model-control call and after a
failed load or a level with failed requests (builder/serving/client.py ``Liveness``); 15 s without
an answer is the end, not one failed candidate after another (each load waited for its 2-minute
timeout). The interrupt path's cleanup (the copy unloaded, the model loaded from its file) is then
sent by a helper process that waits for the server up to 10 minutes: a hung server takes a request
only when it wakes up, and a gRPC call given up before then is cancelled.

The search is staged and bounded, and compares candidates where it matters: the config as built
(``default``: what the build published, already sized to its host) is measured over the rising
concurrency levels; every other candidate only at the level where the default scored, plus one level
up when its p99 scaled to that concurrency stays within the budget, or one down when it is over (``Search.probe``): a
quick search that spends its time on configs, not on levels. Stages 3-5 start from the best batching
candidate so far (``seconds_per_candidate`` is spread over the levels of the default's climb; a probed
level may take twice that share):

1. baselines: ``default`` (the config on disk) and ``no batching`` (dynamic batching off, 1 instance);
2. layouts: instances x intra-op threads per instance (``layouts``), by default from the cores this
   process may use (``host_layouts``: 1 x all cores, 2 x half, one instance per core, and one more
   instance than cores, which keeps the cores busy while an instance is in its per-request overhead);
   or ``instance_counts`` at the built threads, then ``thread_counts`` with the best instance count;
3. queue delays (``delays`` us), shortest first; the first longer than the best's that scores 5 % below
   a shorter one ends the stage (throughput over the delay rises, then falls: the rest only wait longer);
4. smaller max_batch_sizes (``max_batch_sizes``, each <= the built one; by default the power of two at
   most the requests each instance holds at the scoring level, and twice that);
5. preferred_batch_size = the power of two nearest the average batch Triton formed, if the best
   so far waits for batches (delay > 0).

The winner is the config with the fewest changes from the config as built among those within
``tie_margin`` (5 %) of the best score and, unless it is the default, more than ``tie_margin`` over
the default's: smaller differences are within run-to-run noise on a shared machine, and not worth a
change. The top scorer, the winner and the default are then
measured once more at the concurrency that scored (``confirm``; the default last, so the model ends
served from its file without another reload) and each keeps the better of its two measurements
(interference from other processes only ever slows a run down), so the winner and the default are
compared under the same conditions; with copies, the winner (its copy still loaded) and the default
(the model itself) are then measured once more each, back to back, without a reload (best of three
each); ``no batching`` keeps its one measurement. A candidate whose
config Triton already serves is measured without a reload.

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

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from builder.core.errors import ServerError, UserInputError
from builder.core.files import output_folder
from builder.core.host import usable_cores, usable_cores as host_cores
from builder.core.local_server import server_usable_cores
from builder.core.processes import terminate_as_interrupt
from builder.repository.config import config_as_dict, thread_parameter
from builder.repository.layout import model_dir, not_in_repository, require_writable
from builder.repository.republish import publish_tuned
from builder.repository.signing import require_key_if_signed, resolve_signing_key
from builder.repository.tuned import (TUNED_MARK, config_text_from_dict, monitored_step, original_header,
                                      refuse_if_signed, write_tuned_config)
from builder.serving.check import config_differences
from builder.serving.client import ServerGone, TritonClient
from builder.serving.startup import bytecode_dirs, remove_new_bytecode
from builder.tuning.engine import choose_engine
from builder.tuning.payload import fetch_model, load_samples, make_requests
from builder.tuning.search import (COPY_UPLOAD_LIMIT, Candidate, ModelControl, Search, best_candidate as _best,
                                   built_candidate, served_copy_files)

DEFAULT_DELAYS = (0, 100, 500, 2000)
DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)


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


def run_tune(model: str, repository: str | Path, url: str, *, protocol: str = "grpc", p99_budget_ms: float,
             seconds_per_candidate: float = 10.0, write: bool = False, out_dir: str | Path = "runs/tune",
             payload: str | Path | None = None, delays=DEFAULT_DELAYS, instance_counts=None,
             max_batch_sizes=None, levels=DEFAULT_LEVELS, max_concurrency: int | None = None,
             max_candidates: int = 12, window_s: float = 0.5, confirm: bool = True, batch_size: int = 1,
             tie_margin: float = 0.05, thread_counts=None, usable_cores: int | None = None, publish: bool = False,
             engine: str = "auto", signing_key=None, serve_copies: bool = True,
             progress: Callable[[str], object] | None = None) -> dict[str, Any]:
    """Search configs of ``model`` on the server at ``url`` (its ``protocol`` port) under ``p99_budget_ms``.

    Returns the result (also ``out_dir/tuning.json``): every candidate, the winner, both baselines, the
    ratios, ``table`` (printable lines) and ``exit_code`` (0 a winner met the budget, 1 none did).
    Raises ``UserInputError`` for bad arguments or a server without model control, ``ServerError`` if
    the model cannot be reached or the server stops answering (module doc).
    """

    say = progress or (lambda message: None)
    model = monitored_step(repository, model, say)
    delays, instance_counts, max_batch_sizes, levels = _check_arguments(
        p99_budget_ms, seconds_per_candidate, window_s, protocol, tie_margin, delays, instance_counts,
        max_batch_sizes, levels, max_concurrency, usable_cores)
    if write and publish:
        raise UserInputError("--write and --publish: choose one (--write changes the served config.pbtxt in place, "
                             "--publish adds the winner as a new version)")
    if write or publish:  # the winner is written at the end: a read-only repository is refused before the search
        require_writable(Path(repository), staged=publish)
    config_path, base_text, base = _read_config(repository, model, max_batch_sizes, batch_size)
    if write and not publish:  # a signed version refuses an in-place config: say so before the search, not after
        refuse_if_signed(repository, model)
    key = None
    if publish:  # a bad key fails before the search; $TRITON_BUILDER_SIGNING_KEY when none is given
        key = resolve_signing_key(signing_key, Path(repository))
        require_key_if_signed(Path(repository), model, key)
    default = built_candidate(base)
    thread_counts = _thread_counts(base, thread_counts)
    if usable_cores is None and instance_counts is None:
        usable_cores = _server_cores(url, say)
    layouts = _layouts(base, default, instance_counts, usable_cores)

    interface = fetch_model(url, protocol, model)  # ServerError if not reachable / not ready
    differences = config_differences(base, interface.config)
    if differences:
        say(f"note: the server's loaded config differs from {config_path}: {'; '.join(differences)}; "
            "tuning starts from the file")
    samples, source = load_samples(interface, payload, repository)
    say(f"payload: {source}")
    requests = make_requests(samples, batch_size, interface.batching)
    out = output_folder(out_dir)
    per_level_s = max(4 * window_s, seconds_per_candidate / len(levels))

    meter = choose_engine(engine, say)
    meter.prepare(url, protocol, interface, samples, requests, batch_size=batch_size, work_dir=out / "perf_analyzer")
    files = _copy_files(url, protocol, repository, model, say) if serve_copies else None
    search = Search(url, protocol, model, base, requests, interface.outputs, levels, p99_budget_ms,
                    window_s, per_level_s, max_candidates, say, engine=meter, files=files)
    if not differences:
        search.serving_file(default)
    started = time.monotonic()
    # the python backend's stub writes model.py's bytecode into the version folder it loads from (the
    # embedded server removes it after its own loads, not after ours): a published version must not change
    bytecode = bytecode_dirs(Path(repository))
    search.server.bytecode_before = (Path(repository), bytecode)
    try:
        with terminate_as_interrupt():  # killed (SIGTERM) like interrupted: the server is put back as it was
            try:
                none, default = search.candidates(default, layouts, delays, max_batch_sizes, thread_counts)
                winner = _choose(search.order, default, tie_margin)
                if confirm and winner is not None:
                    winner = _confirm(search, default, winner, tie_margin)
            finally:
                restore_error = search.restore()
                remove_new_bytecode(Path(repository), bytecode)
    except ServerGone as exc:  # as loadtest and sweep: exit 2, not a failed candidate after another
        search.server.close()
        raise ServerError(f"{exc}; tune stopped{_cleanup(search)}. Look into the server's log, restart it "
                          "(triton-builder serve), then tune again") from None
    if restore_error is not None:
        search.server.close()
        raise ServerError(f"tuning finished but '{model}' could not be reloaded from {config_path}: {restore_error}"
                          f"{_cleanup(search)}")

    ratios = {"vs_no_batching": _ratio(winner, none), "vs_default": _ratio(winner, default)}
    record = _record(model, url, protocol, search, source, batch_size, p99_budget_ms, seconds_per_candidate,
                     window_s, levels, time.monotonic() - started, tie_margin, winner, none, default, ratios)
    table = format_table(search.order, winner, p99_budget_ms, top=_best(search.order))
    for line in table:
        say(line)
    summary_line = _ratio_line(winner, none, default, ratios, p99_budget_ms)
    say(summary_line)
    if (write or publish) and winner is not None and _changes(winner, default) == 0:
        # the config as built won: a new version (or a rewritten file) would serve the same config
        record["written"] = False
        say(built_config_won(config_path, publish, loaded_differs=bool(differences)))
    elif (write or publish) and winner is not None:
        _write_winner(search.server, repository, model, config_path, base_text, base, winner, record, say,
                      header_line=f"#   {summary_line} over {protocol}", publish=publish, key=key)
        remove_new_bytecode(Path(repository), bytecode)
    search.server.close()
    tmp = out / "tuning.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, out / "tuning.json")
    record["table"] = table
    record["summary"] = summary_line
    record["exit_code"] = 0 if winner is not None else 1
    return record


def _confirm(search: Search, default: Candidate, winner: Candidate, tie_margin: float) -> Candidate | None:
    """The confirm round (module doc); the winner chosen again after it."""
    # the default last: it is the file's config, so the model need not be reloaded afterwards
    for candidate in dict.fromkeys([_best(search.order), winner, default]):
        search.measure(candidate, confirm_round=True)
    if search.server.files is not None and winner is not default:
        # both served now (the winner's copy and the model itself): once more each, back to back
        for candidate in (winner, default):
            search.measure(candidate, confirm_round=True)
    return _choose(search.order, default, tie_margin)



def built_config_won(config_path: Path, publish: bool, loaded_differs: bool) -> str:
    """The line for a search whose winner is the config file as built; where the server had loaded another
    config (the file changed since: a newer build), that one is still what it serves."""
    where = ("holds it; the server still serves the config it loaded before, which differs: restart "
             "`triton-builder serve` to load the file)" if loaded_differs else "serves it)")
    return f"the config as built won: nothing {'published' if publish else 'written'} ({config_path} already {where}"

def _cleanup(search: Search) -> str:
    """What was asked of a server that stopped answering (``Search.restore``), for the error message."""
    return f"; {search.cleanup}" if search.cleanup else ""


def _copy_files(url: str, protocol: str, repository, model: str, say) -> dict[str, bytes] | None:
    """The files for serving candidates as copies of the model (module doc), or None: reload in place."""

    with TritonClient(url, protocol) as client:
        versions = [int(v) for v in client.model_metadata(model).get("versions", []) if str(v).isdigit()]
    files = served_copy_files(model_dir(Path(repository), model), versions[0]) if len(versions) == 1 else None
    if files is None:
        say(f"note: candidates are loaded into '{model}' itself, which is unavailable during each reload "
            f"(served versions {versions}; a copy needs one served version in {repository} and at most "
            f"{COPY_UPLOAD_LIMIT // 2**20} MB of files)")
    return files


def _check_arguments(p99_budget_ms, seconds_per_candidate, window_s, protocol, tie_margin, delays, instance_counts,
                     max_batch_sizes, levels, max_concurrency,
                     usable_cores=None) -> tuple[list[int], list[int], list[int], list[int]]:
    """The arguments checked (``UserInputError`` naming the option), lists as whole numbers."""
    if usable_cores is not None and (isinstance(usable_cores, bool) or not isinstance(usable_cores, int)
                                     or usable_cores < 1):
        raise UserInputError(f"--server-cores {usable_cores}: the number of cores the server may use (1 or more)")
    if p99_budget_ms is None or not p99_budget_ms > 0:  # nan too
        raise UserInputError(f"--p99-budget-ms {p99_budget_ms}: give the p99 latency budget in ms (> 0)")
    if seconds_per_candidate < 4 * window_s:
        raise UserInputError(f"--seconds-per-candidate {seconds_per_candidate}: needs at least {4 * window_s:g} s "
                             "(a warm-up window and three measured ones)")
    if protocol not in ("http", "grpc"):
        raise UserInputError(f"--protocol {protocol!r}: use http or grpc")
    if not 0 <= tie_margin < 1:
        raise UserInputError(f"--tie-margin {tie_margin}: a fraction within 0..1, e.g. 0.1")
    delays = _csv_ints(delays, "delays")
    instance_counts = None if instance_counts is None else _csv_ints(instance_counts, "instances", 1)
    max_batch_sizes = None if max_batch_sizes is None else _csv_ints(max_batch_sizes, "max-batch-sizes", 1)
    levels = sorted(set(_csv_ints(levels, "levels", 1)))
    if max_concurrency is not None:
        levels = [c for c in levels if c <= max_concurrency] or [max_concurrency]
    if not levels:
        raise UserInputError("--levels: give at least one concurrency")
    return delays, instance_counts, max_batch_sizes, levels


def _built_threads(base: dict) -> str | None:
    """The config's intra-op thread parameter as written (builder/repository/config.py THREAD_PARAMETERS);
    None where it has none."""
    parameters = base.get("parameters") or {}
    return (parameters.get(thread_parameter(parameters) or "") or {}).get("string_value")


def _thread_counts(base: dict, given) -> list[int]:
    """Intra-op threads per instance to try with the best instance count (``given``: --threads); []
    where none are given, and an error where the config has no intra_op_threads parameter (only the
    python backend takes it)."""
    if _built_threads(base) is None:
        if given:
            raise UserInputError("--threads: this model's config sets no intra-op thread count (intra_op_threads, "
                                 "intra_op_thread_count, INTRA_OP_THREAD_COUNT or INFERENCE_NUM_THREADS): rebuild "
                                 "it with triton-builder, which writes the one its backend reads")
        return []
    return [] if given is None else _csv_ints(given, "threads", 1)


def host_layouts(cores: int, threaded: bool, max_instances: int = 16) -> list[tuple[int, int]]:
    """(instances, intra-op threads) to try on a host with ``cores`` usable cores: 1 x all cores, 2 x half,
    one instance per core, and one instance more than cores (keeps the cores busy while an instance is
    in its per-request overhead: Model Analyzer's best on a 2-core host was 3 instances). Without
    intra-op threads (``threaded`` False: not the python backend) the instance counts alone, threads 0."""
    cores = max(1, int(cores))
    counts = sorted({1, 2, max(1, cores // 2), cores, cores + 1} & set(range(1, max_instances + 1)))
    return [(count, max(1, cores // count) if threaded else 0) for count in counts]


def _server_cores(url: str, say) -> int | None:
    """The usable cores of a server listening on this machine where they differ from this process's (it
    runs under another affinity: the load generator kept off the server's cores); None otherwise."""

    found, mine = server_usable_cores(url), usable_cores()
    if found is None or found[0] == mine:
        return None
    say(f"layouts sized to the server's {found[0]} usable core(s) (tritonserver pid {found[1]}); this process may "
        f"use {mine}")
    return found[0]


def _layouts(base: dict, default: Candidate, instance_counts, usable_cores: int | None) -> list[tuple[int, int]]:
    """The (instances, threads) pairs of stage 2, without the config as built; threads 0: as built.
    ``instance_counts`` given (--instances): those at the built threads; else ``host_layouts`` from the
    usable cores (builder/core/host.py; ``usable_cores`` injects them)."""
    built = _built_threads(base)
    built_threads = int(built) if built and built.isdigit() else 0
    if instance_counts is not None:
        pairs = [(count, 0) for count in instance_counts]
    else:
        pairs = host_layouts(usable_cores or host_cores(), built is not None)
    out = []
    for instances, threads in pairs:
        threads = 0 if threads == built_threads else threads
        if (instances, threads) != (default.instances, 0) and (instances, threads) not in out:
            out.append((instances, threads))
    return out


def _read_config(repository, model: str, max_batch_sizes: list[int], batch_size: int) -> tuple[Path, str, dict]:
    """``(config path, its text, its JSON form)``; ``UserInputError`` if the model cannot be tuned so."""

    config_path = model_dir(Path(repository), model) / "config.pbtxt"
    if not config_path.is_file():  # the folder the server serves
        raise not_in_repository(model, Path(repository))
    base_text = config_path.read_text(encoding="utf-8")
    try:  # the served file is the user's (edited, damaged): named, not "config" as the text we render is
        base = config_as_dict(base_text, str(config_path))
    except UserInputError as err:
        raise UserInputError(f"{err}; fix that file or rebuild the model (triton-builder build) before tuning it") \
            from None
    if base.get("platform") == "ensemble":
        raise UserInputError(f"model '{model}' is an ensemble: tune its step models instead")
    built_max = int(base.get("max_batch_size", 0))
    too_big = [m for m in max_batch_sizes or () if m > built_max]
    if too_big:
        raise UserInputError(f"--max-batch-sizes {too_big}: must be <= the built max_batch_size {built_max} "
                             "(the model was verified up to that size)")
    if batch_size > max(built_max, 1):
        raise UserInputError(f"--batch-size {batch_size} > max_batch_size {built_max}")
    return config_path, base_text, base


def _record(model, url, protocol, search: Search, source, batch_size, p99_budget_ms, seconds_per_candidate,
            window_s, levels, elapsed, tie_margin, winner, none, default, ratios) -> dict[str, Any]:
    """What ``tuning.json`` holds: the settings, every candidate, the winner and the baselines."""
    return {
        "model": model, "tuned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "server": url, "protocol": protocol, "engine": search.engine.name, "client": search.client_kind,
        "payload": source,
        "batch_size": batch_size, "p99_budget_ms": p99_budget_ms, "seconds_per_candidate": seconds_per_candidate,
        "window_s": window_s, "levels": levels, "search_seconds": round(elapsed, 1),
        "candidates_loaded_as": ("copies of the model (the model itself untouched)" if search.server.files is not None
                                 else "the model itself, reloaded"),
        "scoring": "highest throughput at a concurrency level whose p99 is within the budget, with no failures",
        "winner_rule": f"the config with the fewest changes from the default among those scoring within "
                       f"{tie_margin:.0%} of the best and, to replace the default, more than {tie_margin:.0%} over "
                       "it (smaller gains are within run-to-run noise)",
        "winner": winner.as_dict() if winner else None,
        "baselines": {"no_batching": none.as_dict(), "default": default.as_dict()},
        "ratios": ratios,
        "candidates": [c.as_dict() for c in search.order],
        "written": False,
    }


def _write_winner(server: ModelControl, repository, model, config_path: Path, base_text: str, base: dict,
                  winner: Candidate, record: dict[str, Any], say, header_line: str, publish: bool = False,
                  key=None) -> None:
    """The winner into ``config.pbtxt`` + ``tuning.json`` (``publish``: as a new version of the model, the
    latest version's files with the tuned config; builder/repository/reselect.py), then served from the
    file (checked)."""

    record["written"] = True
    record["files"] = {"config": str(config_path), "record": str(config_path.parent / "tuning.json")}
    header = original_header(base_text) + [
        f"{TUNED_MARK} on {record['tuned_at']}: {winner.describe()}",
        header_line,
        "#   every candidate's measurements: tuning.json beside this file",
    ]
    text = config_text_from_dict(winner.config(base), header)
    if publish:
        published = publish_tuned(repository, model, text, record, signing_key=key)
        record["published_version"] = published["version"]
        config_file, record_file = config_path, Path(published["path"]) / "tuning.json"
    else:
        config_file, record_file = write_tuned_config(repository, model, text, record)
    server.load(None)  # serve exactly the file just written
    served = server.loaded_config()
    mismatch = config_differences(config_as_dict(text), served)
    if mismatch:
        raise ServerError(f"after writing {config_file}, Triton serves something else: {'; '.join(mismatch)}")
    say(f"wrote {config_file} and {record_file}; the server now serves the tuned config")


def _changes(candidate: Candidate, default: Candidate) -> int:
    """How far a candidate is from the config as built (``default``)."""
    return (int(candidate.batching != default.batching) + int(candidate.delay_us != default.delay_us)
            + int(candidate.instances != default.instances) + int(candidate.max_batch_size != default.max_batch_size)
            + int(candidate.preferred != default.preferred) + int(bool(candidate.threads)))


def _choose(candidates: list[Candidate], default: Candidate, margin: float) -> Candidate | None:
    """The winner: the config closest to the one as built among those within ``margin`` of the best score
    (a smaller gain is within run-to-run noise, and not worth a change); the higher score on a tie. A
    change must also beat the default itself by more than ``margin`` (a top scorer far ahead could
    otherwise make a config 2 % over the default the winner)."""
    top = _best(candidates)
    if top is None:
        return None
    close = [c for c in candidates if c.best is not None and not c.error and c.score * (1 + margin) >= top.score]
    if default in candidates and default.best is not None and not default.error:
        close = [c for c in close if c is default or c.score > default.score * (1 + margin)] or [default]
    return min(close, key=lambda c: (_changes(c, default), -c.score))


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
