"""Triton python-backend MONITOR step written by triton-builder (deploy.monitor: true).

A model served by one of Triton's standard backends (onnxruntime_onnx, pytorch_libtorch, openvino,
tensorrt_plan) has no Python in its data path, so it cannot count NaN/Inf inputs or feed drift gauges
itself. With deploy.monitor the build publishes three ordinary Triton models instead of one:

  <name>/           platform "ensemble", the name clients call: runs <name>__model, then this step
  <name>__model/    the standard folder and its versions, exactly as it would be served alone
  <name>__monitor/  this step: it receives the request's inputs and the model's outputs (named
                    ``<output>__model``), counts (or, non_finite_inputs: reject, refuses) requests with
                    NaN/Inf inputs, feeds a sample to the drift window, and hands the outputs on unchanged

It needs numpy only, which the stock NGC image's python backend has: no derived image. Its version
folder holds this model.py, served_model.py (triton-builder's python-backend model, imported here only
for its monitoring classes: one implementation of the counters and the drift window), drift.py and
drift_profile.json (without those two, drift is off and only the counters run).

Parameters (config.pbtxt): monitored_model (the model name the metrics carry), non_finite_inputs
(count | reject), drift, drift_window, drift_sample_every, drift_publish_every, drift_observe_rows - as
in templates/python_backend/model.py.
"""

import hashlib
import importlib.util
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

#: the monitor's input for model output X is named X + PASSED_SUFFIX (builder/repository/monitored.py)
PASSED_SUFFIX = "__model"


def _served_model_module(folder):
    """served_model.py of this version folder as a module of its own (never one of another model's)."""
    path = os.path.join(folder, "served_model.py")
    name = "triton_builder_monitor_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        hooks = _served_model_module(folder)
        self.model_name = params.get("monitored_model") or args["model_name"]
        self.version = args["model_version"]
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]]
        passed = {name + PASSED_SUFFIX for name, _ in self.outputs}
        self.inputs = [(i["name"], pb_utils.triton_string_to_numpy(i["data_type"])) for i in config["input"]
                       if i["name"] not in passed]
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group") or [{}])
        self.drift = hooks._DriftHook.create(folder, self.model_name, self.version, params, self.batching, instances)
        self.errors = hooks._ErrorCounter(self.model_name, self.version)
        self.non_finite = hooks._NonFiniteGuard(self.model_name, self.version, params.get("non_finite_inputs", "count"),
                                                [name for name, dtype in self.inputs if np.issubdtype(dtype, np.floating)])
        self._invalid_argument = hooks._invalid_argument

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name, _ in self.inputs}
            problem = self.non_finite.check(feeds)
            if problem:
                self.errors.count("refused")
                responses.append(pb_utils.InferenceResponse(output_tensors=[],
                                                            error=self._invalid_argument(str(problem))))
                continue
            outputs = {name: pb_utils.get_input_tensor_by_name(request, name + PASSED_SUFFIX).as_numpy()
                       for name, _ in self.outputs}
            if self.drift is not None:
                self.drift.observe(feeds, outputs)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, outputs[name]) for name, _ in self.outputs]))
        return responses

    def finalize(self):
        if self.drift is not None:
            self.drift.close()
        self.drift = None
