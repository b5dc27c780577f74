"""Replay reference.npz through an OpenVINO IR with ANOTHER OpenVINO: run by that release's side virtualenv
(builder/repository/runtime_gate.py), so it imports only the standard library, numpy and openvino - nothing
of triton-builder.

    python ov_replay.py MODEL.xml reference.npz OUT.npz '["in0", ...]' '["out0", ...]'

Writes OUT.npz with ``{case}/{output}`` arrays (the case keys of reference.npz), and prints one JSON line:
{"openvino": version, "cases": n} or {"openvino": version, "load_error": text} (exit 0 either way; any other
exit is a broken side environment). reference.npz is read with allow_pickle=False.
"""

import json
import sys


def _port_for(ports, name, given):
    """The compiled port that carries ``name`` (a port answers to every name its tensor has); a single port
    left with a single name left is paired by elimination."""
    for index, port in enumerate(ports):
        if name in port.get_names():
            return index
    if len(ports) == 1 and len(given) == 1:
        return 0
    raise KeyError(f"no port named '{name}' (ports: {[sorted(p.get_names()) for p in ports]})")


def main(model, reference, out, input_names, output_names):
    import numpy as np
    import openvino as ov

    version = ov.get_version()
    try:
        core = ov.Core()
        ir = core.read_model(model)
        mark = ["triton_builder", "inference_precision"]  # builder/optimise/openvino_tools.py F32_MARK: f32 only where marked
        try:
            f32 = ir.has_rt_info(mark) and ir.get_rt_info(mark).astype(str) == "f32"
        except (AttributeError, TypeError, RuntimeError):  # an older OpenVINO's rt_info API: not marked
            f32 = False
        compiled = core.compile_model(ir, "CPU", {"INFERENCE_NUM_THREADS": 1,
                                                  **({"INFERENCE_PRECISION_HINT": "f32"} if f32 else {})})
        inputs = {name: _port_for(compiled.inputs, name, input_names) for name in input_names}
        outputs = {name: compiled.outputs[_port_for(compiled.outputs, name, output_names)] for name in output_names}
    except Exception as err:  # noqa: BLE001 - the point: what this release says about the model
        print(json.dumps({"openvino": version, "load_error": str(err)}))
        return
    request = compiled.create_infer_request()
    results = {}
    with np.load(reference, allow_pickle=False) as archive:
        cases = sorted({key.split("/")[1] for key in archive.files if key.startswith("input/")})
        for case in cases:
            try:
                answer = request.infer({inputs[name]: np.ascontiguousarray(archive[f"input/{case}/{name}"])
                                        for name in input_names})
            except Exception as err:  # noqa: BLE001
                print(json.dumps({"openvino": version, "load_error": f"running case {case}: {err}"}))
                return
            for name, port in outputs.items():
                results[f"{case}/{name}"] = np.asarray(answer[port])
    np.savez(out, **results)
    print(json.dumps({"openvino": version, "cases": len(cases)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5]))
