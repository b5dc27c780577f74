"""Triton python step written by triton-builder: the IMAGE pre-processing of a Hugging Face
image-classification pipeline (ensemble <name>: image bytes in -> this step -> <name>__model ->
<name>__postprocess: label, score, scores).

Each request's ``image`` (TYPE_STRING: the encoded file, JPEG/PNG/...) is decoded, resized, cropped,
rescaled and normalised as the folder's preprocessor_config.json says (image_steps.py beside this file: the
build verified the model on what it makes) into pixel_values [3, H, W]. A corrupt or empty image fails its
request with INVALID_ARG (HTTP 400) naming the row; the other requests are answered. Needs numpy and Pillow.

Image drift, on Triton's metrics endpoint (labels model = the ensemble, version): counters
triton_builder_images_total, triton_builder_image_pixels_total (width x height as sent) and
triton_builder_image_brightness_total (the sum of each image's mean grey level, 0-255), and the gauge
triton_builder_image_profile{stat="pixels_per_image"|"mean_brightness"} from the build's validation images.
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
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        labels = {"model": params.get("served_as") or args["model_name"], "version": str(args["model_version"])}
        counter = pb_utils.MetricFamily.COUNTER
        self.families = [pb_utils.MetricFamily(name=name, description=text, kind=counter) for name, text in (
            ("triton_builder_images_total", "images pre-processed"),
            ("triton_builder_image_pixels_total", "their pixels as sent (width x height)"),
            ("triton_builder_image_brightness_total", "the sum of their mean grey levels (0-255)"))]
        self.counters = [family.Metric(labels=labels) for family in self.families]
        profile = pb_utils.MetricFamily(name="triton_builder_image_profile", kind=pb_utils.MetricFamily.GAUGE,
                                        description="the build's validation images: pixels per image, mean brightness")
        self.families.append(profile)
        self.profile = []
        for stat in ("pixels_per_image", "mean_brightness"):
            if params.get("profile_" + stat):
                metric = profile.Metric(labels={**labels, "stat": stat})
                metric.set(float(params["profile_" + stat]))
                self.profile.append(metric)

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy().reshape(-1).tolist()
            pixels, problems = self.processor.process(values)
            for metric, value in zip(self.counters, self.processor.statistics(values, problems)):
                if value:
                    metric.increment(value)
            if problems:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid_argument(
                    f"input '{self.input}': " + "; ".join(problems[row] for row in sorted(problems)))))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output, pixels)]))
        return responses
