"""Triton python step written by triton-builder: the IMAGE pre-processing of a Hugging Face
image-classification pipeline (ensemble <name>: image bytes in -> this step -> <name>__model ->
<name>__postprocess: label, score, scores).

Each request's ``image`` (TYPE_STRING: the encoded file, JPEG/PNG/...) is decoded, resized, cropped,
rescaled and normalised as the folder's preprocessor_config.json says (image_steps.py beside this file: the
build verified the model on what it makes) into pixel_values [3, H, W]. A corrupt or empty image fails its
request with INVALID_ARG (HTTP 400) naming the row; the other requests are answered. Needs numpy and Pillow.
"""

import importlib.util
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _invalid_argument(message):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        spec = importlib.util.spec_from_file_location("triton_builder_image_steps_" + str(abs(hash(folder))),
                                                      os.path.join(folder, "image_steps.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with open(os.path.join(folder, "preprocessor_config.json"), encoding="utf-8") as handle:
            self.processor = module.ImageProcessor(json.load(handle))
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy().reshape(-1).tolist()
            pixels, problems = self.processor.process(values)
            if problems:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid_argument(
                    f"input '{self.input}': " + "; ".join(problems[row] for row in sorted(problems)))))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output, pixels)]))
        return responses
