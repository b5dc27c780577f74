"""The `triton-builder` command: one function per verb, each forwarding to one library function.

Exit codes: 0 success; 1 verification/check failure; 2 user input or server unreachable
(see builder/errors.py). Errors print one clear message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from builder.errors import BuilderError

DEFAULT_REPOSITORY = "model_repository"


def _print_err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_build(args: argparse.Namespace) -> int:
    from builder.pipeline import build
    from builder.report import format_table

    variants = args.variants.split(",") if args.variants else None
    result = build(args.spec, args.repository, variants=variants, target=args.target, strict=args.strict,
                   publish_variants=args.publish_variants or None, benchmark_seconds=args.benchmark_seconds)
    print()
    print(format_table(result.rows))
    for item in result.published:
        print(f"published {item['name']} version {item['version']} ({item['backend']}) -> {item['path']}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from builder.repository.validate import validate_model

    report = validate_model(args.model, args.version, gpu=args.gpu, tensorrt_version=args.tensorrt_version)
    print(f"{report.model}: {'OK' if report.ok else 'FAIL'}")
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def cmd_serve(args: argparse.Namespace) -> int:
    from builder.serving.embedded import serve_forever

    extra = ["--metrics-config=summary_latencies=true"] if args.latency_summaries else []
    return serve_forever(args.repository, http_port=args.http_port, grpc_port=args.grpc_port,
                         metrics_port=args.metrics_port, host=args.host, extra_args=extra)


def cmd_check(args: argparse.Namespace) -> int:
    from builder.storage.served import check_served_at  # check_served, for a folder or an s3:// repository

    report = check_served_at(args.name, args.repository, url=args.url, grpc_url=args.grpc_url,
                             protocol=args.protocol, version=args.version)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    from builder.main_job import run_main_job

    return run_main_job(args.spec, args.repository, load_seconds=args.load_seconds, users=args.users,
                        keep_serving=args.keep_serving)


def _add_common_repository(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", default=DEFAULT_REPOSITORY, help="model repository folder (default: %(default)s)")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-builder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="export, verify, measure and publish a model spec")
    p.add_argument("spec", help="model spec YAML")
    _add_common_repository(p)
    p.add_argument("--variants", help="comma-separated variants to try (default: the target's defaults)")
    p.add_argument("--target", help="embedded | cpu | gpu (default: the spec's deploy.target)")
    p.add_argument("--strict", action="store_true", help="fail if any variant fails verification")
    p.add_argument("--publish-variants", action="store_true", help="also publish the others as <name>__<variant>")
    p.add_argument("--benchmark-seconds", type=float,
                   help="measuring time cap per variant (default 2; 0 skips measuring and selects by preference)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("validate", help="re-check hashes and equivalence of a published model")
    p.add_argument("model", help="<repository>/<model name>")
    p.add_argument("--version", type=int)
    p.add_argument("--gpu", help="target GPU compute capability (e.g. 9.0) for TensorRT plans")
    p.add_argument("--tensorrt-version", help="target TensorRT version for TensorRT plans")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("serve", help="serve a repository on the embedded tritonserver until Ctrl-C")
    _add_common_repository(p)
    p.add_argument("--http-port", type=int)
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--metrics-port", type=int)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--latency-summaries", action="store_true",
                   help="publish p50/p95/p99 latency summaries (the dashboards' percentile panels need them; "
                        "they cost throughput)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("check", help="served accuracy gate: compare a running server's answers with reference.npz")
    p.add_argument("name", help="model name")
    _add_common_repository(p)
    p.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP address (default: %(default)s)")
    p.add_argument("--grpc-url", help="Triton gRPC address (default: HTTP port + 1)")
    p.add_argument("--protocol", choices=("http", "grpc", "both"), default="both")
    p.add_argument("--version", type=int)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="the main job: build, serve, check, load-test and report, then stop")
    p.add_argument("spec", nargs="?", default="examples/digits/spec.yaml")
    p.add_argument("--repository", default="runs/model_repository")
    p.add_argument("--load-seconds", type=float, default=10.0)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--keep-serving", action="store_true", help="keep the server up until Ctrl-C at the end")
    p.set_defaults(func=cmd_run)

    _register_extra_verbs(sub)
    return parser


def _register_extra_verbs(sub) -> None:
    """Verbs owned by other modules (load testing, tuning; publish, replicas, k8s) add themselves here."""
    from builder.cli.scaleout import register as register_scaleout

    register_scaleout(sub)
    try:
        from builder.cli.tuning import register as register_tuning
    except ImportError:
        return
    register_tuning(sub)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BuilderError as exc:
        _print_err(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _print_err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
