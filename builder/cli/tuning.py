"""CLI verbs ``loadtest``, ``sweep`` and ``tune``; builder/cli/__init__.py adds them with ``register(subparsers)``.

Each verb forwards to one library function. Exit codes: 0 ok; 1 SLO broken (loadtest), failed
requests (sweep), no candidate met the budget (tune: a budget failure, as docs/reference/grammar.md
says); 2 bad arguments or server unreachable.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.api import DEFAULT_PORTS, DEFAULT_REPOSITORY
from builder.cli.arguments import add_model, add_output, duration, finite_float
from builder.cli.output import emit
from builder.core.errors import ServerError, UserInputError
from builder.core.progress import Reporter
from builder.tuning.loadtest import format_summary, run_loadtest
from builder.tuning.payload import fetch_model
from builder.tuning.sweep import run_sweep
from builder.tuning.tune import run_tune

seconds = duration  # the old name of this module's duration type


def _url(args: argparse.Namespace) -> str:
    return args.url or f"127.0.0.1:{DEFAULT_PORTS[args.protocol]}"


def _repository(args: argparse.Namespace) -> Path | None:
    """--repository (it must exist); the default ./model_repository only when it holds the model (a
    default that does not is no mistake of the user's: the payload is then generated)."""
    default = Path(DEFAULT_REPOSITORY)
    if args.repository == DEFAULT_REPOSITORY:
        return default if (default / args.name / "config.pbtxt").is_file() else None
    if args.repository is not None:
        if "://" in args.repository:  # Path() would fold s3://b/p into s3:/b/p in the message
            raise UserInputError(f"--repository {args.repository}: loadtest, sweep and tune read the repository "
                                 "from a local folder; pass a local copy (loadtest and sweep also take --payload "
                                 "FILE.npz instead)")
        path = Path(args.repository)
        if not path.is_dir():
            raise UserInputError(f"--repository {path}: not a directory; pass the folder the server serves")
        return path
    return None


def int_list(text: str) -> list[int]:
    """``1,4,16`` -> [1, 4, 16] (argparse type)."""
    try:
        return [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use comma-separated whole numbers, e.g. 1,4,16") from None


def cmd_loadtest(args: argparse.Namespace, reporter: Reporter) -> int:
    summary = run_loadtest(
        args.name, _url(args), args.protocol, args.users, args.run_time,
        args.out or Path("runs") / "loadtest" / args.name, payload=args.payload, timeout_s=args.timeout,
        repository=_repository(args), spawn_rate=args.spawn_rate, shape=args.shape, slo_p99_ms=args.slo_p99_ms,
        slo_max_failure_ratio=args.slo_max_failure_ratio, workers=args.workers, batch_size=args.batch_size,
        progress=reporter)
    lines = [format_summary(summary)] if reporter.quiet else []  # else the progress lines said it
    lines.append(f"reports: {Path(summary['files']['summary']).parent} (summary.json, report.html, locust_*.csv)")
    emit(args, summary, lines, ok=summary["exit_code"] == 0)
    return summary["exit_code"]


def cmd_sweep(args: argparse.Namespace, reporter: Reporter) -> int:
    result = run_sweep(args.name, _url(args), args.protocol, args.max_concurrency,
                       args.out or Path("runs") / "sweep" / args.name, payload=args.payload,
                       repository=_repository(args), levels=args.levels, window_s=args.window,
                       max_seconds_per_level=args.seconds_per_level, batch_size=args.batch_size,
                       engine=args.engine, progress=reporter)
    failed = [row for row in result["levels"] if row["failures"]]
    if failed and all(not row["requests"] or row["requests"] == row["failures"] for row in result["levels"]):
        _raise_if_unreachable(args)
    lines = [f"client: {result['client']}", f"wrote {result['files']['csv']} and {result['files']['png']}"]
    if reporter.quiet and result.get("steps_table"):  # else the progress lines showed it
        lines.append(f"where the time goes per request (server, us):\n{result['steps_table']}")
    lines += [f"concurrency {row['concurrency']}: {row['failures']} failed request(s): "  # the reasons, not a count
              + "; ".join(row.get("errors") or ["no reason recorded"]) for row in failed]
    emit(args, result, lines, ok=not failed)
    return 1 if failed else 0


def _raise_if_unreachable(args: argparse.Namespace) -> None:
    """Every request failed: a server that no longer answers is exit 2 (as loadtest's), not a sweep result."""

    try:
        fetch_model(_url(args), args.protocol, args.name)
    except ServerError as exc:
        raise ServerError(f"every request of the sweep failed and the server no longer answers: {exc}") from None


def cmd_tune(args: argparse.Namespace, reporter: Reporter) -> int:
    repository = _repository(args)
    if repository is None:
        raise UserInputError("tune needs the model repository the server serves: pass --repository DIR")
    kwargs = {}
    for name in ("delays", "instance_counts", "max_batch_sizes", "levels", "thread_counts", "usable_cores"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    result = run_tune(args.name, repository, _url(args), protocol=args.protocol, p99_budget_ms=args.p99_budget_ms,
                      seconds_per_candidate=args.seconds_per_candidate, write=args.write, publish=args.publish,
                      out_dir=args.out or Path("runs") / "tune" / args.name, payload=args.payload,
                      max_concurrency=args.max_concurrency, max_candidates=args.max_candidates,
                      confirm=not args.no_confirm, serve_copies=not args.in_place, batch_size=args.batch_size,
                      tie_margin=args.tie_margin,
                      engine=args.engine, signing_key=args.signing_key, progress=reporter, **kwargs)
    lines = list(result.get("table") or []) + [result.get("summary") or ""] if reporter.quiet else []
    if not args.write and not args.publish and result["winner"]:
        lines.append("(dry run: pass --write to write the winner into config.pbtxt and tuning.json)")
    emit(args, result, [line for line in lines if line], ok=result["exit_code"] == 0)
    return result["exit_code"]


def _common(p: argparse.ArgumentParser, default_protocol: str) -> None:
    add_model(p, "the local model repository folder the server serves (the payload: the latest version's "
                 "reference.npz; the default only where it holds the model, else a payload is generated)")
    p.add_argument("--url", help="Triton address HOST:PORT for --protocol (default 127.0.0.1:8000 http / 8001 grpc)")
    p.add_argument("--protocol", choices=("http", "grpc"), default=default_protocol,
                   help="default: %(default)s")
    p.add_argument("--payload", help="request data: a reference.npz or an .npz keyed by input name")
    p.add_argument("--batch-size", type=int, default=1, help="rows per request (default 1)")
    p.add_argument("--out", help="output folder (default runs/<verb>/<name>)")
    add_output(p)


def _engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=("auto", "perf_analyzer", "python"), default="auto",
                   help="measurement engine: Triton's perf_analyzer (installed on first use), the in-process "
                        "Python client, or auto = perf_analyzer when it can be had, else Python (default: auto)")


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("loadtest", parents=[common], help="Locust load test of a served model, with SLOs (exit 1 if broken)")
    _common(p, "http")
    p.add_argument("--users", type=int, default=8, help="concurrent users, one request in flight each (default 8)")
    p.add_argument("--spawn-rate", type=finite_float, help="users started per second (default: all at once)")
    p.add_argument("--run-time", type=duration, default=30.0, help="e.g. 30, 30s, 2m (default 30 s)")
    p.add_argument("--shape", choices=("constant", "ramp", "steps"), default="constant",
                   help="load shape: constant users, a ramp, or steps (default: %(default)s)")
    p.add_argument("--slo-p99-ms", type=finite_float, help="p99 latency SLO over the run (default: none)")
    p.add_argument("--slo-max-failure-ratio", type=finite_float, help="largest allowed failure ratio (default 0.01)")
    p.add_argument("--workers", type=int, default=0, help="run 1 master + N worker processes (default 0: one process)")
    p.add_argument("--timeout", type=duration, help="hard limit on the whole run (default: run time + 65 s)")
    p.set_defaults(func=cmd_loadtest)

    p = sub.add_parser("sweep", parents=[common], help="closed-loop concurrency sweep: latency vs throughput (CSV + PNG)")
    _common(p, "grpc")
    p.add_argument("--max-concurrency", type=int, default=16, help="levels 1, 2, 4, ... up to this (default 16)")
    p.add_argument("--levels", type=int_list, help="explicit levels instead, e.g. 1,4,16")
    p.add_argument("--window", type=duration, default=0.5, help="measurement window, e.g. 0.5, 2s (default 0.5 s)")
    p.add_argument("--seconds-per-level", type=duration, default=8.0, help="time cap per level, e.g. 8, 1m "
                   "(default 8 s)")
    _engine(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("tune", parents=[common], help="search batching/instances/max batch size under a p99 budget on the running server")
    _common(p, "grpc")
    p.add_argument("--p99-budget-ms", type=finite_float, required=True, help="p99 latency budget (ms)")
    p.add_argument("--seconds-per-candidate", type=duration, default=10.0,
                   help="time per candidate, e.g. 10, 30s, 1m (default 10 s)")
    writes = p.add_mutually_exclusive_group()  # one place for the winner: the served config, or a new version
    writes.add_argument("--write", action="store_true", help="write the winner into config.pbtxt (+ tuning.json)")
    writes.add_argument("--publish", action="store_true",
                   help="publish the winner as a new version (the latest version's files, the tuned config, tuning.json)")
    p.add_argument("--signing-key", help="with --publish: elliptic-curve private key (PEM) that signs the new version "
                   "(default: $TRITON_BUILDER_SIGNING_KEY; its password only via $TRITON_BUILDER_SIGNING_KEY_PASSWORD)")
    p.add_argument("--delays", type=int_list, help="max_queue_delay_microseconds to try (default 0,100,500,2000)")
    p.add_argument("--instances", dest="instance_counts", type=int_list,
                   help="instance counts at the built threads (default: from the usable cores: 1 x all cores, "
                        "2 x half, one per core, cores + 1)")
    p.add_argument("--server-cores", dest="usable_cores", type=int,
                   help="cores the server may use, for the default layouts (default: a tritonserver on this machine "
                        "is found by its port and its affinity read; else this process's usable cores)")
    p.add_argument("--threads", dest="thread_counts", type=int_list,
                   help="intra-op threads per instance, tried with the best instance count (python backend; "
                        "default: the host layouts cover them)")
    p.add_argument("--max-batch-sizes", type=int_list, help="smaller max_batch_size values to try (default: the power of two at most the "
                        "requests per instance at the scoring concurrency, and twice that)")
    p.add_argument("--levels", type=int_list, help="concurrency levels (default 1,2,4,...,64)")
    p.add_argument("--max-concurrency", type=int, help="highest concurrency level")
    p.add_argument("--max-candidates", type=int, default=12, help="bound on configs tried (default 12)")
    p.add_argument("--no-confirm", action="store_true", help="skip re-measuring the winner and baselines")
    p.add_argument("--in-place", action="store_true",
                   help="load each candidate into the model itself (unavailable during each reload) rather than "
                        "as a copy under its own name (the default where its files are at most 64 MB)")
    p.add_argument("--tie-margin", type=finite_float, default=0.05,
                   help="prefer the config closest to the one as built within this fraction of the best (default 0.05)")
    _engine(p)
    p.set_defaults(func=cmd_tune)
