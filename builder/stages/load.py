"""Stage `load`: import the model (module + weights, TorchScript or ONNX file), read the data,
check the spec against the model, and compute the reference outputs every variant is held to."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builder.accuracy.data_checks import (CHECK_BATCHES, calibration_warning, check_label_array, check_labels,
                                          run_on_data, spec_input)
from builder.accuracy.input_rules import from_data, rule_for, rule_lines
from builder.accuracy.tensors import (build_cases, default_batch_sizes, default_dynamic_sizes, generated_inputs,
                                      run_batched, trace_example)
from builder.core.errors import UserInputError
from builder.core.files import sha256_file
from builder.huggingface.source import load_source
from builder.model.runtime import open_runner, torch_runner
from builder.model.source import (check_batch_independent, check_deterministic, check_onnx_external_data,
                                  forward_parameters, import_factory, load_weights)
from builder.model.user_steps import UserSteps, read_raw
from builder.repository.config import render_config
from builder.repository.interface import interface_change
from builder.repository.publish import config_for
from builder.repository.runtime_gate import limit_failures
from builder.repository.triton_releases import onnx_runtime_for, triton_release
from builder.spec.model import TRITON_DTYPES
from builder.stages.base import BuildContext, Reference, StageResult

STAGE = "load"


def run(ctx: BuildContext) -> StageResult:
    spec = ctx.spec
    source = spec.source
    if source.kind == "module":
        ctx.model, files = import_factory(source.value, spec.spec_dir, _origin(ctx))
        for file in files:  # provenance: the code the version was built from, as the weights below
            ctx.source_hashes[_source_name(file, spec.spec_dir)] = sha256_file(file)
        if source.weights is not None:
            load_weights(ctx.model, source.weights)
            ctx.source_hashes[_source_name(source.weights, spec.spec_dir)] = sha256_file(source.weights)
        _check_inputs_against_forward(ctx, ctx.model)
        runner = torch_runner(ctx.model, [o.name for o in spec.outputs], [t.name for t in spec.inputs])
        ctx.reference_kind = "pytorch eager"
    elif source.kind == "torchscript":
        import torch
        try:
            ctx.model = torch.jit.load(str(source.path), map_location="cpu").eval()
        except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad archive
            raise UserInputError(f"source.torchscript: {source.path} is not a TorchScript archive "
                                 f"({str(exc).splitlines()[0]}); save it with torch.jit.save") from None
        _check_inputs_against_forward(ctx, ctx.model)
        runner = torch_runner(ctx.model, [o.name for o in spec.outputs], [t.name for t in spec.inputs])
        ctx.reference_kind = "torchscript (source file)"
        ctx.source_hashes[source.path.name] = sha256_file(source.path)
    elif source.kind == "huggingface":  # the model step of a text pipeline; its texts tokenized as served
        loaded = load_source(source.folder, spec.data.validation, ctx.workdir)
        ctx.model, ctx.pipeline = loaded.module, loaded.pipeline
        for file in source.folder.files:
            ctx.source_hashes[file.name] = sha256_file(file)
        runner = torch_runner(ctx.model, [o.name for o in spec.outputs], [t.name for t in spec.inputs])
        ctx.reference_kind = "pytorch eager (transformers, from the folder)"
        ctx.notes.append(f"pipeline reference: {loaded.texts_from}")
    else:
        _check_onnx_against_spec(ctx)
        runner = open_runner("onnx", source.path, [o.name for o in spec.outputs])
        ctx.reference_kind = "onnxruntime (source ONNX; no PyTorch model given)"
        ctx.source_hashes[source.path.name] = sha256_file(source.path)

    if spec.data.validation and "labels" in (t.name for t in spec.inputs):
        raise UserInputError(f"{_origin(ctx)}: field 'inputs': an input is named 'labels', the key data.validation "
                             "keeps for the class ids that top-1 accuracy is scored on; rename the input (inputs are "
                             "passed to forward() by position: only the spec and the data files' key change)")
    validation = (_read_npz(spec.data.validation, "data.validation", ctx)
                  if spec.data.validation and source.kind != "huggingface" and spec.preprocess is None else None)
    if source.kind == "huggingface":
        validation = loaded.validation
    steps, raw = UserSteps.load(spec), None  # your own steps: the model's data is the preprocessed raw data
    if spec.preprocess is not None:
        raw = read_raw(spec.data.validation, spec.preprocess)
        validation = steps.preprocess(raw, spec.inputs)
    calibration = _read_npz(spec.data.calibration, "data.calibration", ctx) if spec.data.calibration else None
    from_data(spec.inputs, [(field, data) for field, data in (("data.validation", validation),
                                                              ("data.calibration", calibration)) if data is not None])
    probed = _probe_id_ranges(runner, ctx)  # generated inputs are used with data too (trace example, dynamic sizes)
    example = trace_example(spec)
    outputs = _call_checked(runner, example, ctx)
    if len(outputs) != len(spec.outputs):
        raise UserInputError(
            f"{_origin(ctx)}: field 'outputs': the spec lists {len(spec.outputs)} output(s) "
            f"({', '.join(o.name for o in spec.outputs)}) but the model returns {len(outputs)}; list one name per output"
        )
    for name, array in outputs.items():  # complex64, bfloat16 (as numpy sees it), strings: no Triton type
        if str(array.dtype) not in TRITON_DTYPES:
            raise UserInputError(f"{_origin(ctx)}: field 'outputs': '{name}' is {array.dtype} from the model, which "
                                 f"Triton cannot serve (types: {', '.join(TRITON_DTYPES)}); return it as one of them "
                                 "(complex: torch.view_as_real(x) -> a last axis of 2; bfloat16: .float())")
    # the model runs on generated inputs (above): a failure on the user's data is the data's, said now
    val_inputs = val_outputs = top1 = None
    if validation is not None:
        val_inputs = {t.name: validation[t.name] for t in spec.inputs}
        val_outputs = run_on_data(runner, val_inputs, "data.validation", spec.data.validation, spec)
    if calibration is not None:
        _check_calibration(runner, calibration, ctx)

    cases = build_cases(spec, validation)
    # the builder's own picks (an odd in-between size, dynamic dims at opposite ends) stay only where
    # the model runs: it may take only even sizes, or need two dims equal
    dropped = [c["id"] for c in cases if c.pop("optional", False) and not _runs(runner, c["inputs"])]
    cases = [c for c in cases if c["id"] not in dropped]
    if dropped:
        text = (f"not verified at {', '.join(dropped)}: the model itself does not run there (sizes between min_shape "
                "and max_shape it refuses, or dynamic dims it needs equal); give verify.dynamic_sizes to choose sizes")
        ctx.progress(f"  note: {text}")
        ctx.notes.append(text)
    reference_outputs = [_call_checked(runner, case["inputs"], ctx) for case in cases]
    # one more run of the first case: a random forward() would otherwise fail every variant at rel L2 ~1
    check_deterministic(reference_outputs[0], _call_checked(runner, cases[0]["inputs"], ctx), _origin(ctx), source.kind)
    _check_batch_dimension(ctx, cases, reference_outputs)
    if spec.batching:  # the widest case's samples run alone too: an answer must not depend on its batch-mates
        widest = max(range(len(cases)), key=lambda i: len(next(iter(cases[i]["inputs"].values()))))
        check_batch_independent(runner, cases[widest]["inputs"], reference_outputs[widest], _origin(ctx))
    if validation is not None and val_outputs is None:  # batches whose outputs did not concatenate: say how
        val_outputs = run_batched(runner, val_inputs, spec.max_batch_size)
    if validation is not None and "labels" in validation:
        top1 = check_labels(ctx, spec.data.validation, validation["labels"], val_outputs)
    ctx.reference = Reference(cases=cases, outputs=reference_outputs)
    if steps is not None:
        steps.record(raw if raw is not None else (val_inputs or cases[0]["inputs"]),
                     val_outputs if val_outputs is not None else reference_outputs[0])
        ctx.user_steps = steps
    _infer_output_signature(ctx, reference_outputs + _signature_samples(runner, ctx))
    _check_repository_interface(ctx)

    if validation is not None:
        ctx.reference.validation_inputs, ctx.reference.validation_outputs = val_inputs, val_outputs
        if top1 is not None:  # labels no output scores are dropped (check_labels said so)
            ctx.reference.labels, ctx.reference.top1_output = validation["labels"], top1

    note = "; ".join(f"generated {k} in [{lo}, {hi}) (probed: the model rejects larger ids)" for k, (lo, hi) in probed.items())
    rules = rule_lines(spec.inputs)  # which rule made each input's generated values: the build report says it
    ctx.progress("  generated inputs: " + "; ".join(f"{name}: {rule}" for name, rule in rules.items()))
    return StageResult.ok(STAGE, note, reference=ctx.reference_kind, cases=[c["id"] for c in cases], id_ranges=probed,
                          generated_inputs=rules,
                          validation_samples=None if validation is None else len(next(iter(validation.values()))))


def _source_name(file: Path, folder: Path) -> str:
    """A source file's name in metadata.yaml: relative to the spec's folder where it lies there."""
    try:
        return file.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(file)


def _check_calibration(runner, calibration: dict[str, np.ndarray], ctx: BuildContext) -> None:
    """The calibrators (onnxruntime, NNCF, TensorRT) run the data without a word when it is invalid, or
    fail in their own terms: run the model on the first batches here; warn when there are too few."""
    spec, path = ctx.spec, ctx.spec.data.calibration
    inputs = {t.name: calibration[t.name] for t in spec.inputs}
    limit = min(spec.quantization.calibration_samples, CHECK_BATCHES * spec.max_batch_size) if spec.batching else None
    run_on_data(runner, inputs, "data.calibration", path, spec, limit=limit)
    warning = calibration_warning(spec, path, len(next(iter(inputs.values())))) if spec.batching else ""
    if warning:
        ctx.progress(f"  warning: {warning}")
        ctx.notes.append(f"warning: {warning}")


def _check_repository_interface(ctx: BuildContext) -> None:
    """A model folder's versions share one config.pbtxt: where the spec's version_policy would serve older
    versions built for another interface, refuse now rather than after export and verification (stage
    publish checks again, with the chosen variant's backend, and warns under latest)."""

    signature = ctx.reference.output_signature()
    try:
        text = render_config(config_for(ctx.spec, "onnx", ctx.target, ctx.spec.name, signature))
    except Exception:  # noqa: BLE001 - outputs the later stages refuse with their own reason (empty in every case)
        return
    interface_change(ctx.options.repository, ctx.spec.name, text, compare_backend=False)


def _origin(ctx: BuildContext) -> str:
    return ctx.spec.spec_path.name if ctx.spec.spec_path else "spec"


def _with_origin(ctx: BuildContext, exc: UserInputError) -> UserInputError:
    text = str(exc)
    return exc if text.startswith(_origin(ctx)) else UserInputError(f"{_origin(ctx)}: {text}")




def _check_inputs_against_forward(ctx: BuildContext, model) -> None:
    """Inputs reach forward() by position, in the spec's order (the exporters number a graph's inputs
    the same way). A spec naming forward()'s parameters in another order would feed each input to
    another parameter and still build: refused, as are more inputs than forward() takes and fewer than
    it requires. Names that are not forward()'s own (an input 'image' for forward(self, x)) are fine."""
    found = forward_parameters(model)
    if found is None:
        return
    params, required, varargs = found
    names = [t.name for t in ctx.spec.inputs]
    takes = f"{type(model).__name__}.forward({', '.join(params)}{', *args' if varargs else ''})"
    if len(names) > len(params) and not varargs:
        raise UserInputError(
            f"{_origin(ctx)}: field 'inputs': the spec lists {len(names)} inputs ({', '.join(names)}) but "
            f"{takes} takes {len(params)}; list one input per forward() argument, in its order")
    if len(names) < required:
        raise UserInputError(
            f"{_origin(ctx)}: field 'inputs': the spec lists {len(names)} input(s) ({', '.join(names)}) but "
            f"{takes} requires {required} ({', '.join(params[:required])}); list one input per forward() "
            "argument, in its order")
    for position, name in enumerate(names):
        if name in params and params.index(name) != position:
            order = ", ".join(params[:max(len(names), params.index(name) + 1)])
            raise UserInputError(
                f"{_origin(ctx)}: field 'inputs': '{name}' is argument {params.index(name) + 1} of {takes} but "
                f"input {position + 1} of the spec; inputs are passed to forward() by position, so list them in "
                f"its order ({order}) - a spec in another order would feed each input to another argument")


def _read_npz(path: Path, field: str, ctx: BuildContext) -> dict[str, np.ndarray]:
    import zipfile
    if not zipfile.is_zipfile(path):  # np.load would take any other file for a pickle and blame its "objects"
        raise UserInputError(f"{field}: {path} is not an .npz archive; save one array per input, keyed by its "
                             "name, with np.savez(path, **arrays)")
    key = None
    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {}
            for key in archive.files:
                data[key] = archive[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise UserInputError(f"{field}: {path.name}['{key}'] holds Python objects (dtype=object), which are never "
                                 "unpickled; save numeric arrays (np.savez with arrays of numbers)") from None
        raise UserInputError(f"{field}: {path} is not a readable .npz of arrays ({exc})") from None
    except Exception as exc:  # noqa: BLE001
        raise UserInputError(f"{field}: {path} is not a readable .npz of arrays ({exc})") from None
    counts = set()
    for tensor in ctx.spec.inputs:
        if tensor.name not in data:
            raise UserInputError(f"{field}: {path.name} has no array '{tensor.name}' (it has: "
                                 f"{', '.join(data) or 'nothing'}); key each input by its name")
        array = data[tensor.name]
        data[tensor.name] = spec_input(field, path.name, tensor, array, ctx.spec.batching)
        counts.add(len(array))
    if ctx.spec.batching and len(counts) > 1:
        raise UserInputError(f"{field}: {path.name}: inputs have different sample counts {sorted(counts)}")
    if ctx.spec.batching and counts == {0}:
        raise UserInputError(f"{field} has 0 samples ({path.name}: every array's first dimension is 0); give at "
                             "least one sample per input")
    if field == "data.validation" and "labels" in data:
        check_label_array(path, data["labels"], counts.pop() if ctx.spec.batching else None)
    return data


def _probe_id_ranges(runner, ctx: BuildContext) -> dict[str, list[int]]:
    """Integer inputs with neither value_range nor data get ids in [0, 100) by default; a model with a
    smaller vocabulary rejects those. Halve the range until the model accepts several generated batches,
    record it on the spec (so every later stage and the metadata use it) and say which was used."""
    ids = [t for t in ctx.spec.inputs if (rule_for(t).kind, rule_for(t).source) == ("range", "default")]
    if not ids:
        return {}
    problem = _rejection(runner, ctx)
    if problem is None:
        return {}
    high = 100
    while high > 1:
        high //= 2
        for tensor in ids:
            tensor.value_range, tensor.rule_source = (0, high), "probed: the model rejects larger ids"
        if _rejection(runner, ctx) is None:
            names = ", ".join(t.name for t in ids)
            ctx.progress(f"  inputs {names}: no value_range and no data; the model rejects ids in [0, 100), "
                         f"accepts [0, {high}): generated inputs use that (set inputs[].value_range to choose)")
            return {t.name: [0, high] for t in ids}
    for tensor in ids:
        tensor.value_range = tensor.rule_source = None
    names = ", ".join(t.name for t in ids)
    raise UserInputError(
        f"{_origin(ctx)}: field 'inputs': the model rejected every generated value of the integer input(s) {names} "
        f"(ids in [0, 100), then [0, 50) ... down to [0, 1)): {problem}. Give inputs[].value_range with the ids "
        "the model accepts (e.g. [0, vocabulary size)), or real inputs in data.validation; if the ids are not the "
        "problem, fix inputs[].shape / dtype (per-sample shape, no batch dimension)")


def _rejection(runner, ctx: BuildContext) -> str | None:
    """None when the model runs on several generated batches, else its error (one line)."""
    rng = np.random.default_rng(7)
    batch = min(4, ctx.spec.max_batch_size) if ctx.spec.batching else None
    try:
        for _ in range(3):
            runner(generated_inputs(ctx.spec, batch, "opt" if ctx.spec.has_dynamic_dims else 0, rng))
    except UserInputError as exc:  # the spec's own mistake (its outputs), not the ids
        raise _with_origin(ctx, exc) from None
    except Exception as exc:  # noqa: BLE001 - any rejection: try a smaller range
        return " ".join(str(exc).split())[:300] or type(exc).__name__
    return None


def _call_checked(runner, inputs: dict[str, np.ndarray], ctx: BuildContext) -> dict[str, np.ndarray]:
    try:
        outputs = runner(inputs)
    except UserInputError as exc:
        raise _with_origin(ctx, exc) from None
    except Exception as exc:  # noqa: BLE001 - any failure here means the spec's shapes are wrong
        shapes = ", ".join(f"{k}{list(v.shape)} {v.dtype}" for k, v in inputs.items())
        detail = " ".join(str(exc).split())[:400]
        raise UserInputError(
            f"{_origin(ctx)}: field 'inputs': the model rejected inputs built from the spec ({shapes}): {detail}. "
            + (_narrower_fix(runner, inputs, ctx) or
               "Fix inputs[].shape / dtype (per-sample shape, no batch dimension) to match the model"
               + ("; for integer ids, inputs[].value_range (or real inputs in data.validation)"
                  if any(np.issubdtype(v.dtype, np.integer) for v in inputs.values()) else ""))
        ) from None
    return outputs


def _narrower_fix(runner, inputs: dict[str, np.ndarray], ctx: BuildContext) -> str | None:
    """When the model runs on one sample, or at the opt size, but not on what the builder chose (a
    batch > 1, a dynamic size between min and max), that choice is the fix - not inputs[].shape."""
    spec = ctx.spec
    batch = len(next(iter(inputs.values()))) if spec.batching else None
    if batch and batch > 1 and _runs(runner, {k: v[:1] for k, v in inputs.items()}):
        return (f"It runs on 1 sample but not on a batch of {batch}: if forward() takes one sample at a time, set "
                "max_batch_size: 1 (or 0, with no batch dimension in inputs[].shape); else make it take any batch")
    if not spec.has_dynamic_dims:
        return None
    opt = generated_inputs(spec, batch, "opt", np.random.default_rng(0))
    if any(opt[k].shape != v.shape for k, v in inputs.items()) and _runs(runner, opt):
        return ("It runs at the opt_shape sizes (" + ", ".join(f"{k}{list(v.shape)}" for k, v in opt.items())
                + ") but not at these, which the builder picked between min_shape and max_shape to test the dynamic "
                "dims: if only some sizes are valid (e.g. even, or multiples of 8), list the sizes to test in "
                "verify.dynamic_sizes")
    return None


def _runs(runner, inputs: dict[str, np.ndarray]) -> bool:
    try:
        runner(inputs)
    except Exception:  # noqa: BLE001 - only whether it runs matters here
        return False
    return True


def _check_batch_dimension(ctx: BuildContext, cases: list[dict], outputs: list[dict[str, np.ndarray]]) -> None:
    """With max_batch_size > 0 Triton splits a batched answer along its first dimension: every output
    must have one entry per sample there. A model that returns, say, the detections of the whole batch
    concatenated ([rows, 4]) would be served split at the wrong places: refused, naming the fix."""
    if not ctx.spec.batching:
        return
    for case, produced in zip(cases, outputs):
        batch = len(next(iter(case["inputs"].values())))
        for name, array in produced.items():
            rows = array.shape[0] if array.ndim else None
            if rows != batch:
                got = f"{rows} rows" if rows is not None else "a single value (0-d)"
                raise UserInputError(
                    f"{_origin(ctx)}: field 'max_batch_size': output '{name}' has {got} for a batch of {batch} "
                    f"(case {case['id']}, shape {list(array.shape)}); with max_batch_size > 0 the first dimension "
                    "of every output must be the batch (one entry per sample: Triton splits answers along it). "
                    "If its length depends on the data (e.g. detections above a score threshold), set "
                    "max_batch_size: 0 (no batch dimension, one input per request) or pad each sample's output "
                    "to a fixed count ([batch, N, ...] plus a count output)")


def _signature_samples(runner, ctx: BuildContext, count: int = 12) -> list[dict[str, np.ndarray]]:
    """Outputs of more generated inputs than the verification cases (different seeds, every batch and
    dynamic size), so an output whose length depends on the data (detections above a threshold) is
    seen to vary: its dims come from many runs, never from one. The export stages also mark dims the
    exported graph leaves symbolic."""
    rng = np.random.default_rng(2024)
    sizes = [(b, d) for d in default_dynamic_sizes(ctx.spec) for b in default_batch_sizes(ctx.spec)]
    outputs = []
    for i in range(count):
        batch, dyn = sizes[i % len(sizes)]
        inputs = generated_inputs(ctx.spec, batch if ctx.spec.batching else None, dyn, rng)
        try:
            outputs.append(runner(inputs))
        except Exception:  # noqa: BLE001 - the reference cases already ran; these only refine the dims
            continue
    return outputs


def _infer_output_signature(ctx: BuildContext, samples: list[dict[str, np.ndarray]]) -> None:
    """Output dtypes and per-sample dims from many reference runs; a dim that varies across them is -1."""
    ref = ctx.reference
    batching = ctx.spec.batching
    for spec_out in ctx.spec.outputs:
        arrays = [case[spec_out.name] for case in samples]
        dims = [list(a.shape[1:] if batching else a.shape) for a in arrays]
        shape = [d if all(len(x) == len(dims[0]) and x[i] == d for x in dims) else -1 for i, d in enumerate(dims[0])]
        dtype = str(arrays[0].dtype)
        if spec_out.dtype and spec_out.dtype != dtype:
            raise UserInputError(f"{_origin(ctx)}: field 'outputs': '{spec_out.name}' is {dtype} from the model, "
                                 f"the spec says {spec_out.dtype}")
        if spec_out.shape and (len(spec_out.shape) != len(shape) or any(
                s != -1 and s != d for s, d in zip(spec_out.shape, shape))):
            raise UserInputError(f"{_origin(ctx)}: field 'outputs': '{spec_out.name}' has per-sample shape {shape}, "
                                 f"the spec says {spec_out.shape}")
        ref.output_dtypes[spec_out.name] = dtype
        ref.output_shapes[spec_out.name] = spec_out.shape or shape


def _check_onnx_release(ctx: BuildContext, path: Path) -> None:
    """The user's ONNX file beyond what the build's Triton release loads is the user's to convert: refused
    now (exit 2), not as every variant failing verification."""

    backend = "python" if ctx.target == "python" else "onnxruntime"
    failures = limit_failures(path, onnx_runtime_for(triton_release(ctx.options.triton_release), backend), given=True)
    if failures:
        raise UserInputError("source.onnx: the file is newer than the Triton release this build targets loads "
                             "(--triton-release):\n" + "\n".join(f"- {line}" for line in failures))


def _check_onnx_against_spec(ctx: BuildContext) -> None:
    import onnx

    path = ctx.spec.source.path
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001
        raise UserInputError(f"source.onnx: {path} is not an ONNX model ({exc})") from None
    for data in check_onnx_external_data(model, path):  # what it was built from: the weights too
        ctx.source_hashes[data.relative_to(path.parent.resolve()).as_posix()] = sha256_file(data)
    _check_onnx_release(ctx, path)
    init_names = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in init_names]
    by_name = {i.name: i for i in graph_inputs}
    for tensor in ctx.spec.inputs:
        if tensor.name not in by_name:
            raise UserInputError(f"{_origin(ctx)}: field 'inputs': '{tensor.name}' is not an input of {path.name} "
                                 f"(its inputs: {', '.join(by_name)})")
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in by_name[tensor.name].type.tensor_type.shape.dim]
        if ctx.spec.batching and dims and dims[0] != -1:
            raise UserInputError(
                f"{_origin(ctx)}: field 'max_batch_size': input '{tensor.name}' of {path.name} has a fixed first "
                f"dimension {dims[0]} (dims {dims}), so requests cannot be batched along it; re-export the model "
                "with a dynamic batch axis (torch.onnx.export(..., dynamic_axes={'" + tensor.name + "': {0: 'batch'}}) "
                "or dynamic_shapes with dynamo), or set max_batch_size: 0 and give inputs[].shape with that "
                f"dimension ({dims}): one request per call")
        per_sample = dims[1:] if ctx.spec.batching else dims
        elem = onnx.helper.tensor_dtype_to_np_dtype(by_name[tensor.name].type.tensor_type.elem_type)
        if str(elem) != tensor.dtype:
            raise UserInputError(f"{_origin(ctx)}: field 'inputs': '{tensor.name}' is {elem} in {path.name}, "
                                 f"the spec says {tensor.dtype}")
        if len(per_sample) != len(tensor.shape) or any(g != -1 and s != -1 and g != s
                                                       for g, s in zip(per_sample, tensor.shape)):
            raise UserInputError(f"{_origin(ctx)}: field 'inputs': '{tensor.name}' has per-sample dims {per_sample} "
                                 f"in {path.name}, the spec says {tensor.shape}")
    outputs = [o.name for o in model.graph.output]
    missing = [o.name for o in ctx.spec.outputs if o.name not in outputs]
    if missing:
        raise UserInputError(f"{_origin(ctx)}: field 'outputs': {', '.join(missing)} not in {path.name} "
                             f"(its outputs: {', '.join(outputs)})")
