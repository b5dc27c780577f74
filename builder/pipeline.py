"""Runs the stages in order and records each result; the report is made from those records.

Usage::

    result = build("examples/digits/spec.yaml", repository="model_repository")
    result.published[0]["path"], result.rows    # where it went, the summary table rows
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from builder.core.errors import BuilderError, UserInputError, VerificationError, unknown_choice
from builder.core.interrupts import raise_if_stopped
from builder.core.progress import bar
from builder.core.scratch import work_folder
from builder.model.variants import add_bases, resolve_variants
from builder.report.build_report import variant_rows
from builder.repository.layout import check_version_free, require_writable
from builder.repository.signing import KEY_ENV, signing_key as _signing_key
from builder.repository.triton_releases import COMPOSE_RELEASE, triton_release
from builder.spec.model import TARGET_ALIASES, TARGETS, ModelSpec, canonical_target, load_spec, target_note
from builder.stages import (benchmark, compress, export_onnx, export_torchscript, load, openvino, optimize, publish,
                            quantize, register, select, tensorrt, verify)
from builder.stages.base import BuildContext, BuildOptions, StageResult, Status, timed
from builder.stages.common import WORK_FOLDER_ERRNOS, work_folder_error
from builder.stages.export_onnx import IF_UNVERIFIED
from builder.storage.mlflow_registry import registry_url

#: the stages in order: (name, module, required). A required stage that fails stops the build; an optional
#: one is recorded and the build goes on. Importing a stage registers its variants (builder/model/variants.py).
STAGES = [
    ("load", load, True),
    ("export_torchscript", export_torchscript, False),
    ("export_onnx", export_onnx, False),
    ("optimize", optimize, False),
    ("quantize", quantize, False),
    ("openvino", openvino, False),
    ("tensorrt", tensorrt, False),
    ("compress", compress, False),
    ("verify", verify, True),
    ("benchmark", benchmark, False),
    ("select", select, True),
    ("publish", publish, True),
    ("register", register, True),
]


@dataclass
class BuildResult:
    context: BuildContext
    published: list[dict[str, Any]]
    rows: list[dict[str, Any]]

    @property
    def results(self) -> list[StageResult]:
        return self.context.results


def build(spec: str | Path | ModelSpec, repository: str | Path = "model_repository", *,
          variants: list[str] | None = None, target: str | None = None, strict: bool = False,
          publish_variants: bool | None = None, benchmark_seconds: float | None = None,
          progress: Callable[[str], object] | None = None, signing_key: str | Path | None = None,
          register: bool = False, registry: str | None = None, alias: str | None = None,
          triton_release: str | None = None) -> BuildResult:
    """Build, verify and publish one model spec into the repository. Raises BuilderError subclasses.

    ``signing_key``: an elliptic-curve private key (PEM) that signs every published version (else
    $TRITON_BUILDER_SIGNING_KEY; neither: unsigned, said in progress). builder/repository/signing.py.

    ``register``: also register every published version in MLflow's model registry at ``registry`` (else
    $MLFLOW_TRACKING_URI), checked to answer before anything is built; ``alias`` goes on the main model's
    version. builder/stages/register.py.

    ``triton_release``: the NGC Triton release the versions must load on (default docker-compose.yml's,
    builder/repository/triton_releases.py): ONNX variants beyond its IR version / opset are rejected.

    ``progress`` gets one line per stage (None: silent; the CLI passes a builder.core.progress.Reporter,
    which also draws a bar over the stages on a terminal)."""

    model_spec = spec if isinstance(spec, ModelSpec) else load_spec(spec)
    plan = checked_plan(model_spec, repository, variants=variants, target=target, strict=strict,
                        publish_variants=publish_variants, benchmark_seconds=benchmark_seconds,
                        signing_key=signing_key, register=register, registry=registry, alias=alias,
                        triton_release=triton_release)
    return run_stages(model_spec, plan, progress or _silent)


@dataclass
class BuildPlan:
    """A build's checked arguments: what ``run_stages`` runs."""
    options: BuildOptions
    requested: list[str]  # the variants asked for, resolved for the target
    base_only: list[str]  # variants made only as the base of a requested one
    target_note: str | None  # what the target means here, said in progress and the report


def checked_plan(model_spec: ModelSpec, repository: str | Path, *, variants: list[str] | None, target: str | None,
                 strict: bool, publish_variants: bool | None, benchmark_seconds: float | None,
                 signing_key: str | Path | None, register: bool, registry: str | None, alias: str | None,
                 triton_release: str | None) -> BuildPlan:
    """Every check of ``build``'s arguments against the spec and the repository, before anything is made or
    written (UserInputError naming the argument and the fix)."""
    options = BuildOptions(repository=Path(repository).resolve(), variants=variants, target=target, strict=strict,
                           benchmark_seconds=benchmark_seconds, publish_variants=publish_variants)
    options.signing_key = _signing_key(signing_key, options.repository)
    options.triton_release = _checked_release(triton_release, model_spec)
    if alias and not register:
        raise UserInputError(f"--alias {alias}: only with --register (the alias names the registered version)")
    if register:
        options.registry, options.registry_alias = registry_url(registry), alias
    target_said = target_note(target if target is not None else model_spec.deploy.target_given)
    if target is not None:
        if target not in TARGETS and target not in TARGET_ALIASES:
            raise unknown_choice("target", target, TARGETS, "targets are fixed: cpu, gpu, python (embedded is cpu)")
        options.target = canonical_target(target)
    if benchmark_seconds is not None and benchmark_seconds < 0:
        raise UserInputError(f"--benchmark-seconds: {benchmark_seconds} is negative; give seconds per variant, "
                             "or 0 to skip measuring")
    effective_target = options.target or model_spec.deploy.target
    _refuse_unservable_scalars(model_spec, effective_target)
    check_version_free(options.repository, model_spec.name, model_spec.version)
    require_writable(options.repository)  # a read-only mount fails now, not after every stage has run
    requested, base_only = add_bases(resolve_variants(variants or model_spec.variants, effective_target,
                                                      model_spec.deploy.instance_kind))
    return BuildPlan(options, requested, base_only, target_said)


def run_stages(model_spec: ModelSpec, plan: BuildPlan, progress: Callable[[str], object]) -> BuildResult:
    """Run STAGES in order on a checked plan and record each result; a required stage that fails stops the build."""
    if plan.options.signing_key is None:
        progress(f"note: versions are published unsigned (no --signing-key or ${KEY_ENV})")
    with work_folder(model_spec.name) as workdir:
        ctx = BuildContext(spec=model_spec, options=plan.options, workdir=workdir, progress=progress)
        ctx.requested_variants, ctx.base_only = plan.requested, plan.base_only
        if plan.target_note:
            ctx.notes.append(plan.target_note)
            progress(f"note: {plan.target_note}")
        progress(f"building {model_spec.name} (target {ctx.target}; variants: {', '.join(ctx.requested_variants)})")
        with bar(progress, f"building {model_spec.name}", total=len(STAGES)) as advance:
            for index, (name, module, required) in enumerate(STAGES, 1):
                progress(f"[{index}/{len(STAGES)}] {name} ...")
                result = _run_stage(module, ctx, name, workdir)
                raise_if_stopped()  # a stop signal whose interrupt a library swallowed: never go on to publish
                ctx.results.append(result)
                reason = result.reason.splitlines()[0] if result.reason else ""
                progress(f"[{index}/{len(STAGES)}] {name}: {result.status.value} ({result.seconds:.1f} s) {reason}")
                advance()
                if name == "verify" and plan.options.strict:
                    _raise_if_any_failed(ctx)
                if result.status is Status.FAIL and required:
                    _raise_for(ctx, result)
        published = next(r.outputs["published"] for r in ctx.results if r.stage == "publish")
        return BuildResult(ctx, published, variant_rows(ctx))


def _run_stage(module, ctx: BuildContext, name: str, workdir: Path) -> StageResult:
    try:
        return timed(module.run, ctx, name)
    except OSError as exc:
        # a full, read-only or forbidden $TMPDIR: one message naming the work folder and the fix (exit 2);
        # a file elsewhere (the repository, the user's data) keeps its own name in the CLI's message
        inside = exc.filename is None or Path(str(exc.filename)).resolve().is_relative_to(workdir.resolve())
        if exc.errno in WORK_FOLDER_ERRNOS and inside:
            raise work_folder_error(exc, workdir) from None
        raise


def _refuse_unservable_scalars(spec: ModelSpec, target: str) -> None:
    """A scalar (shape []) of a model without a batch dimension: only the python backend (target python)
    can serve it (builder/repository/config.py); said before the build, not at publish. Outputs count where
    the spec gives their shape (the others are known once the model runs, and publish refuses them)."""
    if target == "python" or spec.batching:
        return
    scalars = ([f"input '{t.name}'" for t in spec.inputs if list(t.shape) == []]
               + [f"output '{o.name}'" for o in spec.outputs if o.shape is not None and list(o.shape) == []])
    if scalars:
        raise UserInputError(
            f"{', '.join(scalars)}: shape [] with max_batch_size 0 and target {target}: Triton's own backends "
            "cannot serve a scalar without a batch dimension (its dims cannot be empty, and Triton refuses reshape "
            "[] for a model that does not batch). Fix: deploy.target python (the python backend serves it as dims "
            "[1]), or max_batch_size > 0, or make the model take/return it as shape [1]")


def _checked_release(name: str | None, spec: ModelSpec) -> str:
    release = triton_release(name or COMPOSE_RELEASE)
    if spec.onnx.opset and spec.onnx.opset > release.max_opset:
        raise UserInputError(f"onnx.opset: {spec.onnx.opset} is newer than Triton {release.release} loads (its "
                             f"onnxruntime {release.onnxruntime} implements opset <= {release.max_opset}); set "
                             f"onnx.opset: {release.max_opset} or lower, or build for a newer --triton-release")
    return release.release


def _silent(message: str) -> None:
    return None


def _variant_failures(ctx: BuildContext) -> list[str]:
    lines = []
    for v in ctx.variants:
        if v.rejected:
            hints = [n.replace(IF_UNVERIFIED, "hint: ", 1) for n in v.notes if n.startswith(IF_UNVERIFIED)]
            lines.append(f"{v.name}: " + "\n".join([v.rejected, *hints]).replace("\n", "\n  "))
    return lines


def _raise_if_any_failed(ctx: BuildContext) -> None:
    failed = [v for v in ctx.variants if v.verified is False]
    unmade = {name: why for name, (kind, why) in ctx.not_made.items() if kind == "failed"}
    if failed or unmade:
        what = [f"{len(failed)} variant(s) failed verification"] if failed else []
        what += [f"{len(unmade)} could not be made"] if unmade else []
        raise VerificationError(f"{ctx.spec.name}: {' and '.join(what)} (--strict); nothing was published",
                                _variant_failures(ctx) + [f"{name}: not made: {why}" for name, why in unmade.items()])


def _raise_for(ctx: BuildContext, result: StageResult) -> None:
    if result.stage in ("verify", "select"):
        failed_stages = [f"{r.stage}: {r.reason}" for r in ctx.results
                         if r.status is Status.FAIL and r.stage not in ("verify", "select")]
        raise VerificationError(f"{ctx.spec.name}: {result.reason}; nothing was published",
                                _variant_failures(ctx) + failed_stages)
    raise BuilderError(f"{ctx.spec.name}: stage {result.stage} failed: {result.reason}")
