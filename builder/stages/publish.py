"""Stage `publish`: the selected variant becomes model `<name>` (and, when asked, every other
eligible variant becomes `<name>__<variant>`). For each, this stage builds one typed description of
the version (builder/repository/description.py: config, model files, metadata, reference.npz,
build report, drift profile, plan recipe) and builder/repository/ writes it atomically; nothing here
writes into the repository."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from builder.core.host import host_profile, serving_size, size_queue_delay
from builder.huggingface.label_head import fold_label_head
from builder.huggingface.ragged import with_ragged_batch
from builder.huggingface.texts import bucket_decision, encoder_for
from builder.monitoring.drift_profile import build_profile, profile_text
from builder.report.build_report import report_files
from builder.repository.config import backend_for, render_config, thread_parameter
from builder.repository.description import VersionDescription
from builder.repository.interface import InterfaceChange, interface_change
from builder.repository.layout import MODEL_FILES, check_version_free, latest_version, reserve_version
from builder.repository.metadata import library_versions, reference_bytes
from builder.repository.monitored import monitored_names, publish_monitor, refuse_mixed
from builder.repository.pipeline import (REFERENCE_FILE, classification_outputs, head_folded, pipeline_names,
                                         pipeline_steps, publish_pipeline, step_file_hashes)
from builder.repository.publish import config_for, publish_model, python_backend_files
from builder.repository.user_pipeline import REFERENCE_FILE as STEPS_REFERENCE_FILE, publish_user_pipeline
from builder.stages.base import BuildContext, StageResult, Variant
from builder.tensorrt.plan_build import BUILD_PLANS, RECIPE_FILE
from builder.tensorrt.plan_recipe import tensorrt_parts

STAGE = "publish"


def _metadata(ctx: BuildContext, variant: Variant, name: str, version: int, hashes: dict[str, str] | None,
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
                     "file": MODEL_FILES[variant.format],
                     "exporter": variant.exporter, "opset": variant.opset, "passes": list(variant.passes),
                     "backend": backend, "target": ctx.target, "triton_release": ctx.options.triton_release},
        "files_sha256": hashes,
        "versions": library_versions(),
        "verification": variant.verification,
        "verified_by": variant.verified_by,  # reference (closeness) | task_accuracy (stage compress)
        **({"compression": variant.compression, "model_stats": variant.stats} if variant.compression else {}),
        "accuracy": variant.accuracy,
        "benchmark": variant.benchmark,
        "selection": {"objective": spec.objective, "selected": variant.selected, "why": variant.selection_reason,
                      **({"weights": dict(spec.tradeoff)} if spec.objective == "tradeoff" else {}),
                      "candidates": {v.name: v.selection_reason for v in ctx.variants}},
        "notes": list(ctx.notes) + list(variant.notes),
        "host": host_profile(),  # where the variants were measured: serve/check/validate compare with it
    }


PYTHON_BACKEND_IMAGE = ("a python-backend version: its model.py imports onnxruntime, torch or openvino, which the "
                        "stock NGC Triton image lacks; serve it with the derived image (docker compose -f "
                        "docker-compose.yml -f docker/triton/python-backend.compose.yml up -d --build), or build "
                        "with --target cpu for standard folders that the stock image loads")
PIPELINE_IMAGE = ("the pipeline's tokenizer step imports tokenizers, which the stock NGC Triton image lacks; serve it "
                  "with the derived image (docker compose -f docker-compose.yml -f "
                  "docker/triton/python-backend.compose.yml up -d --build)")
NO_DRIFT_PROFILE = ("drift monitoring off: no data.validation describes the traffic to expect (a profile of "
                    "generated inputs would raise drift alerts on real traffic); add data.validation with real "
                    "inputs to get drift gauges")


def _profile_data(ctx: BuildContext, variant: Variant):
    """The data the drift profile describes: the validation set (with the variant's own outputs where
    it changed the function by design: stage compress); None without one."""
    ref = ctx.reference
    if ref.validation_inputs is None:
        return None
    return ref.validation_inputs, (variant.own_validation_outputs if variant.own_validation_outputs is not None
                                   else ref.validation_outputs)


def _serving_config(ctx: BuildContext, variant: Variant, name: str):
    """The version's config, the serving size and batching delay it was sized with, and the model files (a
    classifier's model step behind its pipeline: the variant's graph with the label head folded in)."""
    signature = ctx.reference.output_signature()
    profile = host_profile(with_gpu=False)
    sizing = serving_size(variant.benchmark, profile["usable_cores"])
    bench = variant.benchmark or {}
    p50 = (bench.get("latency_ms_b1") or {}).get("p50")
    delay = size_queue_delay(p50 / 1000.0 if p50 else None, bench.get("throughput_by_batch"))
    config = config_for(ctx.spec, variant.format, ctx.target, name, signature,
                        sizing=sizing[:2] if sizing else None, queue_delay_us=delay[0] if p50 else None)
    files = list(variant.files)
    if ctx.pipeline is not None and name == pipeline_names(ctx.spec.name)[1]:
        config, files = _with_label_head(ctx, variant, config, files)
        if not ctx.pipeline.images:
            ctx.pipeline.ragged_why = "no ragged batching: off in the spec (deploy.ragged_batching: false)"
            if ctx.spec.deploy.ragged_batching:
                sample = ctx.reference.validation_inputs or ctx.reference.cases[0]["inputs"]
                config, files, ctx.pipeline.ragged_why = with_ragged_batch(
                    config, files, ctx.pipeline.tags_tokens, encoder_for(ctx.pipeline.tokenizer_file, 1, False).pad_id,
                    sample, ctx.workdir / "ragged_batch" / variant.name)
    return config, sizing, delay, files


def _with_label_head(ctx: BuildContext, variant: Variant, config, files: list[Path]):
    """A classifier's post-processing folded into its ONNX graph (builder/huggingface/label_head.py): the ensemble
    then runs one python step (the tokenizer), not two. Other formats keep the python post-processing step."""
    pipeline = ctx.pipeline
    if not (pipeline.classifies and not pipeline.tags_tokens and variant.format == "onnx" and len(files) == 1
            and config.max_batch_size > 0 and len(config.outputs) == 1):
        return config, files
    headed = ctx.workdir / "label_head" / variant.name / "model.onnx"
    if not fold_label_head(files[0], headed, config.outputs[0].name, pipeline.labels, pipeline.activation):
        return config, files
    ctx.step_timings["labels_in_graph"] = True
    return dataclasses.replace(config, outputs=list(config.outputs) + classification_outputs(pipeline.labels)), [headed]


def _describe(ctx: BuildContext, variant: Variant, name: str, version: int,
              serving) -> tuple[VersionDescription, str]:
    """The version's description (``serving``: ``_serving_config``'s), and a progress line for what it
    carries beyond the model ("" if nothing)."""
    config, sizing, delay, model_files = serving
    # a variant verified by task accuracy serves its own function: check compares with its own outputs
    outputs = variant.own_outputs if variant.own_outputs is not None else ctx.reference.outputs
    extra: dict[str, bytes] = {"reference.npz": reference_bytes(ctx.reference.cases, outputs)}
    # every version carries the profile of the traffic it was built for: the python backend's model.py and a
    # deploy.monitor step read it; a standard folder keeps it as its record (monitoring can be switched on later)
    profiled = _profile_data(ctx, variant)
    if profiled is not None:
        extra["drift_profile.json"] = profile_text(build_profile(*profiled)).encode()
    record = _metadata(ctx, variant, name, version, None, config.backend)  # version + files_sha256: on publish
    if ctx.pipeline is not None and head_folded(config):  # the label head's outputs are this version's interface too
        record["spec"]["outputs"] += [{"name": o.name, "dtype": "string" if o.data_type == "TYPE_STRING" else "float32",
                                       "shape": list(o.dims)} for o in config.outputs[len(ctx.spec.outputs):]]
    if name != ctx.spec.name and name == monitored_names(ctx.spec.name)[0] and ctx.pipeline is None:
        record["monitor"] = {"served_as": ctx.spec.name, "step": monitored_names(ctx.spec.name)[1]}
    if ctx.user_steps is not None and name == pipeline_names(ctx.spec.name)[1]:
        extra[STEPS_REFERENCE_FILE] = ctx.user_steps.reference
        record["pipeline"] = {"served_as": ctx.spec.name, "steps": list(pipeline_names(ctx.spec.name)),
                              "user_steps": {s.kind: f"{s.module_file.name}:{s.function}"
                                             for s in (ctx.user_steps.pre, ctx.user_steps.post) if s}}
    if ctx.pipeline is not None and name == pipeline_names(ctx.spec.name)[1]:
        extra[REFERENCE_FILE] = ctx.pipeline.reference
        record["pipeline"] = {"served_as": ctx.spec.name, "task": ctx.pipeline.task,
                              "steps": pipeline_steps(ctx.spec.name, config, ctx.pipeline),
                              **({"label_head": "folded into the graph (builder/huggingface/label_head.py)"}
                                 if head_folded(config) else {}),
                              "max_length": ctx.pipeline.max_length, "truncation": ctx.pipeline.truncation,
                              "length_buckets": ctx.pipeline.length_buckets,
                              "length_buckets_why": ctx.pipeline.buckets_why,
                              "ragged_batching": bool(config.batch_inputs),
                              "ragged_batching_why": ctx.pipeline.ragged_why,
                              "steps_sha256": step_file_hashes(ctx.spec.name, config, ctx.pipeline)}
    said = ""
    if profiled is None:
        record.setdefault("notes", []).append(NO_DRIFT_PROFILE)
        said = f"  {name} version {version}: {NO_DRIFT_PROFILE}"
    record["serving"] = {"instances": config.instance_groups[0].count,
                         "intra_op_threads": int(config.parameters.get(thread_parameter(config.parameters) or "", 0))
                         or None,
                         "sized": ("from the spec (deploy.instances)" if not ctx.spec.deploy.instances_auto else
                                   "GPU target: from the spec" if ctx.target == "gpu" else sizing[2] if sizing else
                                   "not sized: no benchmark (--benchmark-seconds 0); run `triton-builder select`")}
    if config.dynamic_batching is not None:
        record["serving"]["max_queue_delay_microseconds"] = config.dynamic_batching.max_queue_delay_microseconds
        record["serving"]["delay_sized"] = (
            "from the spec (deploy.max_queue_delay_microseconds)" if not ctx.spec.deploy.max_queue_delay_auto else
            "GPU target: from the spec" if ctx.target == "gpu" else delay[1])
    trt = tensorrt_parts(ctx, variant, name, version, record)
    if trt.metadata is not None:
        record["tensorrt"] = trt.metadata  # the plan's compatibility record
    if trt.recipe is not None:
        extra[RECIPE_FILE] = trt.recipe
        ctx.tensorrt.recipe_published(trt.recipe_location)
        record.setdefault("notes", []).append(trt.note)
        plan_model = ctx.tensorrt.deferred["plan_model"]
        said += ("\n" if said else "") + (f"  {name} version {version}: {RECIPE_FILE} written ({plan_model} is "
                                            f"built on the GPU host: {BUILD_PLANS})")
    extra.update(report_files(ctx))
    return VersionDescription(name=name, version=version, config=config, model_format=variant.format,
                              model_files=model_files, runtime_files=python_backend_files(config),
                              extra_files=extra, metadata=record, signing_key=ctx.options.signing_key), said


def _publish_one(ctx: BuildContext, variant: Variant, name: str, version: int | None, serving,
                 change: InterfaceChange | None, warnings: list[str]) -> dict:
    # the number is held from now on (metadata and report record it); concurrent builds take others
    with reserve_version(ctx.options.repository, name, version) as reservation:
        if change is not None:  # said before describing: metadata.yaml and build_report carry it too
            warning = change.warning(reservation.version)
            ctx.notes.append(f"warning: {warning}")
            ctx.progress(f"warning: {warning}")
            warnings.append(warning)
        description, said = _describe(ctx, variant, name, reservation.version, serving)
        published = publish_model(ctx.options.repository, description, reservation)
    if said:
        ctx.progress(said)
    if published.get("note"):  # published below a higher version: its config (and so what is served) was kept
        ctx.notes.append(f"warning: {published['note']}")
        ctx.progress(f"warning: {published['note']}")
        warnings.append(published["note"])
    return published


def run(ctx: BuildContext) -> StageResult:
    if ctx.selected is None:
        return StageResult.fail(STAGE, "nothing selected to publish")
    check_version_free(ctx.options.repository, ctx.spec.name, ctx.spec.version)
    keep = ctx.options.publish_variants if ctx.options.publish_variants is not None else ctx.spec.deploy.publish_variants
    monitored = ensemble_layout(ctx)
    refuse_mixed(ctx.options.repository, ctx.spec.name, monitored)
    main_name = monitored_names(ctx.spec.name)[0] if monitored else ctx.spec.name
    plan = [(ctx.selected, main_name, ctx.spec.version)]
    if keep:
        plan += [(v, f"{ctx.spec.name}__{v.name}", None) for v in ctx.variants if v.eligible and not v.selected]
    # before anything is written: each model's new config against the config.pbtxt its older versions share
    # (builder/repository/interface.py: refused where the version_policy also serves them, else a warning)
    checked = []
    for variant, name, version in plan:
        serving = _serving_config(ctx, variant, name)
        checked.append((variant, name, version, serving,
                        interface_change(ctx.options.repository, name, render_config(serving[0]))))
    if ctx.pipeline is not None and ctx.pipeline.token_lengths:
        _choose_padding(ctx, ragged=bool(checked[0][3][0].batch_inputs))
    published, warnings = [], []
    for warning in _earlier_companions(ctx, {name for _, name, _ in plan}):
        ctx.notes.append(f"warning: {warning}")
        ctx.progress(f"warning: {warning}")
        warnings.append(warning)
    for variant, name, version, serving, change in checked:
        published.append(_publish_one(ctx, variant, name, version, serving, change, warnings))
        variant.published_as = name
    main = published[0]
    said = f"{main['name']} version {main['version']} -> {main['path']}"
    if ctx.pipeline is not None:  # the steps' version N: the tokenizer model version N was verified with
        main.update(publish_pipeline(ctx.options.repository, ctx.spec.name, main["version"], checked[0][3][0],
                                     ctx.pipeline))
        main["served_as"] = ctx.spec.name
        ctx.progress(f"  note: {PIPELINE_IMAGE}")
        said += (f"; served as '{ctx.spec.name}' (an ensemble, text in: {', '.join(main['steps'][:1])}, "
                 f"{main['name']}{', ' + main['steps'][1] if len(main['steps']) > 1 else ''})")
        ctx.progress(f"  {said}")
    elif ctx.user_steps is not None:  # your own steps: version N with model version N
        main.update(publish_user_pipeline(ctx.options.repository, ctx.spec.name, main["version"], checked[0][3][0],
                                          ctx.user_steps))
        main["served_as"] = ctx.spec.name
        said += f"; served as '{ctx.spec.name}' (an ensemble: {', '.join(main['steps'])} around {main['name']})"
        ctx.progress(f"  {said}")
    elif monitored:  # the monitor step gets the drift profile the model version was just published with
        profile = Path(main["path"]) / "drift_profile.json"
        drift = profile.read_bytes() if profile.is_file() else None
        main.update(publish_monitor(ctx.options.repository, ctx.spec.name, main["version"], checked[0][3][0],
                                    ctx.spec.deploy, drift))
        main["served_as"] = ctx.spec.name
        said += (f"; served as '{ctx.spec.name}' (an ensemble: {main['name']}, then the monitor step "
                 f"{main['monitor']} version {main['version']}{'' if drift else '; ' + NO_DRIFT_PROFILE})")
        ctx.progress(f"  {said}")
    if main["backend"] == "python":
        ctx.progress(f"  note: {PYTHON_BACKEND_IMAGE}")
    ctx.published = published
    return StageResult.ok(STAGE, said, published=published, **({"warnings": warnings} if warnings else {}))


def _choose_padding(ctx: BuildContext, ragged: bool) -> None:
    """How the tokenizer step pads: to each call's longest text where the model step takes ragged batches (texts of
    any length batch there), else to length buckets only where batching pays the padding on this host."""
    pipeline = ctx.pipeline
    if ragged:
        pipeline.length_buckets, pipeline.buckets_why = [], "no length buckets: each call pads to its longest text"
    else:
        pipeline.length_buckets, pipeline.buckets_why = bucket_decision(
            pipeline.token_lengths, pipeline.length_buckets, (ctx.selected.benchmark or {}).get("throughput_by_batch"))
    for line in (f"model step: {pipeline.ragged_why}", f"tokenizer step: {pipeline.buckets_why}"):
        ctx.notes.append(line)
        ctx.progress(f"  {line}")


def ensemble_layout(ctx: BuildContext) -> bool:
    """deploy.monitor on a standard backend: the model is served behind an ensemble with a monitor step
    (builder/repository/monitored.py); the python backend's model.py monitors itself."""
    if ctx.pipeline is not None or ctx.user_steps is not None:  # pre/post-processing steps around the model
        return True
    return bool(ctx.spec.deploy.monitor) and backend_for(ctx.target, ctx.selected.format) != "python"


def _earlier_companions(ctx: BuildContext, publishing: set[str]) -> list[str]:
    """The ``<name>__<variant>`` models an earlier build published that this one does not replace: they go on
    serving that build's model (older weights, perhaps) beside this one, and nothing else says so."""

    root, name = Path(ctx.options.repository), ctx.spec.name
    stale = []
    # deploy.monitor's model folder and monitor step, a pipeline's steps: this build's own
    steps = set(monitored_names(name)) | set(pipeline_names(name))
    for folder in sorted(root.glob(f"{name}__*")) if root.is_dir() else []:
        if folder.name in steps:
            continue
        version = latest_version(folder) if (folder / "config.pbtxt").is_file() else None
        if folder.name not in publishing and version is not None:
            stale.append(f"{folder.name} (version {version}) is from an earlier build of {name}; this build does not "
                         f"replace it, so it goes on serving that build's model beside {name}: remove {folder} if "
                         "it should not")
    return stale
