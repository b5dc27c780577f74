"""Replay reference.npz through a model with ANOTHER onnxruntime: run by that runtime's side virtualenv
(builder/repository/runtime_gate.py), so it imports only the standard library, numpy and onnxruntime
- nothing of triton-builder.

    python ort_replay.py MODEL.onnx reference.npz OUT.npz '["in0", ...]' '["out0", ...]'

Writes OUT.npz with ``{case}/{output}`` arrays (the case keys of reference.npz), and prints one JSON line:
{"onnxruntime": version, "cases": n} or {"onnxruntime": version, "load_error": text} (exit 0 either way;
any other exit is a broken side environment). reference.npz is read with allow_pickle=False.
"""

import json
import sys


def ragged_feed(session, feed):
    """A ragged graph (builder/huggingface/ragged.py) takes its token inputs flat and each row's width: the case's
    [rows, width] inputs as Triton's onnxruntime backend would hand them over ({} for any other graph)."""
    import numpy as np

    declared = {i.name: i.shape for i in session.get_inputs()}
    if "ragged_item_shape" not in declared:
        return {}
    names = [n for n, shape in declared.items() if n in feed and len(shape) == 1]
    rows, width = feed[names[0]].shape[:2]
    return {**{n: feed[n].reshape(-1) for n in names},
            "ragged_item_shape": np.full((rows, 1), width, dtype=np.int32)}


def main(model, reference, out, input_names, output_names):
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - the point: what this release says about the model
        print(json.dumps({"onnxruntime": ort.__version__, "load_error": str(err)}))
        return
    results = {}
    with np.load(reference, allow_pickle=False) as archive:
        cases = sorted({key.split("/")[1] for key in archive.files if key.startswith("input/")})
        for case in cases:
            feed = {name: archive[f"input/{case}/{name}"] for name in input_names}
            feed.update(ragged_feed(session, feed))
            try:
                outputs = session.run(list(output_names), feed)
            except Exception as err:  # noqa: BLE001
                print(json.dumps({"onnxruntime": ort.__version__, "load_error": f"running case {case}: {err}"}))
                return
            for name, value in zip(output_names, outputs):
                results[f"{case}/{name}"] = value
    np.savez(out, **results)
    print(json.dumps({"onnxruntime": ort.__version__, "cases": len(cases)}))

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5]))
