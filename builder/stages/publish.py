"""Stage `publish`: the selected variant becomes model `<name>` (and, when asked, every other
eligible variant becomes `<name>__<variant>`), each published atomically with its config,
metadata.yaml, reference.npz and build report."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from builder.monitoring.drift import build_profile, save_profile
from builder.repository.layout import check_version_free
from builder.repository.metadata import library_versions, write_metadata, write_reference
from builder.tensorrt.plan_recipe import add_tensorrt_records
from builder.repository.publish import config_for, publish_model
from builder.report import write_reports
from builder.stages.base import BuildContext, StageResult, Variant

STAGE = "publish"


def _metadata(ctx: BuildContext, variant: Variant, name: str, version: int, hashes: dict[str, str],
              backend: str) -> dict:
    spec = ctx.spec
    return {
        "model_name": name,
        "version": version,
        "build_date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": {"kind": spec.source.kind, "value": spec.source.value,
                   "weights": spec.source.weights.name if spec.source.weights else None,
                   "sha256": dict(ctx.source_hashes)},
        "spec": {"path": str(spec.spec_path) if spec.spec_path else None, "max_batch_size": spec.max_batch_size,
                 "inputs": [{"name": t.name, "dtype": t.dtype, "shape": t.shape,
                             **({"value_range": list(t.value_range)} if t.value_range else {}),
                             "profile": t.profile_shapes()} for t in spec.inputs],
                 "outputs": [{"name": o.name, "dtype": ctx.reference.output_dtypes[o.name],
                              "shape": ctx.reference.output_shapes[o.name]} for o in spec.outputs]},
        "artifact": {"variant": variant.name, "format": variant.format, "precision": variant.precision,
                     "file": {"onnx": "model.onnx", "torchscript": "model.pt", "plan": "model.plan"}[variant.format],
                     "exporter": variant.exporter, "opset": variant.opset, "passes": list(variant.passes),
                     "backend": backend, "target": ctx.target},
        "files_sha256": hashes,
        "versions": library_versions(),
        "verification": variant.verification,
        "accuracy": variant.accuracy,
        "benchmark": variant.benchmark,
        "selection": {"objective": spec.objective, "selected": variant.selected, "why": variant.selection_reason,
                      "candidates": {v.name: v.selection_reason for v in ctx.variants}},
        "notes": list(ctx.notes) + list(variant.notes),
    }


def _profile_data(ctx: BuildContext):
    """The data the drift profile describes: the validation set, else the largest reference case."""
    ref = ctx.reference
    if ref.validation_inputs is not None:
        return ref.validation_inputs, ref.validation_outputs
    index = max(range(len(ref.cases)), key=lambda i: len(next(iter(ref.cases[i]["inputs"].values()))))
    return ref.cases[index]["inputs"], ref.outputs[index]


def _publish_one(ctx: BuildContext, variant: Variant, name: str, version: int | None) -> dict:
    signature = {o.name: (ctx.reference.output_dtypes[o.name], ctx.reference.output_shapes[o.name])
                 for o in ctx.spec.outputs}
    config = config_for(ctx.spec, variant.format, ctx.target, name, signature)

    def fill(folder: Path, version: int, hashes: dict[str, str]) -> None:
        write_reference(folder / "reference.npz", ctx.reference.cases, ctx.reference.outputs)
        if config.backend == "python":
            save_profile(str(folder / "drift_profile.json"), build_profile(*_profile_data(ctx)))
        record = _metadata(ctx, variant, name, version, hashes, config.backend)
        add_tensorrt_records(ctx, variant, name, folder, record)  # plan compatibility record / plan_recipe.json
        write_metadata(folder / "metadata.yaml", record)
        write_reports(folder, ctx)

    return publish_model(ctx.options.repository, config, variant.files, variant.format, fill, version)


def run(ctx: BuildContext) -> StageResult:
    if ctx.selected is None:
        return StageResult.fail(STAGE, "nothing selected to publish")
    check_version_free(ctx.options.repository, ctx.spec.name, ctx.spec.version)
    published = [_publish_one(ctx, ctx.selected, ctx.spec.name, ctx.spec.version)]
    ctx.selected.published_as = ctx.spec.name
    keep = ctx.options.publish_variants if ctx.options.publish_variants is not None else ctx.spec.deploy.publish_variants
    if keep:
        for variant in ctx.variants:
            if variant.eligible and not variant.selected:
                name = f"{ctx.spec.name}__{variant.name}"
                published.append(_publish_one(ctx, variant, name, None))
                variant.published_as = name
    main = published[0]
    return StageResult.ok(STAGE, f"{main['name']} version {main['version']} -> {main['path']}", published=published)
