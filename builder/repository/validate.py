"""`triton-builder validate <repo>/<name>`: the CI/CD regression check of a published model.

Re-checks, for each version (or the one asked for): the config parses with Triton's schema and
names the model folder, and describes the interface each version was built for (metadata.yaml's
spec: inputs, outputs, max_batch_size; builder/repository/interface.py); every file's sha256 matches
metadata.yaml (every published file but metadata.yaml and the signature is listed there; a version
published before reference.npz and the reports were hashed gets a note, and a file nobody published
a warning naming it; validate.hash_failures, shared with ``publish`` and ``register``); metadata.yaml's
``version`` is the folder's number (a renamed or copied folder fails), and no folder has a leading zero
(Triton skips "02"); the model file, run in-process, reproduces reference.npz within the tolerance recorded
at build time. A damaged metadata.yaml is a failure naming what is wrong with it, never a raw error.
A TensorRT plan is first checked against the target GPU and TensorRT (``--gpu`` / ``--tensorrt-version``,
else this machine; builder/tensorrt/compatibility.py): an incompatible or uncheckable plan is a failure.

Usage::

    report = validate_model("model_repository/digits_cnn")
    report.ok, report.failures     # failures: one line per problem, with numbers
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures, worst_metric
from builder.core.errors import UserInputError
from builder.core.files import sha256_file
from builder.core.host import host_warnings
from builder.model.runtime import open_runner, tensorrt_unavailable_reason
from builder.huggingface.ragged import config_takes_ragged, ragged_layout_failure, readable_graph_ragged
from builder.repository.config import parse_config
from builder.repository.interface import version_mismatch
from builder.repository.layout import (MODEL_SUFFIX, existing_versions, is_monitored, is_pipeline, misnamed_versions,
                                       model_dir)
from builder.repository.metadata import read_metadata, read_reference
from builder.repository.pipeline_replay import replay_pipeline
from builder.repository.regression import RegressionCheck, parse_limits, regression_vs_previous
from builder.repository.runtime_gate import gate_version
from builder.repository.signing import SIGNATURE_FILE, SIGNED_CONFIG, public_key as signature_key, verify_model
from builder.repository.warmup_data import read_warmup_files
from builder.tensorrt.compatibility import check_plan_compatibility

#: in a version folder but never in its files_sha256: the file holding the hashes, the signature's files
_UNHASHED = {"metadata.yaml", SIGNATURE_FILE, SIGNED_CONFIG}
#: published but hashed only since reference.npz & co. joined files_sha256 (older versions lack them)
_HASHED_SINCE = ("reference.npz", "drift_profile.json", "build_report.md", "build_report.json", "build_report.png")


@dataclass
class VersionCheck:
    version: int
    failures: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    skipped: str = ""
    notes: list[str] = field(default_factory=list)  # e.g. the runtime gate's (--triton-release)
    pipeline: dict = field(default_factory=dict)  # a Hugging Face pipeline's raw-text replay (pipeline_replay.py)


@dataclass
class ValidationReport:
    model: str
    path: Path
    versions: list[VersionCheck] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    host_warnings: list[str] = field(default_factory=list)  # this host differs from the build's (not a failure)
    warnings: list[str] = field(default_factory=list)  # model-level, not failures (config.pbtxt not signed)
    regression: RegressionCheck | None = None  # the checked version vs the one before it (regression.py)

    @property
    def ok(self) -> bool:
        return (not self.failures and all(not v.failures for v in self.versions)
                and not (self.regression and self.regression.failures))

    def lines(self) -> list[str]:
        out = ([f"- {f}" for f in self.failures] + [f"- warning: {w}" for w in self.warnings]
               + [f"- host: {w}" for w in self.host_warnings])
        for v in self.versions:
            if v.skipped:
                out.append(f"version {v.version}: SKIPPED ({v.skipped})")
            elif v.failures:
                out.append(f"version {v.version}: FAIL")
                out.extend(f"  - {f}" for f in v.failures)
            else:
                worst = worst_metric(v.metrics) or 0.0
                out.append(f"version {v.version}: OK (hashes match; worst rel L2 {worst:.1e})")
                if v.pipeline:
                    out.append("  raw inputs through the published steps vs the reference library: "
                               + ", ".join(f"{k.replace('_', ' ')} {x:.6g}" for k, x in v.pipeline.items()))
            out.extend(f"  {note}" for note in v.notes)
        return out + (self.regression.lines() if self.regression else [])


def validate_model(model_path: str | Path, version: int | None = None, *, gpu: str | None = None,
                   tensorrt_version: str | None = None, public_key: str | Path | None = None,
                   require_signature: bool = False, triton_release: str | None = None,
                   progress: Callable[[str], object] = lambda message: None, max_regression: str | None = None,
                   regression_seconds: float = 1.0, current_host: dict | None = None,
                   config_text: str | None = None) -> ValidationReport:
    """``current_host``: this host's profile (builder/core/host.py host_profile) unless injected; ``config_text``:
    check the versions against this config instead of the model folder's config.pbtxt (rollback: the config it
    is about to write)."""
    limits = parse_limits(max_regression)  # a bad --max-regression fails before any work
    folder = Path(model_path).resolve()
    if not folder.is_dir():
        raise UserInputError(f"{model_path}: no such model folder; pass <repository>/<model name>")
    if is_monitored(folder.parent, folder.name):  # deploy.monitor: the ensemble's versions are its model step's
        kind = "a pipeline" if is_pipeline(folder.parent, folder.name) else "a monitored ensemble"
        progress(f"{folder.name} is {kind}: validating its model step {folder.name}{MODEL_SUFFIX}")
        folder = model_dir(folder.parent, folder.name)
    report = ValidationReport(model=folder.name, path=folder)
    config_path = folder / "config.pbtxt"
    if not config_path.is_file():
        raise UserInputError(f"{config_path} is missing: not a model folder")
    text = config_text if config_text is not None else config_path.read_text()
    try:
        config = parse_config(text)
    except Exception as exc:  # noqa: BLE001
        report.failures.append(f"config.pbtxt: {exc}")
        return report
    if config.name != folder.name:
        report.failures.append(f"config.pbtxt: name '{config.name}' != folder name '{folder.name}'")
    try:  # Triton refuses to load a model whose warm-up file is missing or the wrong size
        read_warmup_files(folder, text)
    except UserInputError as exc:
        report.failures.append(f"config.pbtxt's model_warmup: {exc}")
    versions = existing_versions(folder)
    misnamed = misnamed_versions(folder)
    report.failures.extend(_misnamed_failure(folder, name) for name in misnamed)
    if version is not None:
        if version not in versions:
            hint = (f"; {', '.join(n + '/' for n in misnamed)} is no version folder (a leading zero), rename it"
                    if misnamed else "")
            raise UserInputError(f"{folder.name} has no version {version} (it has: {versions or 'none'}){hint}")
        versions = [version]
    if not versions:
        report.failures.append("no version folders")
    # signatures first (builder/repository/signing.py): a version that fails them is not loaded or replayed
    unsigned: list[str] = []
    signature_failures = verify_model(folder, versions, signature_key(public_key, folder.parent), require_signature,
                                      warnings=unsigned)
    report.failures.extend(signature_failures)
    report.warnings.extend(line for line in unsigned if not line.startswith("version "))
    for number in versions:
        if any(line.startswith(f"version {number}: ") for line in signature_failures):
            report.versions.append(VersionCheck(number, skipped="signature check failed: not loaded or replayed"))
            continue
        report.versions.append(_check_version(folder / str(number), number, gpu, tensorrt_version, config))
        _replay_texts(folder, report.versions[-1])
        report.versions[-1].notes += [f"warning: {line.split(': ', 1)[1]}" for line in unsigned
                                      if line.startswith(f"version {number}: ")]
        if triton_release and not record_problem(folder / str(number) / "metadata.yaml"):
            # can that Triton release's runtimes load and reproduce it (runtime_gate.py)
            gate_version(report.versions[-1], folder / str(number), triton_release, progress)
    signed_ok = not any(line.startswith(f"version {versions[-1]}: ") for line in signature_failures) if versions \
        else True  # a version whose signature failed is not read further (its metadata.yaml may be anything)
    if versions and signed_ok and not record_problem(folder / str(versions[-1]) / "metadata.yaml"):
        meta_path = folder / str(versions[-1]) / "metadata.yaml"
        report.host_warnings = host_warnings(read_metadata(meta_path), folder.name, current_host, source=meta_path)
    if versions and not report.versions[-1].failures and not report.versions[-1].skipped:
        report.regression = _regression(folder, versions[-1], limits, regression_seconds)
    return report


def _replay_texts(folder: Path, check: VersionCheck) -> None:
    """A Hugging Face pipeline's model step: its raw texts through the published steps and model, in-process."""
    ensemble = folder.name[:-len(MODEL_SUFFIX)] if folder.name.endswith(MODEL_SUFFIX) else ""
    if not ensemble or not is_pipeline(folder.parent, ensemble) or check.failures or check.skipped:
        return
    if not (folder / str(check.version) / "pipeline_reference.json").is_file():  # your own steps: `check` replays
        check.notes.append("preprocess/postprocess steps: their raw inputs are replayed by `check` on the server")
        return
    meta = read_metadata(folder / str(check.version) / "metadata.yaml")
    artifact = meta["artifact"]
    run = open_runner(artifact["format"], folder / str(check.version) / artifact["file"],
                      [o["name"] for o in meta["spec"]["outputs"]], [i["name"] for i in meta["spec"]["inputs"]])
    tolerance = (meta.get("verification") or {}).get("tolerance") or {}
    failures, figures = replay_pipeline(folder.parent, ensemble, check.version, run, artifact.get("precision", "fp32"),
                                        float(tolerance.get("rel_l2", 0.0)),
                                        (meta.get("pipeline") or {}).get("steps_sha256"))
    check.failures += [f"raw inputs: {line}" for line in failures]
    check.pipeline = figures


def _misnamed_failure(folder: Path, name: str) -> str:
    canonical = str(int(name))
    fix = (f"rename it: mv {folder / name} {folder / canonical}" if not (folder / canonical).exists()
           else f"{canonical}/ exists too: remove whichever of the two is not version {canonical}")
    return (f"{name}/: not a version folder Triton loads (a leading zero: Triton skips it with a warning and "
            f"serves no version {canonical} from it); version folders are plain numbers: {fix}")


def metadata_problem(meta: object) -> str | None:
    """What is wrong with a parsed metadata.yaml's shape (the fields validate and the regression read), or None."""
    if not isinstance(meta, dict):
        return f"not a mapping of fields as build writes it (it reads as a YAML {type(meta).__name__})"
    artifact, spec = meta.get("artifact"), meta.get("spec")
    if not isinstance(artifact, dict) or not all(isinstance(artifact.get(k), str) for k in ("format", "file")):
        return "its 'artifact' lacks the model's 'format' and 'file'"
    if not isinstance(spec, dict) or not all(
            isinstance(spec.get(k), list) and all(isinstance(t, dict) and "name" in t for t in spec[k])
            for k in ("inputs", "outputs")):
        return "its 'spec' lacks the 'inputs' and 'outputs' (lists of tensors with a 'name')"
    if not isinstance(meta.get("files_sha256") or {}, dict):
        return "its 'files_sha256' is not a mapping of file name to sha256"
    return None


def record_problem(path: Path, fields: bool = True) -> str | None:
    """Why ``path`` (a version's metadata.yaml) cannot be read as build writes it, or None; ``fields``
    False: only what a copy needs (a mapping whose files_sha256 is one), not what a replay reads."""
    import yaml
    if not path.is_file():
        return "is missing"
    try:
        meta = read_metadata(path)
    except yaml.YAMLError as err:
        return f"is not valid YAML ({str(err).splitlines()[0][:120]})"
    if fields:
        problem = metadata_problem(meta)
    elif not isinstance(meta, dict):
        problem = f"not a mapping of fields as build writes it (it reads as a YAML {type(meta).__name__})"
    else:
        problem = None if isinstance(meta.get("files_sha256") or {}, dict) else \
            "its 'files_sha256' is not a mapping of file name to sha256"
    return f"is damaged: {problem}" if problem else None


def _regression(folder: Path, version: int, limits: dict, seconds: float) -> RegressionCheck | None:
    """regression_vs_previous, after checking the previous version's metadata.yaml: a damaged one is named
    with what is wrong (it read as a raw TypeError), and still fails a --max-regression gate."""
    previous = max((v for v in existing_versions(folder) if v < version), default=None)
    problem = record_problem(folder / str(previous) / "metadata.yaml") if previous is not None else None
    if problem is None:
        return regression_vs_previous(folder, version, limits, seconds)
    check = RegressionCheck(version, previous, skipped=f"{folder / str(previous) / 'metadata.yaml'} {problem}; "
                                                       f"restore it (validate --version {previous} names what else "
                                                       "changed), or remove that version")
    if limits:
        check.failures.append(f"could not compare with version {previous} (its metadata.yaml {problem}); "
                              "--max-regression needs both versions runnable here")
    return check


def hash_failures(folder: Path, declared: dict[str, str], digests: dict[str, str] | None = None) -> list[str]:
    """One line per file of metadata.yaml's ``declared`` {name: sha256} that is missing from ``folder`` or
    differs; ``digests`` ({name: sha256} already computed) spares hashing a large model twice. Shared by
    validate, ``publish --to s3`` and ``register``: a version is checked the same way wherever it goes."""
    failures = []
    for name, expected in declared.items():
        path = folder / name
        if not path.is_file():
            failures.append(f"{name}: missing")
        elif (digests.get(name) if digests and name in digests else sha256_file(path)) != expected:
            failures.append(f"{name}: sha256 differs from metadata.yaml (file changed after the build)")
    return failures


def _unlisted_files(folder: Path, declared: dict) -> list[str]:
    """Notes on the files metadata.yaml's hashes do not cover: older versions' unhashed extras, and a
    warning for each file nobody published (it would ship with the model unchecked)."""
    older, unexpected = [], []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        # Triton's python stub writes __pycache__ beside model.py; hidden names are locks and editors'
        if any(part == "__pycache__" or part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        name = rel.as_posix()
        if name in declared or name in _UNHASHED:
            continue
        (older if name in _HASHED_SINCE else unexpected).append(name)
    notes = [f"note: {', '.join(older)} not in metadata.yaml's files_sha256 (published before triton-builder "
             "hashed them): not checked"] if older else []
    return notes + [f"warning: {name}: not published by triton-builder (not in metadata.yaml's files_sha256), "
                    "so not checked; it ships with the model: remove it, or build a new version that holds it"
                    for name in unexpected]


def _check_version(folder: Path, number: int, gpu: str | None, tensorrt_version: str | None,
                   config=None) -> VersionCheck:
    check = VersionCheck(number)
    if not (folder / "metadata.yaml").is_file():
        read_metadata(folder / "metadata.yaml")  # raises, naming the file (exit 2, as it always did)
    problem = record_problem(folder / "metadata.yaml")
    if problem:
        check.failures.append(f"metadata.yaml {problem}: changed after the build; restore the version from where "
                              "it was published, or rebuild it")
        return check
    meta = read_metadata(folder / "metadata.yaml")
    # the number is the folder's name, which nothing signs or hashes: a renamed or copied folder serves
    # as another version than the one built (and can shadow it under version_policy latest)
    if meta.get("version") != number:
        built = meta.get("version")
        check.failures.append(
            f"metadata.yaml says version {built}, but its folder is {number}/ (Triton serves it as version {number}): "
            f"the folder was renamed or copied; move it back to {built}/, or build the model again to publish "
            "a new version" if isinstance(built, int) else
            f"metadata.yaml names no version (version: {built!r}), but its folder is {number}/: not as build wrote it; "
            "rebuild the version")
    # the model folder's one config.pbtxt must describe the interface this version was built for
    mismatch = version_mismatch(meta, config) if config is not None else []
    if mismatch:
        check.failures.append(
            f"config.pbtxt does not describe this version's interface ({'; '.join(mismatch)}; metadata.yaml's "
            "spec -> config.pbtxt): a later version (or an edit) changed it, so Triton cannot serve this version "
            "with it (version_policy all, or a rollback to it); build this version's spec again as a new version, "
            "or publish the other interface under a new model name")
    check.failures += hash_failures(folder, meta.get("files_sha256") or {})
    check.notes += _unlisted_files(folder, meta.get("files_sha256") or {})
    artifact = meta["artifact"]
    if artifact["format"] == "plan":
        compatibility = check_plan_compatibility(meta, gpu=gpu, tensorrt_version=tensorrt_version)
        check.failures.extend(compatibility.failures)
        if check.failures:
            return check
        # re-run its outputs only where this machine is the target that was checked
        why_not = tensorrt_unavailable_reason() or ("the target given is not necessarily this machine"
                                                    if gpu or tensorrt_version else "")
        if why_not:
            check.skipped = ("compatible: " + "; ".join(compatibility.checked)
                             + f". Outputs not re-run here ({why_not}): run `triton-builder check` on the served model")
            return check
    if check.failures:
        return check
    graph_ragged = (readable_graph_ragged(folder / artifact["file"])  # parsed only where a config can disagree
                    if config is not None and artifact["format"] == "onnx" else None)
    if graph_ragged is not None:
        ragged = ragged_layout_failure(graph_ragged, config_takes_ragged(config))
        if ragged:
            check.failures.append(ragged)
            return check
    cases, outputs = read_reference(folder / "reference.npz")
    output_names = [o["name"] for o in meta["spec"]["outputs"]]
    input_names = [i["name"] for i in meta["spec"]["inputs"]]
    run = open_runner(artifact["format"], folder / artifact["file"], output_names, input_names)
    check.metrics = merge_case_metrics([compare_outputs(ref, run(case["inputs"])) for case, ref in zip(cases, outputs)])
    tolerance = (meta.get("verification") or {}).get("tolerance") or {"rel_l2": 1e-5}
    check.failures.extend(tolerance_failures(check.metrics, tolerance))
    return check
