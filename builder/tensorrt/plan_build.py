"""Build the TensorRT plans the builder recorded, on the GPU host that serves them (the GPU half of
the plan path; the builder's half is builder/tensorrt/plan_recipe.py).

Run by ``scripts/build-plans.sh`` (compose service ``build-plans``, in the pinned NGC Triton image,
so the plan is made by the same TensorRT as the server that loads it). That image has bash, python3,
trtexec and nvidia-smi, not the builder's packages: this module uses the standard library only
(and builder.core.errors, builder.core.files, builder.core.processes and builder.tensorrt.compatibility, which do too).

For each recipe (``<repo>/<model>/<version>/plan_recipe.json``; per model, the latest version that
has one):

1. check the ONNX file against the recipe's sha256;
2. read the GPUs with nvidia-smi: every visible GPU must have the same compute capability (Triton
   puts KIND_GPU instances on all of them, and a plan runs on one architecture only);
3. skip it when the plan model's latest version was built from the same ONNX, with the same
   precision, on the same compute capability and TensorRT version (``--force`` rebuilds);
4. run trtexec (``--onnx --saveEngine``, the precision flag, ``--minShapes/--optShapes/--maxShapes``)
   into a staging folder inside the source model's folder (same filesystem as the repository;
   Triton ignores folders whose name is not a version number); trtexec then times the plan at the
   opt shapes (``--no-measure`` skips that);
5. write beside model.plan: plan_compatibility.json (GPU name, compute capability, TensorRT version,
   profiles, precision), trtexec.log, reference.npz (copied from the ONNX version), metadata.yaml
   (JSON, which YAML readers take; its ``tensorrt`` key is the compatibility record) and the plan
   model's config.pbtxt (``platform: "tensorrt_plan"``, rendered and schema-checked by the builder);
6. publish under the repository lock (the builder's ``.triton-builder.lock``): a new plan model
   folder is renamed into place whole; an existing one gets the new version folder renamed in, then
   its config.pbtxt replaced (``os.replace``). Nothing half-made is ever visible to Triton.

Usage (normally through the script)::

    python3 -m builder.tensorrt.plan_build /models [--model NAME] [--force] [--dry-run] [--no-measure]

Exit codes: 0 every plan built or up to date (or no recipe found); 1 a plan failed to build; 2 no
usable GPU, trtexec or repository.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from builder.core.errors import BuilderError, UserInputError
from builder.core.files import sha256_file
from builder.core.processes import TimeoutExpired, run_command
from builder.tensorrt.compatibility import find_trtexec, probe_trtexec_version, query_gpus, tensorrt_version_from_log

RECIPE_FILE = "plan_recipe.json"
RECIPE_SCHEMA = 1
BUILD_PLANS = "docker compose --profile plans run --rm build-plans"
COMPAT_FILE = "plan_compatibility.json"
LOG_FILE = "trtexec.log"
PLAN_FILE = "model.plan"
LOCK_FILE = ".triton-builder.lock"  # the same lock builder.repository.layout takes
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"]}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
_REQUIRED = ("schema", "source", "plan_model", "precision", "profiles", "trtexec_shape_args", "config_pbtxt", "metadata")


class PlanBuildError(BuilderError):
    """One recipe could not be turned into a plan (exit code 1)."""


# --------------------------------------------------------------------------------------------
# recipes


def find_recipes(repository: Path, models: list[str] | None = None) -> list[Path]:
    """Per model folder, the recipe of its latest version that has one."""
    found = []
    for model in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if models and model.name not in models:
            continue
        versions = sorted((int(v.name) for v in model.iterdir() if v.is_dir() and v.name.isdigit()), reverse=True)
        recipe = next((model / str(v) / RECIPE_FILE for v in versions if (model / str(v) / RECIPE_FILE).is_file()), None)
        if recipe:
            found.append(recipe)
    return found


def load_recipe(path: Path) -> dict[str, Any]:
    try:
        recipe = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanBuildError(f"{path}: not a readable recipe ({exc}); rebuild the model with triton-builder") from None
    missing = [k for k in _REQUIRED if k not in recipe]
    if missing:
        raise PlanBuildError(f"{path}: recipe lacks {', '.join(missing)}; rebuild the model with triton-builder")
    if recipe["schema"] != RECIPE_SCHEMA:
        raise PlanBuildError(f"{path}: recipe schema {recipe['schema']} is not {RECIPE_SCHEMA}: use the build-plans "
                             "script of the triton-builder version that wrote it")
    if not NAME_PATTERN.match(str(recipe["plan_model"])):
        raise PlanBuildError(f"{path}: plan_model {recipe['plan_model']!r} is not a valid model name")
    if recipe["precision"] not in PRECISION_FLAGS:
        raise PlanBuildError(f"{path}: precision {recipe['precision']!r}: build-plans makes {', '.join(PRECISION_FLAGS)} "
                             "plans (INT8 needs calibration through the TensorRT Python API: stage tensorrt)")
    if f'name: "{recipe["plan_model"]}"' not in recipe["config_pbtxt"]:
        raise PlanBuildError(f"{path}: config_pbtxt does not name model {recipe['plan_model']}")
    return recipe


def trtexec_command(recipe: dict[str, Any], onnx_path: Path, plan_path: Path, trtexec: str = "trtexec", *,
                    device: int = 0, measure: bool = True, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The recipe as a trtexec command line."""
    command = [trtexec, f"--onnx={onnx_path}", f"--saveEngine={plan_path}", *recipe["trtexec_shape_args"],
               *PRECISION_FLAGS[recipe["precision"]], f"--device={device}"]
    if measure:
        if recipe.get("shapes", {}).get("opt"):
            command.append(f"--shapes={recipe['shapes']['opt']}")  # time the plan at the opt shapes
    else:
        command.append("--skipInference")
    return [*command, *extra]


def parse_performance(log: str) -> dict[str, Any] | None:
    """trtexec's '=== Performance summary ===': throughput (qps) and latency (ms)."""
    summary = log.split("=== Performance summary ===", 1)
    if len(summary) != 2:
        return None
    text = summary[1]
    result: dict[str, Any] = {}
    match = re.search(r"Throughput:\s*([\d.eE+-]+)\s*qps", text)
    if match:
        result["throughput_qps"] = float(match.group(1))
    match = re.search(r"(?m)^(?:\[[^\]]*\]\s*)*Latency:(.*)$", text)
    if match:
        latency = {}
        for key, pct, value in re.findall(r"(min|max|mean|median|percentile\((\d+)%\))\s*=\s*([\d.eE+-]+)\s*ms",
                                          match.group(1)):
            latency[f"p{pct}" if pct else key] = float(value)
        result["latency_ms"] = latency
    return result or None


# --------------------------------------------------------------------------------------------
# files


def _versions(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()) if folder.is_dir() else []


def _read_json_metadata(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent, or YAML written by the builder itself: not one of ours to compare


@contextlib.contextmanager
def _repository_lock(repository: Path) -> Iterator[None]:
    path = repository / LOCK_FILE
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    if created:  # the container runs as root: leave a lock the builder's own user can still open
        with contextlib.suppress(OSError):
            os.chmod(path, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# --------------------------------------------------------------------------------------------
# one plan


def build_one(repository: Path, recipe_path: Path, *, trtexec: str, gpu: dict[str, str], visible: list[dict[str, str]],
              device: int = 0, force: bool = False, measure: bool = True, dry_run: bool = False,
              extra: tuple[str, ...] = (), timeout: float | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    recipe = load_recipe(recipe_path)
    source_version_dir = recipe_path.parent
    source_model_dir = source_version_dir.parent
    source = recipe["source"]
    onnx_path = source_version_dir / source["file"]
    if not onnx_path.is_file():
        raise PlanBuildError(f"{onnx_path}: missing (the recipe names it); rebuild {source_model_dir.name}")
    if sha256_file(onnx_path) != source["sha256"]:
        raise PlanBuildError(f"{onnx_path}: sha256 differs from the recipe (file changed after the build); rebuild "
                             f"{source_model_dir.name} with triton-builder")
    plan_model = recipe["plan_model"]
    target_dir = repository / plan_model
    cc = gpu["compute_capability"]

    if dry_run:
        command = trtexec_command(recipe, onnx_path, target_dir / "<version>" / PLAN_FILE, trtexec, device=device,
                                  measure=measure, extra=extra)
        log(f"{plan_model}: would run: {' '.join(command)}")
        return {"model": plan_model, "status": "dry-run", "command": command}

    existing = _versions(target_dir)
    if existing and not force:
        previous = _read_json_metadata(target_dir / str(existing[-1]) / "metadata.yaml") or {}
        record = previous.get("tensorrt") or {}
        current_trt = probe_trtexec_version(trtexec)
        if (current_trt and (previous.get("derived_from") or {}).get("sha256") == source["sha256"]
                and record.get("compute_capability") == cc and record.get("tensorrt_version") == current_trt
                and record.get("precision") == recipe["precision"]):
            log(f"{plan_model}: up to date (version {existing[-1]}: same ONNX, compute capability {cc}, "
                f"TensorRT {current_trt}); --force rebuilds")
            return {"model": plan_model, "status": "up to date", "version": existing[-1]}

    version = existing[-1] + 1 if existing else 1
    staging = source_model_dir / f".plan-staging-{plan_model}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    stage_model = staging / plan_model
    stage_version = stage_model / str(version)
    stage_version.mkdir(parents=True)
    try:
        plan_path = stage_version / PLAN_FILE
        command = trtexec_command(recipe, onnx_path, plan_path, trtexec, device=device, measure=measure, extra=extra)
        log(f"{plan_model}: building version {version} on GPU {gpu['index']} ({gpu['name']}, compute capability {cc}): "
            f"{' '.join(command)}")
        start = time.perf_counter()
        try:
            done = run_command(command, timeout=timeout)
        except TimeoutExpired:
            raise PlanBuildError(f"{plan_model}: trtexec ran past {timeout} s") from None
        seconds = time.perf_counter() - start
        output = (done.stdout or "") + (done.stderr or "")
        (stage_version / LOG_FILE).write_text(output)
        if done.returncode != 0 or not plan_path.is_file() or plan_path.stat().st_size == 0:
            tail = "\n".join(output.strip().splitlines()[-25:])
            raise PlanBuildError(f"{plan_model}: trtexec failed (exit {done.returncode}); nothing was published. "
                                 f"Last lines of its log:\n{tail}")
        trt_version = os.environ.get("TENSORRT_VERSION") or tensorrt_version_from_log(output)
        if not trt_version:
            raise PlanBuildError(f"{plan_model}: trtexec's output names no TensorRT version; set TENSORRT_VERSION "
                                 "(e.g. 10.5.0) so the plan's compatibility record is complete")
        record = {
            "gpu_name": gpu["name"], "compute_capability": cc, "gpu_uuid": gpu.get("uuid"),
            "tensorrt_version": trt_version, "profiles": recipe["profiles"], "precision": recipe["precision"],
            "built_by": "trtexec (scripts/build-plans.sh)", "build_seconds": round(seconds, 2),
            "command": [f"--saveEngine={target_dir / str(version) / PLAN_FILE}" if c.startswith("--saveEngine=") else c
                        for c in command],  # as run, with the plan's final place
            "visible_gpus": [f"{g['index']}: {g['name']} ({g['compute_capability']})" for g in visible],
        }
        (stage_version / COMPAT_FILE).write_text(json.dumps(record, indent=2) + "\n")
        reference = source_version_dir / "reference.npz"
        if reference.is_file():
            shutil.copyfile(reference, stage_version / "reference.npz")
        meta = dict(recipe["metadata"])
        meta.update({
            "model_name": plan_model, "version": version,
            "build_date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "tensorrt": record,
            "files_sha256": {p.name: sha256_file(p) for p in sorted(stage_version.iterdir()) if p.is_file()},
            "versions": {**(meta.get("versions") or {}), "tensorrt": trt_version,
                         "python (plan build)": platform.python_version()},
        })
        performance = parse_performance(output) if measure else None
        if performance:
            batch = _opt_batch(recipe)
            performance.update({"tool": "trtexec", "at": "opt shapes " + (recipe.get("shapes", {}).get("opt") or
                                                                         "(static model)")})
            if batch and "throughput_qps" in performance:
                performance["inferences_per_s"] = performance["throughput_qps"] * batch
            meta["benchmark"] = performance
        (stage_version / "metadata.yaml").write_text(json.dumps(meta, indent=2) + "\n")
        (stage_model / "config.pbtxt").write_text(recipe["config_pbtxt"])
        path = _publish(repository, stage_model, target_dir, version)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"{plan_model}: version {version} published -> {path} (TensorRT {trt_version}, compute capability {cc}, "
        f"{recipe['precision']})")
    return {"model": plan_model, "status": "built", "version": version, "path": str(path), "tensorrt": record}


def _opt_batch(recipe: dict[str, Any]) -> int:
    """The batch size of the opt shapes (0 without a batch dimension)."""
    spec = (recipe.get("metadata") or {}).get("spec") or {}
    if not spec.get("max_batch_size"):
        return 0
    first = next(iter(recipe["profiles"].values()), {})
    return int(first.get("opt", [0])[0])


def _publish(repository: Path, stage_model: Path, target_dir: Path, version: int) -> Path:
    with _repository_lock(repository):
        if not target_dir.exists():
            os.rename(stage_model, target_dir)  # the whole model appears at once: config + version
            return target_dir / str(version)
        if version in _versions(target_dir):
            raise PlanBuildError(f"{target_dir.name}: version {version} appeared while this ran; run build-plans again")
        os.rename(stage_model / str(version), target_dir / str(version))  # the version appears complete
        os.replace(stage_model / "config.pbtxt", target_dir / "config.pbtxt")
        return target_dir / str(version)


# --------------------------------------------------------------------------------------------
# the command


def choose_gpu(gpus: list[dict[str, str]], device: int) -> dict[str, str]:
    kinds = sorted({g["compute_capability"] for g in gpus})
    if len(kinds) > 1:
        listing = ", ".join(f"{g['index']}: {g['name']} ({g['compute_capability']})" for g in gpus)
        raise UserInputError(f"the visible GPUs have different compute capabilities ({listing}); a plan runs on one "
                             "architecture only: make one kind visible (NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES) "
                             "to the build and to Triton")
    if not 0 <= device < len(gpus):
        raise UserInputError(f"--device {device}: this host shows GPUs 0..{len(gpus) - 1}")
    return gpus[device]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build-plans", description="Build the TensorRT plans recorded by "
                                     "triton-builder (plan_recipe.json) on this GPU, with this TensorRT.")
    parser.add_argument("repository", nargs="?", default=os.environ.get("MODEL_REPOSITORY", "model_repository"),
                        help="model repository (default: $MODEL_REPOSITORY or ./model_repository)")
    parser.add_argument("--model", action="append", help="only the recipes of this source model (repeatable)")
    parser.add_argument("--force", action="store_true", help="rebuild plans that are up to date")
    parser.add_argument("--dry-run", action="store_true", help="print the trtexec command lines, write nothing")
    parser.add_argument("--no-measure", action="store_true", help="do not time the plans (trtexec --skipInference)")
    parser.add_argument("--device", type=int, default=int(os.environ.get("PLAN_DEVICE", "0")),
                        help="GPU index to build on (default 0)")
    parser.add_argument("--trtexec", default=None, help="trtexec binary (default: $TRTEXEC, PATH, "
                                                        "/usr/src/tensorrt/bin/trtexec)")
    parser.add_argument("--nvidia-smi", default=None, help="nvidia-smi binary (default: PATH)")
    parser.add_argument("--trtexec-arg", action="append", default=[], metavar="ARG",
                        help="extra trtexec argument, e.g. --trtexec-arg=--memPoolSize=workspace:4096 (repeatable)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed per trtexec run")
    args = parser.parse_args(argv)

    repository = Path(args.repository).resolve()
    try:
        if not repository.is_dir():
            raise UserInputError(f"{args.repository}: no such model repository (set MODEL_REPOSITORY or pass it)")
        recipes = find_recipes(repository, args.model)
        if not recipes:
            print(f"build-plans: no {RECIPE_FILE} in {repository}: nothing to build (recipes are written by "
                  "`triton-builder build --target gpu` where no GPU/TensorRT is available)")
            return 0
        trtexec = args.trtexec or find_trtexec()
        if not trtexec or not (os.access(trtexec, os.X_OK) or shutil.which(trtexec)):
            raise UserInputError("trtexec not found ($TRTEXEC, PATH, /usr/src/tensorrt/bin/trtexec): run this in the "
                                 f"Triton image that serves the plans: {BUILD_PLANS}")
        gpus, why = query_gpus(args.nvidia_smi)
        if not gpus:
            raise UserInputError(f"no GPU: {why}; plans must be built on the GPU that serves them ({BUILD_PLANS} "
                                 "on the GPU host)")
        gpu = choose_gpu(gpus, args.device)
    except BuilderError as exc:
        print(f"build-plans: error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for recipe_path in recipes:
        try:
            build_one(repository, recipe_path, trtexec=trtexec, gpu=gpu, visible=gpus, device=args.device,
                      force=args.force, measure=not args.no_measure, dry_run=args.dry_run,
                      extra=tuple(args.trtexec_arg), timeout=args.timeout)
        except BuilderError as exc:
            failed += 1
            print(f"build-plans: {recipe_path.relative_to(repository)}: {exc}", file=sys.stderr)
    if failed:
        print(f"build-plans: {failed} of {len(recipes)} plan(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
