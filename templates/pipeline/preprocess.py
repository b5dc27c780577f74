"""Triton python step written by triton-builder: the TOKENIZER of a Hugging Face text pipeline.

  <name>/               platform "ensemble", the name clients call: text in (TYPE_STRING), labels out
  <name>__preprocess/   this step: text -> input_ids, attention_mask (the folder's tokenizer.json)
  <name>__model/        the standard model folder (onnxruntime_onnx, openvino, ...), callable with ids too
  <name>__postprocess/  scores -> labels (text-classification, token-classification)

Requests gathered by the dynamic batcher are tokenized together and padded to the longest text among
them, so the model step receives requests of one sequence length, which its own batcher can merge.
A text that cannot be served (not UTF-8, empty, longer than the model takes without source.truncation)
fails its request with INVALID_ARG (HTTP 400) naming the row; the other requests are answered.
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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        steps = _text_steps(folder)
        self.encoder = steps.TextEncoder(os.path.join(folder, "tokenizer.json"), int(params["max_length"]),
                                         params.get("truncation", "false") == "true")
        self.input = config["input"][0]["name"]
        self.offsets = any(o["name"] == "offsets" for o in config["output"])  # token-classification: for the tags

    def execute(self, requests):
        texts, spans = [], []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy().reshape(-1)
            spans.append((len(texts), len(texts) + len(values)))
            texts.extend(values.tolist())
        ids, mask, offsets, problems = self.encoder.encode(texts)
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
