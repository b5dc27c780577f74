"""Triton python step written by triton-builder: the POST-PROCESSING of a Hugging Face text pipeline
(see preprocess.py for the ensemble it belongs to).

text-classification: logits [labels] -> label (TYPE_STRING, config.json's id2label), score (FP32) and
scores (FP32, every label), with transformers' pipeline's activation (softmax; sigmoid for one label or
multi-label). Needs numpy only; text_steps.py beside it holds the arithmetic the build verified.

token-classification: text, logits [tokens, labels], input_ids and offsets -> entities (TYPE_STRING: a JSON
list per text, as transformers' pipeline with aggregation none answers: entity, score, index, word, start,
end; tokens labelled "O" and special tokens left out). Needs `tokenizers` too (tokenizer.json beside it).
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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.steps = _text_steps(os.path.join(args["model_repository"], args["model_version"]))
        self.labels = json.loads(params["labels"])
        self.function = params.get("activation", "softmax")
        self.input = "logits"
        self.tagger = params.get("task") == "token-classification"
        if self.tagger:
            from tokenizers import Tokenizer

            tokenizer_file = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
            self.tokenizer = Tokenizer.from_file(tokenizer_file)
            self.special = self.steps.special_token_ids(tokenizer_file)

    def _entities(self, request):
        def get(name):
            return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

        texts, logits, ids, offsets = get("text").reshape(-1), get("logits"), get("input_ids"), get("offsets")
        rows = []
        for row, text in enumerate(texts):
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
            rows.append(json.dumps(self.steps.token_entities(text, logits[row], ids[row], offsets[row], self.labels,
                                                             self.tokenizer, self.special)).encode("utf-8"))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("entities", np.array(rows, dtype=np.object_).reshape(-1, 1))])

    def execute(self, requests):
        if self.tagger:
            return [self._entities(request) for request in requests]
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy()
            names, best, scores = self.steps.classify(logits.reshape(-1, logits.shape[-1]), self.labels, self.function)
            rows = logits.shape[:-1]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("label", names.reshape(rows + (1,))),
                pb_utils.Tensor("score", best.reshape(rows + (1,))),
                pb_utils.Tensor("scores", scores.reshape(logits.shape))]))
        return responses
