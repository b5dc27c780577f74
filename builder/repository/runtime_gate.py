"""The runtime-compatibility gate: can the Triton release we deploy to load this version, and does it
still answer the same? ``validate --triton-release R``.

Each published file is replayed under R's own runtime (builder/repository/triton_releases.py), in a side
virtualenv holding exactly that package from PyPI (``~/.cache/triton-builder/runtimes/<package>-X``, or under
$TRITON_BUILDER_CACHE; created on first use with ``python -m venv`` + pip, then reused), and compared with the
recorded outputs at the build's tolerance. Every refusal names the fix.

- ONNX (onnxruntime backend, or the python backend's onnxruntime): the model's IR version and default-domain
  opset against what R's onnxruntime loads, then a replay with that onnxruntime.
- OpenVINO IR (openvino backend): its layers' opsets against what R's OpenVINO reads (``ir_failures``), then a
  replay with that OpenVINO.
- TorchScript (pytorch_libtorch): refused when saved by a torch newer than R's libtorch; otherwise replayed with
  this environment's torch, the closest release that installs here (NVIDIA's libtorch builds are not on PyPI;
  the note says which torch ran it).
- TensorRT plans: not replayed (the line names R's TensorRT where it is known).

Usage::

    failures, notes = runtime_gate(Path("model_repository/digits_cnn/3"), meta, "26.07", progress=print)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any, Callable

from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures, worst_metric
from builder.core.errors import BuilderError
from builder.core.processes import run_command
from builder.core.side_env import cache_root, cached_virtualenv
from builder.model.runtime import open_runner
from builder.optimise.openvino_tools import ir_opsets
from builder.repository.metadata import numeric_output_names, read_metadata, read_reference
from builder.repository.triton_releases import (OPENVINO_MAX_OPSET, Runtime, TritonRelease, libtorch_failure,
                                                onnx_runtime_for, triton_release)

INSTALL_TIMEOUT_S = 600
REPLAY_TIMEOUT_S = 600
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def runtimes_root() -> Path:
    return cache_root() / "runtimes"


def side_python(version: str, progress: Callable[[str], object] = lambda m: None,
                package: str = "onnxruntime") -> Path:
    """The interpreter of a cached virtualenv holding ``package``==``version`` (onnxruntime, or openvino) and
    numpy; built on first use (builder/core/side_env.py: a killed install leaves no half env)."""
    home = runtimes_root() / f"{package}-{version}"
    if not (home / "ready").is_file():
        progress(f"installing {package} {version} into {home} (once; reused afterwards) ...")
    try:
        return cached_virtualenv(home, [f"{package}=={version}", "numpy"], INSTALL_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001
        raise BuilderError(f"could not install {package} {version} into {home}: {err}; check that "
                           "PyPI is reachable (pip install works), or run validate without --triton-release") from None


def limit_failures(model_path: Path, release: Runtime, given: bool = False) -> list[str]:
    """The IR version and default-domain opset beyond what the release's onnxruntime loads, each with its
    fix (hard limits: the build's verify stage rejects such a variant before anything is published).
    ``given``: the file is the user's ONNX source, which the spec's onnx.opset (export from PyTorch
    only) cannot change: the fix is to convert the file, or export it again."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    out = []
    ort = release.label
    convert = (f"convert the file (model = onnx.version_converter.convert_version(onnx.load(path), "
               f"{release.max_opset}); model.ir_version = {release.max_ir_version}; onnx.save(model, path)) or "
               f"export it again with opset {release.max_opset} or lower")
    if model.ir_version > release.max_ir_version:
        fix = convert if given else (f"export with IR version <= {release.max_ir_version} (the spec's onnx.opset at "
                                     f"most {release.max_opset}, or onnx.version_converter and model.ir_version = "
                                     f"{release.max_ir_version})")
        out.append(f"{model_path.name}: ONNX IR version {model.ir_version} > {release.max_ir_version}, the newest "
                   f"{ort} loads: {fix}")
    opset = next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)
    if opset > release.max_opset:
        fix = (("the same conversion" if out else convert) if given else
               f"set onnx.opset: {release.max_opset} (or lower) in the spec and build again")
        out.append(f"{model_path.name}: opset {opset} > {release.max_opset}, the newest {ort} implements: {fix}")
    return out


def contrib_ops(model_path: Path) -> list[str]:
    """The non-standard operators (``domain::op``, e.g. onnxruntime's com.microsoft::FusedConv from an
    optimisation pass) in the model. Not refused on sight: the release's real onnxruntime decides in the
    replay (24.10's 1.19.2 and 1.20.1 load FusedConv and match), and a load error names the fix."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain not in STANDARD_DOMAINS})


def _explain_load_error(text: str, release: Runtime) -> str:
    found = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", text)
    if found:
        return (f"IR version {found.group(1)} is newer than onnxruntime {release.onnxruntime} loads (max "
                f"{found.group(2)}): export with IR version <= {found.group(2)}")
    if "opset" in text.lower():
        return f"{text.strip()[:300]}: set onnx.opset: {release.max_opset} (or lower) in the spec and build again"
    if "Could not find an implementation" in text or "not a registered function/op" in text:
        return f"{text.strip()[:300]}: an operator this release lacks (contrib op?): publish the plain 'onnx' variant"
    return text.strip()[:400]


def runtime_gate(folder: Path, meta: dict[str, Any], release_name: str,
                 progress: Callable[[str], object] = lambda m: None) -> tuple[list[str], list[str]]:
    """(failures, notes) for the version in ``folder`` against Triton ``release_name``."""

    release = triton_release(release_name)
    artifact = meta["artifact"]
    if artifact["format"] == "torchscript":
        return torchscript_gate(folder, meta, release)
    if artifact["format"] == "plan":
        if not release.tensorrt:
            return [], [f"Triton {release.release}'s TensorRT version is not in triton-builder's table: check the plan "
                        "with --tensorrt-version X --gpu X.Y (the release notes name X)"]
        return [], [f"Triton {release.release} ships TensorRT {release.tensorrt}: check the plan with "
                    f"--tensorrt-version {release.tensorrt} --gpu X.Y"]
    if artifact["format"] == "openvino":
        return openvino_gate(folder, meta, release, progress)
    model = folder / artifact["file"]
    runtime = onnx_runtime_for(release, artifact.get("backend") or "onnxruntime")
    failures = limit_failures(model, runtime)
    if failures:
        return failures, []
    # read first: a broken reference.npz is named as such, not as a side environment's failure
    _, reference = read_reference(folder / "reference.npz")
    python = side_python(runtime.onnxruntime, progress)
    load_error, got = _replay(python, "ort_replay.py", model, folder, meta, f"onnxruntime {runtime.onnxruntime}")
    if load_error:
        return [f"{artifact['file']}: {runtime.label} refuses it: " + _explain_load_error(load_error, runtime)], []
    failures, worst = _compared(reference, meta, got, runtime.label)
    failures = [f"{line}: rebuild with the release's onnxruntime in mind (opset, passes)" for line in failures]
    notes = [f"Triton {release.release}: loads on {runtime.label}, {len(got)} reference cases, worst rel L2 {worst:.1e}"]
    ops = contrib_ops(model)
    if ops and not failures:
        notes.append(f"  its onnxruntime contrib ops ({', '.join(ops)}) load and match on that release; they keep "
                     "the file to onnxruntime (the onnxruntime or python backend)")
    return failures, notes


def _replay(python: Path, script_name: str, model: Path, folder: Path, meta: dict[str, Any],
            runtime: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(load error or None, the outputs per reference case) of ``model`` run by ``script_name`` (a standalone
    replay script of this package) under the side environment's ``python``."""

    script = files("builder.repository").joinpath(script_name)
    output_names = numeric_output_names(meta)  # np.load without pickle: numbers only
    input_names = [i["name"] for i in meta["spec"]["inputs"]]
    with tempfile.TemporaryDirectory(prefix="triton-builder-replay-") as work:
        out = Path(work) / "out.npz"
        done = run_command([python, str(script), model, folder / "reference.npz", out, json.dumps(input_names),
                            json.dumps(output_names)], REPLAY_TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise BuilderError(f"the {runtime} side environment failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout)[-800:]}; remove {runtimes_root()} to rebuild it")
        said = json.loads(lines[-1])
        if "load_error" in said:
            return said["load_error"], []
        import numpy as np
        with np.load(out, allow_pickle=False) as archive:
            keys = sorted({k.rsplit("/", 1)[0] for k in archive.files})
            return None, [{name: archive[f"{key}/{name}"] for name in output_names} for key in keys]


def _compared(reference: list[dict[str, Any]], meta: dict[str, Any], got: list[dict[str, Any]],
              label: str) -> tuple[list[str], float]:
    """(failures beyond the build's tolerance, worst rel L2) of ``got`` against reference.npz's outputs."""

    metrics = merge_case_metrics([compare_outputs(ref, run) for ref, run in zip(reference, got)])
    tolerance = (meta.get("verification") or {}).get("tolerance") or {"rel_l2": 1e-5}
    failures = [f"{label}: {line}; the model no longer matches its reference on that release"
                for line in tolerance_failures(metrics, tolerance)]
    return failures, worst_metric(metrics) or 0.0


def torchscript_gate(folder: Path, meta: dict[str, Any], release: TritonRelease) -> tuple[list[str], list[str]]:
    """A TorchScript version: the torch that saved it against R's libtorch (pytorch_libtorch backend), then
    a replay with this environment's torch (the python backend runs the torch docker/triton installs)."""
    import torch


    artifact = meta["artifact"]
    saved_by = (meta.get("versions") or {}).get("torch") or torch.__version__
    if (artifact.get("backend") or "pytorch") != "python":
        too_new = libtorch_failure(saved_by, release)
        if too_new:
            return [f"{artifact['file']}: {too_new}"], []
    inputs, reference = read_reference(folder / "reference.npz")
    run = open_runner("torchscript", folder / artifact["file"], [o["name"] for o in meta["spec"]["outputs"]],
                      [i["name"] for i in meta["spec"]["inputs"]], threads=1)
    got = [run(case["inputs"]) for case in inputs]
    label = f"torch {torch.__version__} (the closest to Triton {release.release}'s libtorch {release.pytorch} that installs here)"
    failures, worst = _compared(reference, meta, got, label)
    return failures, [f"Triton {release.release}: replayed with {label}, {len(got)} reference cases, worst rel L2 "
                      f"{worst:.1e}; saved by torch {saved_by}"]


def ir_failures(xml: Path, release: TritonRelease) -> list[str]:
    """The OpenVINO opsets of an IR that ``release``'s openvino backend cannot read, with the fix."""

    limit = OPENVINO_MAX_OPSET.get(release.openvino)
    too_new = [n for n in ir_opsets(xml) if limit is not None and n > limit]
    if not too_new:
        return []
    return [f"{xml.name}: uses OpenVINO opset{max(too_new)} > opset{limit}, the newest OpenVINO {release.openvino} "
            f"(Triton {release.release}'s openvino backend) reads: serve it on target python (the python backend, "
            "with the builder's openvino in docker/triton: --build-arg OPENVINO_VERSION) or publish the onnx variant"]


def openvino_gate(folder: Path, meta: dict[str, Any], release: TritonRelease,
                  progress: Callable[[str], object] = lambda m: None) -> tuple[list[str], list[str]]:
    """An OpenVINO IR version: Triton's openvino backend must read its opsets, and R's OpenVINO (from PyPI,
    in a side environment) must reproduce reference.npz; the python backend runs the openvino the image
    installs (docker/triton --build-arg OPENVINO_VERSION)."""

    xml = folder / meta["artifact"]["file"]
    built_with = (meta.get("versions") or {}).get("openvino", "?")
    if (meta["artifact"].get("backend") or "openvino") != "openvino":
        return [], [f"Triton {release.release}: the python backend runs {xml.name} with the openvino that "
                    f"docker/triton installs (--build-arg OPENVINO_VERSION={built_with}); not replayed here"]
    failures = ir_failures(xml, release)
    if failures:
        return failures, []

    _, reference = read_reference(folder / "reference.npz")
    python = side_python(release.openvino, progress, package="openvino")
    label = f"OpenVINO {release.openvino} (Triton {release.release}, openvino backend)"
    load_error, got = _replay(python, "ov_replay.py", xml, folder, meta, f"openvino {release.openvino}")
    if load_error:
        return [f"{xml.name}: {label} refuses it: {' '.join(load_error.split())[:400]}: publish the onnx variant, "
                "or build for a --triton-release whose OpenVINO reads it"], []
    failures, worst = _compared(reference, meta, got, label)
    return failures, [f"Triton {release.release}: loads on {label} ({', '.join(f'opset{n}' for n in ir_opsets(xml))}), "
                      f"{len(got)} reference cases, worst rel L2 {worst:.1e}; built with openvino {built_with}"]


def gate_version(check: Any, folder: Path, release_name: str, progress: Callable[[str], object]) -> None:
    """Add the gate's failures and notes to validate's VersionCheck ``check`` (a version that already
    failed or was skipped is left as it is)."""

    if check.failures or check.skipped:
        return
    failures, notes = runtime_gate(folder, read_metadata(folder / "metadata.yaml"), release_name, progress)
    check.failures.extend(failures)
    check.notes.extend(notes)
