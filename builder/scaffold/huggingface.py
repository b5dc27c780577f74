"""`triton-builder init` for a Hugging Face folder (builder/scaffold/draft.py): config.json, weights, tokenizer files.

Usage::

    draft = hf_draft(Path("my-bert"), Path("spec.yaml"))   # the spec, and hf_model.py beside it

A folder with weights and tokenizer.json whose architecture serves a pipeline task (a sequence or token
classifier, an encoder or a sentence-transformers folder) gets the three-line ``source.huggingface`` spec
(served text in: builder/repository/pipeline.py). Any other folder is built as any PyTorch model, from a
factory whose module wraps it so that forward() takes the spec's inputs by position and returns plain tensors
(docs/guides/hugging-face.md, examples/bert_tiny/model.py). So the draft is ``source.module:
hf_model:build`` plus that module, written beside the spec: it loads the folder with
``transformers.<architectures[0]>.from_pretrained(..., attn_implementation="eager")``. Inputs and
outputs follow config.json's architectures / model_type (text: input_ids + attention_mask with a
dynamic sequence; vision: pixel_values); its id2label is quoted on the logits output. Tokenizing stays
the client's: the served model takes token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.core.errors import UserInputError
from builder.scaffold.draft import DEFAULT_MAX_BATCH_SIZE, Draft, Tensor, Value, model_name, relative_to_spec
from builder.spec.huggingface import DEFAULT_MAX_BATCH_SIZE as PIPELINE_MAX_BATCH_SIZE

WRAPPER = "hf_model.py"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "spiece.model", "sentencepiece.bpe.model", "preprocessor_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
MAX_SEQUENCE = 128  # the longest sequence the build tests by default (capped by max_position_embeddings)
# architecture name ending -> the outputs it returns: (attribute, per-sample shape; 'L' labels, 'V' vocabulary)
HEADS = (
    ("ForSequenceClassification", [("logits", ["L"])]),
    ("ForImageClassification", [("logits", ["L"])]),
    ("ForTokenClassification", [("logits", [-1, "L"])]),
    ("ForQuestionAnswering", [("start_logits", [-1]), ("end_logits", [-1])]),
    ("ForMaskedLM", [("logits", [-1, "V"])]),
    ("ForCausalLM", [("logits", [-1, "V"])]),
    ("LMHeadModel", [("logits", [-1, "V"])]),
    ("Model", [("last_hidden_state", [-1, "H"])]),
)

_TEMPLATE = '''"""Written by `triton-builder init` from the Hugging Face folder {folder}: build() loads it with
transformers.{architecture}.from_pretrained and wraps it so that forward() takes the spec's inputs by
position and returns plain tensors (docs/guides/hugging-face.md). Edit it to serve other outputs."""

import inspect
from pathlib import Path

import torch
import transformers
from torch import nn

FOLDER = Path(__file__).resolve().joinpath("..", {relative!r}).resolve()  # beside this file
ARCHITECTURE = {architecture!r}
OUTPUTS = {outputs!r}  # the attributes of the model's output returned, in the spec's outputs order


class Wrapped(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        takes = inspect.signature(model.forward).parameters
        # token types passed explicitly (zeros), as BertModel otherwise slices a buffer by the sequence length
        self.token_types = "token_type_ids" in takes and "token_type_ids" not in {inputs!r}
        self.extra = {{"use_cache": False}} if "use_cache" in takes else {{}}

    def forward(self, {signature}):
        extra = dict(self.extra)
        if self.token_types:
            extra["token_type_ids"] = torch.zeros_like({first})
        out = self.model({keywords}, return_dict=True, **extra)
        if not OUTPUTS:
            return out[0]
        found = tuple(getattr(out, name) for name in OUTPUTS)
        return found[0] if len(found) == 1 else found


def build() -> nn.Module:
    model_class = getattr(transformers, ARCHITECTURE, None) or transformers.AutoModel
    # eager attention: plain matmul/softmax, exported the same by trace and dynamo
    model = model_class.from_pretrained(FOLDER, attn_implementation="eager")
    return Wrapped(model).eval()
'''


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{folder / 'config.json'}: not readable JSON ({exc}); save it again with "
                             "model.config.save_pretrained(folder)") from None
    if not isinstance(config, dict):
        raise UserInputError(f"{folder / 'config.json'}: not a JSON object; save it again with save_pretrained")
    return config


def _first(config: dict[str, Any], *keys: str) -> Any:
    """A config value under the first of its names (GPT-2: n_positions / n_embd; DistilBERT: dim)."""
    return next((config[k] for k in keys if isinstance(config.get(k), int)), None)


def _labels(config: dict[str, Any]) -> tuple[int | None, str]:
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        shown = ", ".join(f"{k} {v}" for k, v in list(id2label.items())[:8]) + (", ..." if len(id2label) > 8 else "")
        return len(id2label), f"labels (config.json id2label): {shown}"
    count = _first(config, "num_labels")
    return count, ""


#: architecture ending -> the task a source.huggingface serves it as (text in, labels or embeddings out)
PIPELINE_TASKS = (("ForSequenceClassification", "text-classification"),
                  ("ForTokenClassification", "token-classification"), ("Model", "feature-extraction"))


def _pipeline_task(folder: Path, architecture: str) -> str | None:
    """The task to serve the folder as a text pipeline, where it has the weights and tokenizer.json that needs."""
    if not (folder / "tokenizer.json").is_file() or not any((folder / f).is_file() for f in WEIGHT_FILES):
        return None
    if (folder / "modules.json").is_file():  # sentence-transformers
        return "feature-extraction"
    return next((task for ending, task in PIPELINE_TASKS if architecture.endswith(ending)), None)


def _pipeline_draft(folder: Path, out: Path, architecture: str, task: str) -> Draft:
    guess = dict(review=True)
    return Draft(kind="huggingface", name=Value(model_name(folder.name), "from the folder's name: the Triton model name",
                                                **guess),
                 source=("huggingface", relative_to_spec(folder, out)), inputs=[], outputs=[],
                 max_batch_size=Value(PIPELINE_MAX_BATCH_SIZE, "texts per request, and what the batcher gathers",
                                      **guess),
                 source_note="the save_pretrained folder: it says the inputs, outputs, labels and limits",
                 source_fields=[("task", Value(task, f"from {architecture or 'modules.json'}", **guess))],
                 header=[f"Drafted by `triton-builder init` from the Hugging Face folder {folder.name} "
                         f"({architecture or 'sentence-transformers'}).",
                         "Served text in: an ensemble over the tokenizer step, the model and its post-processing.",
                         f"Every '# review:' is a guess: check it, then run: triton-builder build {out.name}"])


def hf_draft(folder: Path, out: Path) -> Draft:
    config = _read_config(folder)
    architectures = config.get("architectures") or []
    architecture = architectures[0] if isinstance(architectures, list) and architectures else ""
    task = _pipeline_task(folder, architecture)
    if task:
        return _pipeline_draft(folder, out, architecture, task)
    model_type = str(config.get("model_type") or "")
    notes: list[str] = []
    if not architecture:
        notes.append("the model class: config.json names no architectures; hf_model.py uses transformers.AutoModel "
                     "(the base model, last_hidden_state): set ARCHITECTURE in it to the class with your head")
    vision = "Image" in architecture or ("num_channels" in config and "vocab_size" not in config)
    text = not vision and "vocab_size" in config
    guess = dict(review=True)
    if text:
        longest = min(MAX_SEQUENCE, _first(config, "max_position_embeddings", "n_positions") or MAX_SEQUENCE)
        profile = Value(([1], [min(16, longest)], [longest]), "sequence lengths the build tests (min/opt/max); "
                        f"max_position_embeddings allows {_first(config, 'max_position_embeddings', 'n_positions')}",
                        **guess)
        ids = Tensor(Value("input_ids"), Value("int64"), Value([-1], "the sequence: dynamic"), profile,
                     Value([0, config["vocab_size"]], "config.json's vocab_size: generated ids (high exclusive)"))
        mask = Tensor(Value("attention_mask"), Value("int64"), Value([-1], "the sequence: dynamic"), profile,
                      Value([1, 2], "all ones: no padding in generated inputs", **guess))
        inputs = [ids, mask]
    elif vision:
        size = config.get("image_size") if isinstance(config.get("image_size"), int) else None
        channels = config.get("num_channels") if isinstance(config.get("num_channels"), int) else 3
        shape = Value([channels, size or 224, size or 224],
                      "config.json's num_channels and image_size" if size else "image_size not in config.json: "
                      "224 is a guess", review=size is None)
        inputs = [Tensor(Value("pixel_values"), Value("float32"), shape)]
    else:
        inputs = [Tensor(Value("input_values", "placeholder: neither text nor image", **guess),
                         Value("float32", "placeholder", **guess), Value([-1], "placeholder", **guess))]
        notes.append(f"the inputs: config.json (model_type {model_type or '?'}) is neither a text nor an image "
                     f"model this reads; edit inputs and forward() in {WRAPPER}")
    labels, label_text = _labels(config)
    hidden = _first(config, "hidden_size", "n_embd", "dim", "d_model")
    sizes = {"L": labels, "V": config.get("vocab_size"), "H": hidden}
    head = next((outs for ending, outs in HEADS if architecture.endswith(ending)), None)
    if not architecture:
        head = [("last_hidden_state", [-1, "H"])]
    outputs = []
    for attribute, shape in head or []:
        dims = [sizes.get(d) or -1 if isinstance(d, str) else d for d in shape]
        if vision and attribute == "last_hidden_state":
            dims = ["..."]
        comment = f"{architecture or 'AutoModel'}.{attribute}, per sample {dims}"
        outputs.append(Tensor(Value(attribute, label_text if attribute == "logits" else ""), comment=comment))
    if head is None:
        outputs = [Tensor(Value("output", f"placeholder: {architecture}'s first output", **guess))]
        notes.append(f"the outputs: {architecture} is not a head this reads; hf_model.py returns its first output: "
                     "set OUTPUTS in it to the attributes to serve, and name each in outputs")
    _note_files(folder, notes, text)
    name = Value(model_name(folder.name), "from the folder's name: the Triton model name", **guess)
    batch = Value(DEFAULT_MAX_BATCH_SIZE, "a default: requests are batched up to this", **guess)
    signature = ", ".join(t.name.value for t in inputs)
    wrapper = _TEMPLATE.format(folder=folder.name, relative=relative_to_spec(folder, out),
                               architecture=architecture or "AutoModel",
                               outputs=[t.name.value for t in outputs] if head else [],
                               inputs=[t.name.value for t in inputs], signature=signature,
                               first=inputs[0].name.value,
                               keywords=", ".join(f"{n}={n}" for n in signature.split(", ")))
    kind = f"{architecture or model_type or 'model'}, {'text' if text else 'vision' if vision else 'other'}"
    return Draft(kind="huggingface", name=name, source=("module", "hf_model:build"), inputs=inputs, outputs=outputs,
                 max_batch_size=batch, not_inferred=notes,
                 source_note=f"{WRAPPER} (written beside this spec) loads {folder.name} with transformers",
                 extra_files={WRAPPER: wrapper},
                 header=[f"Drafted by `triton-builder init` from the Hugging Face folder {folder.name} ({kind}).",
                         "The served model takes token ids: clients tokenize with the folder's tokenizer files."
                         if text else "Clients send preprocessed inputs (the folder's preprocessor, if any).",
                         f"Every '# review:' is a guess: check it, then run: triton-builder build {out.name}"])


def _note_files(folder: Path, notes: list[str], text: bool) -> None:
    if not any((folder / f).is_file() for f in WEIGHT_FILES):
        notes.append(f"the weights: {folder} holds none of {', '.join(WEIGHT_FILES[:3])}; from_pretrained needs "
                     "them: save the model with model.save_pretrained(folder)")
    if text and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        notes.append(f"the tokenizer: {folder} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); "
                     "clients need the model's own to send token ids: save it with tokenizer.save_pretrained(folder)")
