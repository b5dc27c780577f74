"""CLI verbs ``init``, ``build``, ``validate``, ``select``, ``clean``, ``releases`` and ``run`` (the main job); builder/cli/__init__.py adds them
with ``register(subparsers)``. Each forwards to one library function."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from builder.cli.arguments import finite_float
from builder.cli.output import add_signature_arguments, print_json
from builder.errors import UserInputError
from builder.progress import Reporter

DEFAULT_REPOSITORY = "model_repository"
DEFAULT_RUN_SPEC = "examples/digits/spec.yaml"  # what `make demo` runs


def cmd_init(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.scaffold import init_spec

    result = init_spec(Path(args.source), Path(args.out), sample=Path(args.sample) if args.sample else None,
                       name=args.name, force=args.force)
    for line in result.lines():
        print(line)
    return 0


def cmd_build(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.pipeline import build
    from builder.report import format_table

    variants = args.variants.split(",") if args.variants else None
    result = build(args.spec, args.repository, variants=variants, target=args.target, strict=args.strict,
                   publish_variants=args.publish_variants or None, benchmark_seconds=args.benchmark_seconds,
                   progress=reporter, signing_key=args.signing_key, register=args.register, registry=args.registry,
                   alias=args.alias, triton_release=args.triton_release)
    print()
    print(format_table(result.rows))
    for item in result.published:
        print(f"published {item['name']} version {item['version']} ({item['backend']}) -> {item['path']}")
    registered = next((r.outputs.get("registered") for r in result.results if r.stage == "register"), None) or []
    for item in registered:
        print(f"registered {item['name']} version {item['version']} as {item['uri']}"
              + (f" (alias {item['alias']})" if item.get("alias") else ""))
    return 0


def cmd_validate(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.repository.validate import validate_model

    if args.model.startswith("models:/"):  # a registry version, materialised into a local repository first
        from builder.storage.mlflow_registry import materialise
        args.model = str(materialise(args.model, args.registry))
    report = validate_model(args.model, args.version, gpu=args.gpu, tensorrt_version=args.tensorrt_version,
                            public_key=args.public_key, require_signature=args.require_signature,
                            triton_release=args.triton_release, progress=reporter,
                            max_regression=args.max_regression)
    if args.json:
        print_json(report)
        return 0 if report.ok else 1
    print(f"{report.model}: {'OK' if report.ok else 'FAIL'}")
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def cmd_releases(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.repository.triton_releases import format_releases

    print(format_releases())
    return 0


def cmd_run(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.main_job import run_main_job

    if args.spec is None and not Path(DEFAULT_RUN_SPEC).is_file():
        raise UserInputError(f"no SPEC given, and the default {DEFAULT_RUN_SPEC} is not here (it is in the project's "
                             "checkout): run from the checkout, or pass the path of a YAML model spec")
    return run_main_job(args.spec or DEFAULT_RUN_SPEC, args.repository, load_seconds=args.load_seconds, users=args.users,
                        keep_serving=args.keep_serving, progress=reporter)


def cmd_select(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.repository.reselect import default_measure, select_for_host

    report = select_for_host(args.repository, args.name, measure=default_measure(args.seconds),
                             public_key=args.public_key,
                             dry_run=args.dry_run, signing_key=args.signing_key, progress=reporter)
    for line in report.lines():
        print(line)
    return 0


def _dead_replicas_logs() -> list[Path]:
    """The temp log folders of `replicas` sessions that ended without their clean-up (SIGKILL), or that kept
    them after a failure; a live session holds its folder's lock, so its folder stays."""
    import tempfile

    from builder.scaleout.replicas import REPLICAS_PREFIX
    from builder.scratch import sweep

    return sweep(Path(tempfile.gettempdir()), REPLICAS_PREFIX)


def cmd_clean(args: argparse.Namespace, reporter: Reporter) -> int:
    from builder.scratch import clean

    repository = args.repository
    if repository is None:  # not named: the default one where there is one, else only the temp dir's work folders
        repository = DEFAULT_REPOSITORY if Path(DEFAULT_REPOSITORY).is_dir() else None
    missing = repository is not None and not os.path.lexists(repository)
    # a build killed before its first publish left work folders but never created its repository
    removed = clean(None if missing else repository)
    logs = _dead_replicas_logs()
    from builder.serving.startup import remove_dead_server_folders
    servers = remove_dead_server_folders(Path(tempfile.gettempdir()))
    for folder in removed + logs + servers:
        print(f"removed {folder}")
    said = ([f"{len(removed)} folder(s) left by dead builds"] if removed else []) + \
        ([f"{len(logs)} log folder(s) of ended replicas sessions (in {tempfile.gettempdir()})"] if logs else []) + \
        ([f"{len(servers)} folder(s) of ended tritonservers (their logs, in {tempfile.gettempdir()})"] if servers else [])
    print(f"removed {' and '.join(said)}" if said else "nothing to clean")
    if missing:
        print(f"--repository {repository}: no such folder (nothing was published there yet, or a typo), so only the "
              "temp folder's work folders were looked at")
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
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("build", parents=[common], help="export, verify, measure and publish a model spec")
    p.add_argument("spec", help="model spec YAML")
    p.add_argument("--repository", default=DEFAULT_REPOSITORY, help="model repository folder (default: %(default)s)")
    p.add_argument("--variants", help="comma-separated variants to try (default: the target's defaults)")
    p.add_argument("--target", help="cpu | gpu | python (default: the spec's deploy.target, else cpu; embedded is cpu)")
    p.add_argument("--strict", action="store_true", help="fail if any variant fails verification")
    p.add_argument("--publish-variants", action="store_true", help="also publish the others as <name>__<variant>")
    p.add_argument("--benchmark-seconds", type=finite_float,
                   help="measuring time cap per variant (default 2; 0 skips measuring and selects by preference)")
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
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("validate", parents=[common], help="re-check hashes and equivalence of a published model")
    p.add_argument("model", help="<repository>/<model name>, or models:/NAME/VERSION | models:/NAME@ALIAS (MLflow)")
    p.add_argument("--registry", help="MLflow server URL for models:/ (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--version", type=int, help="the version to check (default: the latest)")
    p.add_argument("--gpu", help="target GPU compute capability (e.g. 9.0) for TensorRT plans")
    p.add_argument("--tensorrt-version", help="target TensorRT version for TensorRT plans")
    add_signature_arguments(p)
    p.add_argument("--triton-release", help="also check that this Triton release (e.g. 26.08; `triton-builder "
                   "releases` lists them) loads each version and reproduces reference.npz with the onnxruntime / "
                   "OpenVINO it ships (installed once into ~/.cache/triton-builder/runtimes)")
    p.add_argument("--max-regression", help="fail (exit 1) where the version regresses against the previous one "
                   "beyond these limits: latency=PCT slower, accuracy=PP lost, rel_l2=X between their outputs; "
                   "e.g. latency=20,accuracy=0.5 (without it the difference is only shown)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (for CI pipelines)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("select", parents=[common],
                       help="on the serving host: re-measure a model's variants, publish the winner sized to this host")
    p.add_argument("name", help="model name in the repository (its variants: --publish-variants at build time)")
    p.add_argument("--repository", default=DEFAULT_REPOSITORY, help="model repository folder (default: %(default)s)")
    p.add_argument("--seconds", type=finite_float, default=2.0, help="measuring time cap per variant (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="measure and say what would be published; publish nothing")
    p.add_argument("--signing-key", help="elliptic-curve private key (PEM) that signs the published version "
                   "(default: $TRITON_BUILDER_SIGNING_KEY; its password only via $TRITON_BUILDER_SIGNING_KEY_PASSWORD)")
    p.add_argument("--public-key", help="public key (PEM) the repository's versions were signed with, to check them "
                   "before one is copied (default: $TRITON_BUILDER_PUBLIC_KEY, else the signing key's public half: "
                   "give the old one after a key change)")
    p.set_defaults(func=cmd_select)

    p = sub.add_parser("clean", parents=[common],
                       help="remove the work and staging folders that killed builds left, and the temp log folders of "
                            "ended replicas sessions: killed ones', and those a failed session kept for you (never a "
                            "live one's)")
    p.add_argument("--repository",
                   help=f"also its staging folders, which sit beside it (default: {DEFAULT_REPOSITORY} where "
                        "it exists)")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("releases", parents=[common],
                       help="the NGC Triton releases builds can target, with the runtimes each ships (--triton-release)")
    p.set_defaults(func=cmd_releases)

    p = sub.add_parser("run", parents=[common],
                       help="the main job: build, serve, check, load-test and report, then stop")
    p.add_argument("spec", nargs="?", help=f"model spec YAML (default: {DEFAULT_RUN_SPEC}, in the project's checkout)")
    p.add_argument("--repository", default="runs/model_repository",
                   help="where to publish (default: %(default)s, the job's scratch repository, emptied at the "
                        "start of each run; another folder is kept, and the build adds a version)")
    p.add_argument("--load-seconds", type=finite_float, default=10.0, help="load test length (default: %(default)s)")
    p.add_argument("--users", type=int, default=8, help="load test users (default: %(default)s)")
    p.add_argument("--keep-serving", action="store_true",
                   help="keep the server up at the end until Ctrl-C or SIGTERM, its normal stop (exit: the job's verdict)")
    p.set_defaults(func=cmd_run)
