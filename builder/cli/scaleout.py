"""CLI verbs ``publish``, ``replicas`` and ``k8s``; builder/cli/__init__.py adds them with ``register(subparsers)``.

Each verb forwards to one library function:

- ``publish``  -> ``builder.storage.s3.publish_repository``
- ``replicas`` -> ``builder.scaleout.replicas.run_replicas``
- ``k8s``      -> ``builder.scaleout.k8s.render_manifests`` (then ``validate_manifests`` unless --no-validate)

Exit codes: 0 ok; 1 invalid manifests; 2 bad arguments or an unreachable store/server.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from builder.cli.arguments import (add_model, add_model_version, add_output, add_repository, deprecated_alias, duration,
                                   finite_float, model_folder_form)
from builder.cli.output import emit
from builder.cli.serving import port_number, quiet_announce, refuse_shared_ports
from builder.core.errors import UserInputError
from builder.core.progress import Reporter
from builder.repository.triton_releases import DEFAULT_RELEASE, triton_release
from builder.scaleout.k8s import render_manifests, require_validator, validate_manifests
from builder.scaleout.replicas import run_replicas
from builder.storage.mlflow_registry import register_version
from builder.storage.s3 import publish_repository
from builder.storage.s3_location import parse_s3_url


def cmd_publish(args: argparse.Namespace, reporter: Reporter) -> int:
    models = [*args.name, *(getattr(args, "model", None) or [])]
    results = publish_repository(args.repository, args.to, models=models or None, version=args.model_version,
                                 progress=reporter)
    emit(args, {"published": results}, [item.line() for item in results], ok=True)
    return 0


def cmd_register(args: argparse.Namespace, reporter: Reporter) -> int:
    name, repository = model_folder_form(args.name, args.repository, "register")
    if "://" in repository:
        raise UserInputError(f"--repository {repository}: register reads a local folder (the version's files "
                             "become the registry's artifacts); pass the local repository")
    folder = Path(repository) / name
    done = register_version(args.registry, folder, version=args.model_version, alias=args.alias)
    verb = "already registered" if done.get("already") else "registered"
    lines = [f"{verb} {folder} as {done['uri']} (run {done['run_id']}; source {done['source']})"]
    if done.get("note"):  # which config was attached, or that nothing new was sent
        lines.append(f"note: {done['note']}")
    emit(args, done, lines, ok=True)
    return 0


def cmd_replicas(args: argparse.Namespace, reporter: Reporter) -> int:
    refuse_shared_ports({"--http-port": args.http_port, "--grpc-port": args.grpc_port})
    return run_replicas(args.repository, args.replicas, http_port=args.http_port, grpc_port=args.grpc_port,
                        prometheus=args.prometheus, watch_seconds=args.watch_seconds,
                        announce=quiet_announce(reporter))


def _image(args: argparse.Namespace) -> str:
    """--image as given, else the image of --triton-release (default: the newest release in the table)."""

    if args.image and args.triton_release:
        raise UserInputError("--image and --triton-release both name the Triton image: give one of them")
    return args.image or triton_release(args.triton_release or DEFAULT_RELEASE).image


def cmd_k8s(args: argparse.Namespace, reporter: Reporter) -> int:
    if "://" not in args.repository:
        raise UserInputError(f"--repository {args.repository}: the pods read their models from object storage: pass "
                             "--repository s3://BUCKET/PREFIX (`triton-builder publish --to s3://...` uploads a "
                             "local repository there)")

    parse_s3_url(args.repository, "--repository")  # its errors name this verb's option
    if args.poll_seconds != int(args.poll_seconds) or args.poll_seconds < 1:
        raise UserInputError(f"--poll-seconds {args.poll_seconds:g}: Triton polls in whole seconds: give 1 or more")
    model = args.name if args.name is not None else getattr(args, "model", None)
    if not args.no_validate:
        require_validator()  # before anything is written
    result = render_manifests(args.repository, args.out, replicas=args.replicas, min_replicas=args.min_replicas,
                              max_replicas=args.max_replicas, metric=args.metric, target=args.hpa_target,
                              namespace=args.namespace, image=_image(args), secret_name=args.secret, region=args.region,
                              gpus=args.gpus, model=model, locust_workers=args.locust_workers,
                              model_control=args.model_control, poll_seconds=int(args.poll_seconds),
                              release=args.release, locust_image=args.locust_image)
    lines = result.lines()
    problems = [] if args.no_validate else validate_manifests(args.out)
    if problems:
        lines += ["INVALID:", *(f"- {problem}" for problem in problems)]
    elif not args.no_validate:
        lines.append("validated offline: core objects against the Kubernetes schemas (kubernetes-validate, strict), "
                     "the PodMonitor by structure, cross-references, and `kubectl kustomize` where kubectl is "
                     "installed")
    emit(args, {**vars(result), "validated": not args.no_validate, "problems": problems}, lines, ok=not problems)
    return 1 if problems else 0


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("register", parents=[common],
                       help="register a published version in MLflow's model registry (artifacts, metrics, tags)")
    add_model(p, "local model repository folder",
              help="model name in --repository (the old REPOSITORY/NAME still works, with a note)")
    p.add_argument("--registry", default=os.environ.get("MLFLOW_TRACKING_URI"),
                   help="MLflow server URL (default: $MLFLOW_TRACKING_URI)")
    add_model_version(p, "the model version to register (default: the latest)")
    p.add_argument("--alias", help="also point this registry alias (e.g. prod) at it")
    add_output(p)
    p.set_defaults(func=cmd_register)

    p = sub.add_parser("publish", parents=[common], help="upload a local repository's versions to object storage (s3://), "
                                       "each visible only once complete")
    add_model(p, "local model repository folder", nargs="*", help="only these models (default: every model)")
    p.add_argument("--to", required=True,
                   help="s3://BUCKET/PREFIX (AWS) or s3://HOST:PORT/BUCKET/PREFIX (S3-compatible); credentials "
                        "from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
    deprecated_alias(p, "--model", "a positional NAME", dest="model", append=True, metavar="NAME")
    add_model_version(p, "only this model version (default: every local version)")
    add_output(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("replicas", parents=[common], help="N embedded Triton replicas on one repository behind nginx, with "
                                        "Prometheus and gated rolling updates, until Ctrl-C")
    add_repository(p, "model repository folder or s3:// URL")
    p.add_argument("--replicas", type=int, default=2, help="Triton replicas behind the balancer (default: %(default)s)")
    p.add_argument("--http-port", type=port_number, help="the balancer's HTTP port (default: a free one)")
    p.add_argument("--grpc-port", type=port_number, help="the balancer's gRPC port (default: a free one)")
    p.add_argument("--watch-seconds", type=duration, default=10.0,
                   help="how often to look for newly published versions to roll out, e.g. 10, 1m (default: "
                        "%(default)s)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prometheus", dest="prometheus", action="store_const", const=True, default=None,
                       help="start Prometheus (error if not installed; default: when installed)")
    group.add_argument("--no-prometheus", dest="prometheus", action="store_const", const=False,
                       help="do not start the local Prometheus")
    p.set_defaults(func=cmd_replicas)

    p = sub.add_parser("k8s", parents=[common], help="render (and validate offline) Kubernetes manifests: Triton on an s3:// "
                                   "repository, HPA on Triton metrics, monitoring, Locust")
    add_model(p, "the s3:// model repository the pods serve", nargs="?",
              help="the model the Locust deployments load-test (without it they get 0 replicas)")
    deprecated_alias(p, "--repository-url", "--repository", dest="repository", metavar="URL")
    p.add_argument("--out", required=True, help="folder to write (a kustomize base lands in OUT/base)")
    p.add_argument("--replicas", type=int, default=2, help="initial Triton replicas (default: %(default)s)")
    p.add_argument("--min-replicas", "--min", type=int, default=1, help="HPA minimum (default: %(default)s)")
    p.add_argument("--max-replicas", "--max", type=int, default=8, help="HPA maximum (default: %(default)s)")
    p.add_argument("--metric", choices=("queue_compute_ratio", "pending_requests"), default="queue_compute_ratio",
                   help="what the HPA scales on (default: %(default)s)")
    p.add_argument("--hpa-target", type=finite_float,
                   help="the HPA's per-pod target of --metric (default: 1 for the ratio, 8 pending)")
    deprecated_alias(p, "--target", "--hpa-target", dest="hpa_target", type=finite_float, metavar="VALUE")
    p.add_argument("--namespace", help="namespace set in kustomization.yaml (default: none)")
    p.add_argument("--image", help="Triton image (default: the --triton-release's NGC image)")
    p.add_argument("--triton-release", help="NGC Triton release whose stock image the pods run (default: the newest in "
                   "`triton-builder releases`); build the repository for the same release")
    p.add_argument("--secret", default="triton-s3-credentials",
                   help="name of the existing Secret holding AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
    p.add_argument("--region", default="us-east-1", help="AWS_DEFAULT_REGION for the pods")
    p.add_argument("--gpus", type=int, default=1, help="nvidia.com/gpu per pod (0: none)")
    deprecated_alias(p, "--model", "a positional NAME", dest="model", metavar="NAME")
    p.add_argument("--locust-workers", type=int, default=2, help="Locust worker pods (default: %(default)s)")
    p.add_argument("--model-control", choices=("poll", "explicit"), default="poll",
                   help="how Triton picks up new versions from the bucket (default: %(default)s)")
    p.add_argument("--poll-seconds", type=duration, default=30,
                   help="Triton's --repository-poll-secs in poll mode, whole seconds, e.g. 30, 2m (default: "
                        "%(default)s)")
    p.add_argument("--release", help="kube-prometheus-stack's Helm release: the `release` label its Prometheus "
                                     "selects PodMonitors and PrometheusRules by (default: no label)")
    p.add_argument("--locust-image", default="triton-builder-locust:2.47.0",
                   help="Locust image with its packages baked in, built from docker/locust/Dockerfile and pushed "
                        "where the cluster pulls (default: %(default)s)")
    p.add_argument("--no-validate", action="store_true", help="skip the offline validation")
    add_output(p)
    p.set_defaults(func=cmd_k8s)
