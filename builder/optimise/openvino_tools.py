"""OpenVINO in one place: ONNX -> IR, the in-process runner, NNCF post-training INT8, and no telemetry.

Usage::

    ir = to_ir(Path("model.onnx"), Path("work/openvino"))          # work/openvino/model.xml + model.bin
    run = openvino_runner(ir, ["logits"], threads=2)                # run({"image": x}) -> {"logits": y}
    nncf = import_nncf()                                            # telemetry off before NNCF loads

Settings every runner here uses (stage verify, stage benchmark, `select`, the peers benchmark and the
python backend's model.py use the same ones, so what is verified is what is measured and served):

- ``PERFORMANCE_HINT: LATENCY`` with ``INFERENCE_NUM_THREADS`` = the usable cores (builder/core/host.py):
  one synchronous request at a time; the THROUGHPUT hint wants several requests in flight and runs
  ~0.5x with one (docs/PLATFORM.md).
- the precision: on CPUs with bf16 (AVX-512 BF16, AMX) OpenVINO's CPU plugin runs FP32 models in
  bfloat16 by default (rel L2 ~3e-3 on digits). Triton's own openvino backend cannot change that (it
  knows only HINT_BF16=YES), so an IR for it (target cpu) runs at the plugin's default here too, and a
  build on such a CPU judges it at the fp16 tolerance, saying why. An IR for the python backend
  (target python) is marked (F32_MARK) and runs with ``INFERENCE_PRECISION_HINT: f32`` everywhere.

Telemetry: OpenVINO 2026.4 sends usage events through ``openvino_telemetry`` unless a consent file
(``~/intel/openvino_telemetry``, written by ``opt_in_out --opt_out``) says no or the process looks
like CI: ``import openvino`` itself (openvino/tools/ovc/__init__.py sends an "import" event),
``openvino.convert_model`` (ovc) and NNCF. Without a consent file they count as consent. The builder
(``import_openvino``) imports openvino with ``CI=true`` set for that import only - the
``disable_in_ci`` switch ovc's telemetry is created with, checked once when it is created, so it
stays off for the process; the variable is restored at once - converts with ``Core.read_model`` (the
ONNX frontend convert_model uses, without ovc's conversion session) and sets ``NNCF_CI`` before NNCF
is imported (NNCF then uses its telemetry stub; the variable does nothing else in NNCF 3.4). The
python backend's model.py imports openvino the same way. Nothing is sent and nothing is written to
``~/intel``; the user's own opt-in/out file is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from builder.core.host import usable_cores

NNCF_TELEMETRY_OFF = {"NNCF_CI": "1"}  # nncf/telemetry/wrapper.py: a stub instead of openvino_telemetry
IR_FILE = "model.xml"
LATENCY_CONFIG = {"PERFORMANCE_HINT": "LATENCY"}
# An IR the python backend's model.py serves carries this mark and runs in f32 everywhere (model.py, the
# builder's runner, the release replay). An unmarked IR runs at the CPU plugin's own default precision, as
# Triton's C++ openvino backend runs it (it has no setting that forces f32: on CPUs with bfloat16 - AVX-512
# BF16, AMX - the plugin computes an FP32 model in bf16), so what the build verifies is what Triton serves.
F32_MARK = ["triton_builder", "inference_precision"]


@contextlib.contextmanager
def _declined_as_ci():
    """``CI=true`` for the duration (openvino_telemetry declines for tools made with disable_in_ci)."""
    saved = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = saved


def import_openvino():
    """``import openvino`` with its usage telemetry declined (see the module's docstring)."""
    if "openvino" not in sys.modules:
        with _declined_as_ci():
            import openvino  # noqa: F401 - ovc's telemetry is created (declined) during this import
    return sys.modules["openvino"]


def disable_telemetry() -> None:
    """Make NNCF install its telemetry stub (call before ``import nncf``; import_nncf does)."""
    for key, value in NNCF_TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)


def import_nncf():
    import_openvino()  # first: NNCF imports openvino, whose telemetry must be created declined
    disable_telemetry()
    import nncf

    return nncf


def version() -> str:
    ov = import_openvino()

    return ov.__version__.split("-")[0]


def read_onnx(path: Path):
    """The ov.Model of an ONNX file (OpenVINO's ONNX frontend; external data beside it is read too)."""
    ov = import_openvino()

    return ov.Core().read_model(str(path))


def save_ir(model, folder: Path, f32: bool = False) -> Path:
    """Write ``model`` as IR (``model.xml`` + ``model.bin``) into ``folder``; weights stay FP32. ``f32``: mark
    it to run in f32 (F32_MARK: for the python backend's model.py), else it runs at the plugin's default."""
    ov = import_openvino()

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / IR_FILE
    if f32:
        model.set_rt_info("f32", F32_MARK)
    ov.save_model(model, str(target), compress_to_fp16=False)
    return target


def to_ir(onnx_path: Path, folder: Path, f32: bool = False) -> Path:
    return save_ir(read_onnx(onnx_path), folder, f32)


def marked_f32(model) -> bool:
    """Whether an ov.Model carries F32_MARK (made for the python backend: run in f32)."""
    return bool(model.has_rt_info(F32_MARK)) and model.get_rt_info(F32_MARK).astype(str) == "f32"


def cpu_plugin_problem() -> str | None:
    """Why OpenVINO's CPU plugin cannot run here (None when it runs): the OpenVINO variants are then skipped."""
    try:
        devices = import_openvino().Core().available_devices
    except Exception as exc:  # noqa: BLE001 - any failure to load the runtime is the reason
        return f"OpenVINO does not load here ({' '.join(str(exc).split())[:200]})"
    return None if "CPU" in devices else f"OpenVINO's CPU plugin does not run on this host (devices: {devices or 'none'})"


def plugin_precision() -> str:
    """The CPU plugin's default inference precision on this host ("f32", or "bf16" on CPUs with bfloat16):
    what Triton's openvino backend runs an FP32 IR in here."""
    ov = import_openvino()

    return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()


def ir_files(xml: Path) -> list[Path]:
    """The IR's files: model.xml first, then its weights (model.bin)."""
    return [xml, *([xml.with_suffix(".bin")] if xml.with_suffix(".bin").exists() else [])]


def float64_parts(onnx_path: Path) -> list[str]:
    """Where an ONNX graph holds float64 (inputs, outputs, weights, casts to it), [] when nowhere. The
    CPU plugin has no f64: it computes such a graph in f32, or refuses to compile it once NNCF has
    quantised it ("CPU plugin does not support f64")."""
    import onnx

    double = onnx.TensorProto.DOUBLE
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    parts = [f"{kind} {v.name}" for kind, values in (("input", graph.input), ("output", graph.output))
             for v in values if v.type.tensor_type.elem_type == double]
    weights = sum(1 for t in graph.initializer if t.data_type == double)
    casts = sum(1 for n in graph.node if n.op_type == "Cast" and any(a.name == "to" and a.i == double
                                                                     for a in n.attribute))
    parts += [f"{weights} float64 weight(s)"] * bool(weights) + [f"{casts} Cast(s) to float64"] * bool(casts)
    return parts


def compile_ir(path: Path, threads: int | None = None, hint: str = "LATENCY"):
    ov = import_openvino()


    core = ov.Core()
    model = core.read_model(str(path))
    config = {**LATENCY_CONFIG, "PERFORMANCE_HINT": hint, "INFERENCE_NUM_THREADS": int(threads or usable_cores()),
              **({"INFERENCE_PRECISION_HINT": "f32"} if marked_f32(model) else {})}
    return core.compile_model(model, "CPU", config)


def openvino_runner(path: Path, output_names: list[str], threads: int | None = None,
                    hint: str = "LATENCY") -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Run an IR (or an ONNX file) on the CPU plugin, one synchronous request at a time."""
    compiled = compile_ir(path, threads, hint)
    request = compiled.create_infer_request()
    feeds: dict[frozenset, list[tuple[int, str]]] = {}  # the given input names -> (port index, name)
    ports = {}
    for name in output_names:
        ports[name] = next((p for p in compiled.outputs if name in p.get_names()), None)
        if ports[name] is None:
            raise ValueError(f"{path.name} has no output '{name}' (it has "
                             f"{', '.join(sorted(n for p in compiled.outputs for n in p.get_names()))})")

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        given = frozenset(inputs)
        if given not in feeds:
            feeds[given] = input_feeds(compiled.inputs, given, path.name)
        result = request.infer({index: np.ascontiguousarray(inputs[name]) for index, name in feeds[given]},
                               share_inputs=True)
        return {name: result[port] for name, port in ports.items()}

    run.compiled = compiled  # type: ignore[attr-defined]
    return run


def input_feeds(ports, given, where: str) -> list[tuple[int, str]]:
    """Which of the ``given`` input names feeds each compiled input port, as (port index, name).

    A port carries every name its tensor has, and compile_model merges into it the output names of
    ops folded into the input (``ids.long()`` adds '_to_copy' or '/Cast_output_0'), so
    ``get_any_name()`` may be one no caller knows: the name is looked for in ``get_names()``. Only a
    single port that has none of the given names, with a single given name left, is paired by
    elimination: any other pairing would be a guess."""
    pairs: dict[int, str] = {}
    for index, port in enumerate(ports):
        names = port.get_names()
        matches = sorted(name for name in given if name in names)
        if len(matches) > 1:
            raise ValueError(f"{where}: input port {index} answers to {', '.join(matches)}: give only one of them")
        if matches:
            pairs[index] = matches[0]
    unmatched = [index for index in range(len(ports)) if index not in pairs]
    unused = sorted(set(given) - set(pairs.values()))
    if len(unmatched) == 1 and len(unused) == 1:
        pairs[unmatched[0]] = unused[0]
    elif unmatched:
        names = "; ".join(", ".join(sorted(ports[i].get_names())) for i in unmatched)
        raise ValueError(f"{where}: no input given for the port(s) named {names} (given: "
                         f"{', '.join(sorted(given)) or 'none'}); feed them under the spec's input names")
    return sorted(pairs.items())


_OPSET = re.compile(r'<layer\b[^>]*\bversion="opset(\d+)"')


def ir_opsets(xml: Path) -> list[int]:
    """The OpenVINO opset numbers the IR's layers use (``version="opsetN"``), sorted."""
    return sorted({int(m) for m in _OPSET.findall(Path(xml).read_text(errors="replace"))})


def count_ops(xml: Path, op_type: str) -> int:
    """How many layers of ``op_type`` (e.g. FakeQuantize) the IR holds."""
    return len(re.findall(rf'<layer\b[^>]*\btype="{re.escape(op_type)}"', Path(xml).read_text(errors="replace")))


def ir_version(xml: Path) -> int | None:
    found = re.search(r'<net\b[^>]*\bversion="(\d+)"', Path(xml).read_text(errors="replace")[:4000])
    return int(found.group(1)) if found else None
