"""Triton python step written by triton-builder: the TOKENIZER of a Hugging Face text pipeline.

  <name>/               platform "ensemble", the name clients call: text in (TYPE_STRING), labels out
  <name>__preprocess/   this step: text -> input_ids, attention_mask (the folder's tokenizer.json)
  <name>__model/        the standard model folder (onnxruntime_onnx, openvino, ...), callable with ids too
  <name>__postprocess/  scores -> labels (token tags; a classifier whose model is not an ONNX graph)

Requests gathered by the dynamic batcher are tokenized together and padded to the length bucket (parameter
length_buckets: powers of two up to the model's limit, chosen from the validation texts) that holds the longest
text among them, so the model step receives few distinct shapes, and its own batcher - which merges requests
of equal shape only - batches texts of different lengths.
A text that cannot be served (not UTF-8, empty, longer than the model takes without source.truncation)
fails its request with INVALID_ARG (HTTP 400) naming the row; the other requests are answered.

Text drift, on Triton's metrics endpoint (labels model = the ensemble, version): counters
triton_builder_texts_total, triton_builder_text_tokens_total and triton_builder_text_unknown_tokens_total
(served texts, their tokens, the tokenizer's unknown token among them), and the gauge
triton_builder_text_profile{stat="tokens_per_text"|"unknown_rate"}: the same figures on the build's
validation texts. rate(tokens) / rate(texts) against the profile is the length drift; rate(unknown) /
rate(tokens) the vocabulary drift.
Needs numpy and `tokenizers` (pip install tokenizers in the serving image); the tokenizer files and
text_steps.py (shared with the build, which tokenized the validation texts with it) sit beside this file.
"""

import importlib.util
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _text_steps(folder):
    spec = importlib.util.spec_from_file_location("triton_builder_text_steps_" + str(abs(hash(folder))),
                                                  os.path.join(folder, "text_steps.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _invalid_argument(message):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


class _TextCounters:
    def __init__(self, model, version, params):
        labels = {"model": model, "version": str(version)}
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.families = [
            pb_utils.MetricFamily(name="triton_builder_texts_total", description="texts tokenized", kind=counter),
            pb_utils.MetricFamily(name="triton_builder_text_tokens_total", description="their tokens (no padding)",
                                  kind=counter),
            pb_utils.MetricFamily(name="triton_builder_text_unknown_tokens_total",
                                  description="their tokens the tokenizer did not know (its unknown token)", kind=counter)]
        self.metrics = [family.Metric(labels=labels) for family in self.families]
        profile = pb_utils.MetricFamily(name="triton_builder_text_profile",
                                        description="the build's validation texts: tokens per text, unknown-token rate",
                                        kind=gauge)
        self.families.append(profile)
        self.profile = []
        for stat in ("tokens_per_text", "unknown_rate"):
            if params.get("profile_" + stat):
                metric = profile.Metric(labels={**labels, "stat": stat})
                metric.set(float(params["profile_" + stat]))
                self.profile.append(metric)

    def add(self, texts, tokens, unknown):
        for metric, value in zip(self.metrics, (texts, tokens, unknown)):
            if value:
                metric.increment(value)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        steps = _text_steps(folder)
        self.encoder = steps.step_encoder(folder, params)
        self.input = config["input"][0]["name"]
        self.counters = _TextCounters(params.get("served_as") or args["model_name"], args["model_version"], params)
        self.offsets = any(o["name"] == "offsets" for o in config["output"])  # token-classification: for the tags

    def execute(self, requests):
        texts, spans = [], []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy().reshape(-1)
            spans.append((len(texts), len(texts) + len(values)))
            texts.extend(values.tolist())
        encoded = self.encoder.encode(texts)
        ids, mask, offsets, problems = encoded
        self.counters.add(*self.encoder.statistics(encoded))
        responses = []
        for start, end in spans:
            wrong = [problems[row] for row in range(start, end) if row in problems]
            if wrong:
                shift = [w.replace(f"text {r} ", f"text {r - start} ", 1) for r, w in
                         zip([row for row in range(start, end) if row in problems], wrong)]
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_invalid_argument(
                    f"input '{self.input}': " + "; ".join(shift))))
                continue
            tensors = [pb_utils.Tensor("input_ids", np.ascontiguousarray(ids[start:end])),
                       pb_utils.Tensor("attention_mask", np.ascontiguousarray(mask[start:end]))]
            if self.offsets:
                tensors.append(pb_utils.Tensor("offsets", np.ascontiguousarray(offsets[start:end])))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
