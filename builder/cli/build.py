"""CLI verbs ``init``, ``build``, ``validate``, ``select``, ``rollback``, ``clean``, ``releases`` and ``run`` (the main job); builder/cli/__init__.py adds them
with ``register(subparsers)``. Each forwards to one library function."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from builder.api import DEFAULT_REPOSITORY
from builder.cli.arguments import (add_model, add_model_version, add_output, add_repository, duration,
                                   model_folder_form, note)
from builder.cli.output import add_signature_arguments, emit
from builder.core.errors import UserInputError
from builder.core.progress import Reporter
from builder.core.scratch import sweep
from builder.main_job import run_main_job
from builder.pipeline import build
from builder.report.build_report import format_table
from builder.repository import triton_releases as t
from builder.repository.layout import clean
from builder.repository.reselect import default_measure, select_for_host
from builder.repository.rollback import rollback_model
from builder.repository.validate import validate_model
from builder.scaffold.init import init_spec
from builder.scaleout.replicas import REPLICAS_PREFIX
from builder.serving.running import served_after_rollback
from builder.serving.startup import remove_dead_server_folders
from builder.storage.mlflow_registry import materialise
from builder.storage.s3_location import is_s3_url
from builder.storage.s3_rollback import rollback_s3

DEFAULT_RUN_SPEC = "examples/digits/spec.yaml"  # what `make demo` runs


def cmd_init(args: argparse.Namespace, reporter: Reporter) -> int:
    result = init_spec(Path(args.source), Path(args.out), sample=Path(args.sample) if args.sample else None,
                       name=args.name, force=args.force)
    emit(args, result, result.lines())
    return 0


def cmd_build(args: argparse.Namespace, reporter: Reporter) -> int:
    variants = args.variants.split(",") if args.variants else None
    result = build(args.spec, args.repository, variants=variants, target=args.target, strict=args.strict,
                   publish_variants=args.publish_variants or None, benchmark_seconds=args.benchmark_seconds,
                   progress=reporter, signing_key=args.signing_key, register=args.register, registry=args.registry,
                   alias=args.alias, triton_release=args.triton_release)
    registered = next((r.outputs.get("registered") for r in result.results if r.stage == "register"), None) or []
    lines = ["", format_table(result.rows)]
    lines += [f"published {item['name']} version {item['version']} ({item['backend']}) -> {item['path']}"
              for item in result.published]
    lines += [f"registered {item['name']} version {item['version']} as {item['uri']}"
              + (f" (alias {item['alias']})" if item.get("alias") else "") for item in registered]
    emit(args, {"published": result.published, "registered": registered, "rows": result.rows}, lines, ok=True)
    return 0


def cmd_validate(args: argparse.Namespace, reporter: Reporter) -> int:
    if args.name.startswith("models:/"):  # a registry version, materialised into a local repository first
        folder = materialise(args.name, args.registry)
    else:
        name, repository = model_folder_form(args.name, args.repository, "validate")
        if "://" in repository:
            raise UserInputError(f"--repository {repository}: validate reads a local folder; validate before "
                                 "`publish`, or on a local copy")
        folder = Path(repository) / name
    report = validate_model(folder, args.model_version, gpu=args.gpu, tensorrt_version=args.tensorrt_version,
                            public_key=args.public_key, require_signature=args.require_signature,
                            triton_release=args.triton_release, progress=reporter,
                            max_regression=args.max_regression)
    emit(args, report, [f"{report.model}: {'OK' if report.ok else 'FAIL'}", *report.lines()])
    return 0 if report.ok else 1


def cmd_releases(args: argparse.Namespace, reporter: Reporter) -> int:
    emit(args, {"releases": t.RELEASES, "default": t.DEFAULT_RELEASE, "embedded": t.EMBEDDED_RELEASE},
         [t.format_releases()], ok=True)
    return 0


def cmd_run(args: argparse.Namespace, reporter: Reporter) -> int:
    if args.spec is None and not Path(DEFAULT_RUN_SPEC).is_file():
        raise UserInputError(f"no SPEC given, and the default {DEFAULT_RUN_SPEC} is not here (it is in the project's "
                             "checkout): run from the checkout, or pass the path of a YAML model spec")
    return run_main_job(args.spec or DEFAULT_RUN_SPEC, args.repository, load_seconds=args.load_seconds, users=args.users,
                        keep_serving=args.keep_serving, progress=reporter)


def cmd_select(args: argparse.Namespace, reporter: Reporter) -> int:
    if not args.seconds > 0:
        raise UserInputError(f"--seconds {args.seconds:g}: give the measuring time per variant, more than 0")
    if args.write is None:  # neither --write nor --dry-run: the old default published
        note("select no longer publishes by default: this is a dry run; pass --write to publish the winner "
             "(--dry-run, now the default, is still accepted)")
    report = select_for_host(args.repository, args.name, measure=default_measure(args.seconds),
                             public_key=args.public_key, dry_run=not args.write, signing_key=args.signing_key,
                             progress=reporter)
    emit(args, report, report.lines(), ok=True)
    return 0


def cmd_rollback(args: argparse.Namespace, reporter: Reporter) -> int:
    if is_s3_url(args.repository):  # the library directly (builder.api.rollback's errors name its parameters)
        if args.signing_key or args.public_key:
            raise UserInputError("--signing-key/--public-key: signing is not supported on an s3:// repository; "
                                 "roll back the local repository, then `publish --to` it")
        report = rollback_s3(args.repository, args.name, args.to, progress=reporter)
    else:
        report = rollback_model(args.repository, args.name, args.to, signing_key=args.signing_key,
                                public_key=args.public_key, progress=reporter)
        report.served = served_after_rollback(Path(args.repository), args.name, report.to_version, progress=reporter)
    emit(args, report, report.lines())
    return 0


def _dead_replicas_logs() -> list[Path]:
    """The temp log folders of `replicas` sessions that ended without their clean-up (SIGKILL), or that kept
    them after a failure; a live session holds its folder's lock, so its folder stays."""
    import tempfile


    return sweep(Path(tempfile.gettempdir()), REPLICAS_PREFIX)


def cmd_clean(args: argparse.Namespace, reporter: Reporter) -> int:
    repository = args.repository
    if repository == DEFAULT_REPOSITORY and not Path(repository).is_dir():
        repository = None  # the default, not here: only the temp dir's work folders
    missing = repository is not None and not os.path.lexists(repository)
    # a build killed before its first publish left work folders but never created its repository
    removed = clean(None if missing else repository)
    logs = _dead_replicas_logs()
    servers = remove_dead_server_folders(Path(tempfile.gettempdir()))
    lines = [f"removed {folder}" for folder in removed + logs + servers]
    said = ([f"{len(removed)} folder(s) left by dead builds"] if removed else []) + \
        ([f"{len(logs)} log folder(s) of ended replicas sessions (in {tempfile.gettempdir()})"] if logs else []) + \
        ([f"{len(servers)} folder(s) of ended tritonservers (their logs, in {tempfile.gettempdir()})"] if servers else [])
    lines.append(f"removed {' and '.join(said)}" if said else "nothing to clean")
    if missing:
        lines.append(f"--repository {repository}: no such folder (nothing was published there yet, or a typo), so "
                     "only the temp folder's work folders were looked at")
    emit(args, {"removed": removed, "replicas_logs": logs, "server_folders": servers,
                "repository_missing": missing}, lines, ok=True)
    return 0


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("init", parents=[common],
                       help="draft a commented spec.yaml from a model: values it guessed are marked '# review:'")
    p.add_argument("source", help="model.onnx, a TorchScript file (model.pt), model.py:factory, or a Hugging Face "
                   "folder (config.json + tokenizer files)")
    p.add_argument("--out", default="spec.yaml", help="the spec file to write (default: %(default)s)")
    p.add_argument("--sample", help="an .npz keyed by input name, samples first (never unpickled): TorchScript and "
                   "model.py sources read the inputs' dtypes and shapes from it and run once on it for the outputs")
    p.add_argument("--name", help="the Triton model name (default: from the file or folder name)")
    p.add_argument("--force", action="store_true", help="overwrite --out (and hf_model.py) if they exist")
    add_output(p)
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("build", parents=[common], help="export, verify, measure and publish a model spec")
    p.add_argument("spec", help="model spec YAML")
    add_repository(p, "model repository folder to publish into")
    p.add_argument("--variants", help="comma-separated variants to try (default: the target's defaults)")
    p.add_argument("--target", help="cpu | gpu | python (default: the spec's deploy.target, else cpu; embedded is cpu)")
    p.add_argument("--strict", action="store_true", help="fail if any variant fails verification")
    p.add_argument("--publish-variants", action="store_true", help="also publish the others as <name>__<variant>")
    p.add_argument("--benchmark-seconds", type=duration,
                   help="measuring time cap per variant, e.g. 2, 30s, 1m (default 2; 0 skips measuring and "
                        "selects by preference)")
    p.add_argument("--signing-key", help="elliptic-curve private key (PEM) that signs each published version "
                   "(default: $TRITON_BUILDER_SIGNING_KEY; its password only via $TRITON_BUILDER_SIGNING_KEY_PASSWORD)")
    p.add_argument("--triton-release", help="the NGC Triton release the versions must load on: ONNX variants beyond "
                   "its onnxruntime's IR version / opset, OpenVINO IRs beyond its OpenVINO's opsets and TorchScript "
                   "newer than its libtorch are rejected; recorded in each version's metadata (default: the newest "
                   "in `triton-builder releases`, docker-compose.yml's)")
    p.add_argument("--register", action="store_true",
                   help="also register each published version in MLflow's model registry (artifacts, metrics, tags)")
    p.add_argument("--registry", help="MLflow server URL for --register (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--alias", help="with --register: set this alias (e.g. prod) on the model's registered version")
    add_output(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("validate", parents=[common], help="re-check hashes and equivalence of a published model")
    add_model(p, "model repository folder", help="model name in --repository, or models:/NAME/VERSION | "
              "models:/NAME@ALIAS (MLflow); the old REPOSITORY/NAME still works, with a note")
    p.add_argument("--registry", help="MLflow server URL for models:/ (default: $MLFLOW_TRACKING_URI)")
    add_model_version(p, "the model version to check (default: all)")
    p.add_argument("--gpu", help="target GPU compute capability (e.g. 9.0) for TensorRT plans")
    p.add_argument("--tensorrt-version", help="target TensorRT version for TensorRT plans")
    add_signature_arguments(p)
    p.add_argument("--triton-release", help="also check that this Triton release (e.g. 26.08; `triton-builder "
                   "releases` lists them) loads each version and reproduces reference.npz with the onnxruntime / "
                   "OpenVINO it ships (installed once into ~/.cache/triton-builder/runtimes)")
    p.add_argument("--max-regression", help="fail (exit 1) where the version regresses against the previous one "
                   "beyond these limits: latency=PCT slower, accuracy=PP lost, rel_l2=X between their outputs; "
                   "e.g. latency=20,accuracy=0.5 (without it the difference is only shown)")
    add_output(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("select", parents=[common],
                       help="on the serving host: re-measure a model's variants, publish the winner sized to this host")
    add_model(p, "model repository folder", help="model name in --repository (its variants: --publish-variants at "
              "build time)")
    p.add_argument("--seconds", type=duration, default=2.0,
                   help="measuring time cap per variant, e.g. 2, 30s (default: %(default)s)")
    writes = p.add_mutually_exclusive_group()
    writes.add_argument("--write", action="store_true", default=None,
                        help="publish the winner as a new version (without it: a dry run that says what it would "
                             "publish)")
    writes.add_argument("--dry-run", dest="write", action="store_false", default=None,
                        help="measure and say what would be published; publish nothing (the default)")
    p.add_argument("--signing-key", help="elliptic-curve private key (PEM) that signs the published version "
                   "(default: $TRITON_BUILDER_SIGNING_KEY; its password only via $TRITON_BUILDER_SIGNING_KEY_PASSWORD)")
    p.add_argument("--public-key", help="public key (PEM) the repository's versions were signed with, to check them "
                   "before one is copied (default: $TRITON_BUILDER_PUBLIC_KEY, else the signing key's public half: "
                   "give the old one after a key change)")
    add_output(p)
    p.set_defaults(func=cmd_select)

    p = sub.add_parser("rollback", parents=[common],
                       help="serve an earlier verified version again: one atomic config.pbtxt change (version_policy "
                            "specific [N]), recorded in <model>/rollout.yaml; refused if that version fails validate")
    add_model(p, help="model name in --repository (a monitored model: its model step is rolled back)")
    p.add_argument("--to", type=int, metavar="N", help="the version to serve (default: the one before the served one)")
    p.add_argument("--signing-key", help="elliptic-curve private key (PEM) that signs the rollout record: required "
                   "where the model is signed (default: $TRITON_BUILDER_SIGNING_KEY)")
    p.add_argument("--public-key", help="public key (PEM) to check the version's signature with first (default: "
                   "$TRITON_BUILDER_PUBLIC_KEY, else the signing key's public half)")
    add_output(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("clean", parents=[common],
                       help="remove the work and staging folders that killed builds left, and the temp log folders of "
                            "ended replicas sessions: killed ones', and those a failed session kept for you (never a "
                            "live one's)")
    add_repository(p, "also this repository's staging folders, which sit beside it (the default only where it "
                      "exists)")
    add_output(p)
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("releases", parents=[common],
                       help="the NGC Triton releases builds can target, with the runtimes each ships (--triton-release)")
    add_output(p)
    p.set_defaults(func=cmd_releases)

    p = sub.add_parser("run", parents=[common],
                       help="the main job: build, serve, check, load-test and report, then stop")
    p.add_argument("spec", nargs="?", help=f"model spec YAML (default: {DEFAULT_RUN_SPEC}, in the project's checkout)")
    p.add_argument("--repository", default="runs/model_repository",
                   help="where to publish (default: %(default)s, the job's scratch repository, emptied at the "
                        "start of each run; another folder is kept, and the build adds a version)")
    p.add_argument("--load-seconds", type=duration, default=10.0,
                   help="load test length, e.g. 10, 30s, 2m (default: %(default)s)")
    p.add_argument("--users", type=int, default=8, help="load test users (default: %(default)s)")
    p.add_argument("--keep-serving", action="store_true",
                   help="keep the server up at the end until Ctrl-C or SIGTERM, its normal stop (exit: the job's verdict)")
    p.set_defaults(func=cmd_run)
