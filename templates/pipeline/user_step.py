"""Triton python step written by triton-builder: YOUR pre- or post-processing function (spec preprocess /
postprocess), in an ensemble ``<name>`` over ``<name>__preprocess``, ``<name>__model`` and ``<name>__postprocess``.

It imports the module file named by the parameter ``module`` from this version folder (published from the
spec's folder) and calls ``function`` once per request with ``{input name: numpy array}`` (batch first;
strings as bytes objects), and sends back the arrays the config's outputs name. Whatever the function
raises is the request's error, with code INVALID_ARG (HTTP 400): a step that refuses an input says why.
Needs numpy and whatever the module imports (keep it to numpy and the standard library for the stock image).
"""

import importlib.util
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _invalid_argument(message):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def _wire(value, dtype):
    array = np.asarray(value)
    if dtype == np.object_:  # TYPE_STRING: bytes objects
        return np.array([v.encode("utf-8") if isinstance(v, str) else v for v in array.reshape(-1)],
                        dtype=np.object_).reshape(array.shape)
    return np.ascontiguousarray(array.astype(dtype))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        path = os.path.join(args["model_repository"], args["model_version"], params["module"])
        spec = importlib.util.spec_from_file_location("triton_builder_user_step_" + str(abs(hash(path))), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.function = getattr(module, params["function"])
        self.kind = params.get("kind", "step")
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            arrays = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            try:
                result = self.function(arrays)
                tensors = [pb_utils.Tensor(name, _wire(result[name], dtype)) for name, dtype in self.outputs]
            except Exception as exc:  # noqa: BLE001 - the user's function refused the input
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid_argument(
                    f"{self.kind} step: {type(exc).__name__}: {exc}")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
