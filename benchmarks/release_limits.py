"""What each Triton release's runtimes really load, measured, beside what builder/repository/triton_releases.py
says (a measurement script, not a test: it installs each runtime from PyPI into the gate's cached side
environments, ~30 s each the first time).

- onnxruntime X (the onnxruntime backend's version of a release, and the python-backend image's): tiny Identity
  models stamped with IR version 8..16 and ai.onnx opset 17..28 are opened with that onnxruntime; the newest IR
  (at opset 18) and the newest opset (at IR 8) that load are its limits.
- OpenVINO X (a release's openvino backend): one IR with a ReLU layer, re-stamped ``version="opsetN"`` for N in
  1..29, read with ``Core.read_model``; the newest N it reads is the newest operation set of its IR reader.

Prints the host line, then one table; a row whose measured value differs from the table's is marked.

Usage: python benchmarks/release_limits.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ORT_PROBE = r'''
import glob, json, re, sys, onnxruntime as ort
ok = {}
for f in glob.glob(sys.argv[1] + "/m_*.onnx"):
    ir, op = map(int, re.findall(r"\d+", f.rsplit("/", 1)[1]))
    try:
        ort.InferenceSession(f, providers=["CPUExecutionProvider"]); ok[(ir, op)] = True
    except Exception:
        ok[(ir, op)] = False
print(json.dumps({"max_ir": max(ir for (ir, op), g in ok.items() if g and op == 18),
                  "max_opset": max(op for (ir, op), g in ok.items() if g and ir == 8)}))
'''

OV_PROBE = r'''
import json, re, sys, openvino as ov
folder = sys.argv[1]; text = open(folder + "/relu.xml").read(); best = 0
for n in range(1, 30):
    open(folder + "/relu_n.xml", "w").write(re.sub(r'(type="ReLU" version=")opset\d+', rf"\g<1>opset{n}", text))
    open(folder + "/relu_n.bin", "wb").write(open(folder + "/relu.bin", "rb").read())
    try:
        ov.Core().read_model(folder + "/relu_n.xml"); best = n
    except Exception:
        pass
print(json.dumps({"max_opset": best}))
'''


def _onnx_models(folder: Path) -> None:
    from onnx import TensorProto, helper

    for ir in range(8, 17):
        for opset in range(17, 29):
            graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
            model.ir_version = ir
            (folder / f"m_ir{ir}_op{opset}.onnx").write_bytes(model.SerializeToString())


def _relu_ir(folder: Path) -> None:
    import numpy as np
    import openvino as ov
    import openvino.opset8 as ops

    x = ops.parameter([1, 4], np.float32, name="x")
    ov.save_model(ov.Model([ops.relu(x)], [x], "relu"), str(folder / "relu.xml"), compress_to_fp16=False)


def _probe(python: Path, script: str, folder: Path) -> dict:
    done = subprocess.run([str(python), "-c", script, str(folder)], capture_output=True, text=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from builder.core.host import host_profile
    from builder.repository.runtime_gate import side_python
    from builder.repository.triton_releases import (ONNXRUNTIME_LIMITS, OPENVINO_MAX_OPSET, PYTHON_BACKEND_ONNXRUNTIME,
                                                    RELEASES)

    host = host_profile(with_gpu=False)
    print(f"host: {host['cpu_model']}; ISA flags: {', '.join(host['isa_flags'])}; python {sys.version.split()[0]}")
    used_by = {}
    for r in RELEASES.values():
        used_by.setdefault(("onnxruntime", r.onnxruntime), []).append(r.release)
        used_by.setdefault(("openvino", r.openvino), []).append(r.release)
    for release, version in PYTHON_BACKEND_ONNXRUNTIME.items():
        used_by.setdefault(("onnxruntime", version), []).append(f"{release} python-backend image")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        _onnx_models(folder)
        _relu_ir(folder)
        for version, (ir, opset) in sorted(ONNXRUNTIME_LIMITS.items()):
            print(f"onnxruntime {version} ...", flush=True)
            got = _probe(side_python(version, print), ORT_PROBE, folder)
            rows.append((f"onnxruntime {version}", ", ".join(used_by.get(("onnxruntime", version), [])),
                         f"IR {ir}, opset {opset}", f"IR {got['max_ir']}, opset {got['max_opset']}",
                         "" if (got["max_ir"], got["max_opset"]) == (ir, opset) else "DIFFERS"))
        for version, opset in sorted(OPENVINO_MAX_OPSET.items()):
            print(f"openvino {version} ...", flush=True)
            got = _probe(side_python(version, print, package="openvino"), OV_PROBE, folder)
            rows.append((f"openvino {version}", ", ".join(used_by.get(("openvino", version), [])),
                         f"opset{opset}", f"opset{got['max_opset']}", "" if got["max_opset"] == opset else "DIFFERS"))
    head = ("runtime", "releases", "table says", "measured", "")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    print()
    for row in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    main()
