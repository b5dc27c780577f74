"""CLI verbs ``serve``, ``check`` and ``install-backends``; builder/cli/__init__.py adds them with ``register(subparsers)``.
Each forwards to one library function."""

from __future__ import annotations

import argparse

from builder import serve
from builder.api import DEFAULT_PORTS  # Triton's own, which `check`, `loadtest`, `sweep` and `tune` assume too
from builder.cli.arguments import add_model, add_model_version, add_output, add_repository
from builder.cli.output import add_signature_arguments, emit
from builder.core.errors import UserInputError
from builder.core.processes import port_in_use
from builder.core.progress import Reporter
from builder.repository.layout import existing_versions
from builder.serving.native_backends import install_backends
from builder.storage.mlflow_registry import materialise
from builder.storage.served import check_served_at

# what `serve -q` / `replicas -q` still print: where to connect, and what failed or stopped
RESULT_LINES = ("  HTTP", "  gRPC", "  metrics", "  log", "  serving", "  replica", "  Prometheus", "  FAILED",
                "  left out", "  warning", "received ", "tritonserver ", "nginx ", "replica ", "every replica",
                "rollout stopped", "  watch")


def quiet_announce(reporter: Reporter):
    """``announce`` for the long-running verbs: every line, or under -q only the RESULT_LINES ones."""
    def announce(line: str) -> None:
        if not reporter.quiet or line.startswith(RESULT_LINES):
            print(line, flush=True)
    return announce


def port_number(text: str) -> int:
    """The argparse type of every port flag: 1 to 65535. Port 0 ("any free port") started a server no
    client could find (60 s, then "not live on 127.0.0.1:0") and 70000 ended in an OverflowError."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number: give one from 1 to 65535") from None
    if not 0 < value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: give one from 1 to 65535, or leave the flag "
                                         "out to have one picked")
    return value


def refuse_shared_ports(flags: dict[str, int | None]) -> None:
    """A ``UserInputError`` naming both flags when two of ``{flag: port}`` are the same port, before
    anything starts: the server would fail to bind the second after loading every model, and print
    its whole usage text before the reason."""
    first: dict[int, str] = {}
    for flag, port in flags.items():
        if port is None:
            continue
        if port in first:
            raise UserInputError(f"{first[port]} {port} and {flag} {port}: one port cannot serve both; give each "
                                 "its own port, or leave one out to have a free one picked")
        first[port] = flag


def _bindable(host: str, port: int) -> bool:
    return not port_in_use(host, port)


def _ports(args: argparse.Namespace, reporter: Reporter) -> dict[str, int | None]:
    """The ports asked for; unset ones get Triton's defaults when all three are free (so the other
    verbs' defaults reach this server), else free ones, said plainly. Another server may still take a
    default between this check and the bind: the server's start then fails naming the port and option."""
    asked = {"http": args.http_port, "grpc": args.grpc_port, "metrics": args.metrics_port}
    refuse_shared_ports({f"--{kind}-port": port for kind, port in asked.items()})
    unset = [kind for kind, port in asked.items() if port is None]
    if not unset:
        return asked
    # a default another flag was given (--http-port 8001) is as unusable as one in use
    given = [k for k in unset if DEFAULT_PORTS[k] in asked.values()]
    busy = [k for k in unset if k not in given and not _bindable(args.host, DEFAULT_PORTS[k])]
    if not given and not busy:
        return {kind: DEFAULT_PORTS[kind] if port is None else port for kind, port in asked.items()}
    reasons = [f"port(s) {', '.join(str(DEFAULT_PORTS[k]) for k in kinds)} {why}"
               for kinds, why in ((busy, "in use here"), (given, "given to another flag")) if kinds]
    reporter(f"note: {'; '.join(reasons)}: serving on free ports instead; pass the printed addresses to "
             "check/loadtest with --url (or choose ports with --http-port/--grpc-port/--metrics-port)")
    return asked


def cmd_serve(args: argparse.Namespace, reporter: Reporter) -> int:
    extra = ["--metrics-config=summary_latencies=true"] if args.latency_summaries else []
    if args.repository.startswith("models:/"):  # a registry version, materialised into a local repository
        args.repository = str(materialise(args.repository, args.registry).parent)
    ports = _ports(args, reporter)
    return serve(args.repository, http_port=ports["http"], grpc_port=ports["grpc"],
                 metrics_port=ports["metrics"], host=args.host, extra_args=extra,
                 public_key=args.public_key, require_signature=args.require_signature,
                 announce=quiet_announce(reporter), watch=not args.no_watch)


def cmd_check(args: argparse.Namespace, reporter: Reporter) -> int:
    if args.repository.startswith("models:/"):  # the registry version's reference, as serve materialises it
        folder = materialise(args.repository, args.registry)
        args.repository = str(folder.parent)
        if args.model_version is None:  # that version, not whatever the server serves as its latest
            args.model_version = existing_versions(folder)[-1]
    report = check_served_at(args.name, args.repository, url=args.url, grpc_url=args.grpc_url,
                             protocol=args.protocol, version=args.model_version)
    emit(args, report, report.lines())
    return 0 if report.ok else 1


def cmd_install_backends(args: argparse.Namespace, reporter: Reporter) -> int:
    report = install_backends(args.backend, force=args.force, progress=reporter)
    emit(args, report, report.lines())
    return 0 if report.ok else 1


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve a repository on the embedded tritonserver until Ctrl-C")
    add_repository(p, "model repository folder, s3:// URL or models:/NAME/VERSION")
    p.add_argument("--http-port", type=port_number,
                   help="HTTP port (default: 8000, as check/loadtest assume; a free one if busy)")
    p.add_argument("--grpc-port", type=port_number, help="gRPC port (default: 8001; a free one if busy)")
    p.add_argument("--metrics-port", type=port_number, help="metrics port (default: 8002; a free one if busy)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--latency-summaries", action="store_true",
                   help="publish p50/p95/p99 latency summaries (the dashboards' percentile panels need them; "
                        "they cost throughput)")
    p.add_argument("--no-watch", action="store_true",
                   help="do not load a model again when its folder changes while serving (by default a new version, "
                        "a rollback or a tuned config reaches this server within seconds, without a restart)")
    add_signature_arguments(p)
    p.add_argument("--registry", help="MLflow server URL when --repository is models:/NAME/VERSION or "
                   "models:/NAME@ALIAS (default: $MLFLOW_TRACKING_URI)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("check", parents=[common],
                       help="served accuracy gate: compare a running server's answers with reference.npz")
    add_model(p, "model repository folder, s3:// URL or models:/NAME/VERSION")
    p.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP address (default: %(default)s)")
    p.add_argument("--grpc-url", help="Triton gRPC address (default: HTTP port + 1)")
    p.add_argument("--protocol", choices=("http", "grpc", "both"), default="both",
                   help="which protocols to check (default: %(default)s)")
    add_model_version(p, "the model version to check (default: the latest)")
    p.add_argument("--registry", help="MLflow server URL when --repository is models:/NAME/VERSION or "
                   "models:/NAME@ALIAS (default: $MLFLOW_TRACKING_URI)")
    add_output(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("install-backends", parents=[common],
                       help="build Triton's own C++ backends (r24.10) for the embedded server, once (cached)")
    p.add_argument("--backend", action="append", metavar="NAME",
                   help="a backend to build (repeatable; default: onnxruntime and pytorch; named only: openvino, and "
                        "onnxruntime-gpu, the onnxruntime backend built for CUDA 12 GPUs, served under "
                        "TRITON_BUILDER_BACKENDS=gpu)")
    p.add_argument("--force", action="store_true", help="build again even where the cache holds a build")
    add_output(p)
    p.set_defaults(func=cmd_install_backends)
