"""A Hugging Face ``save_pretrained`` folder, read offline: what the build needs to know of it.

Usage::

    folder = read_folder(Path("my-bert"), "text-classification", origin="spec.yaml")
    folder.labels          # ['NEGATIVE', 'POSITIVE'] from config.json's id2label
    folder.max_length      # the longest token sequence served (tokenizer, config, sentence-transformers)
    folder.model_inputs()  # [{'name': 'input_ids', 'dtype': 'int64', 'shape': [-1], ...}, ...]

Nothing here imports torch or transformers: the spec reads a folder in milliseconds. Every problem is a
UserInputError naming the file (or the spec's field) and the fix. The tasks are a registry (TASKS): an
unknown task lists the supported ones and where to add one.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.errors import UserInputError
from builder.core.extras import require


@dataclass(frozen=True)
class Task:
    name: str
    modality: str  # text (a tokenizer step) | image (a decode/resize/normalise step)
    head: str  # the architecture ending transformers' Auto class for the task loads
    outputs: str  # what the model step returns: logits | token_logits | embedding


#: the tasks a Hugging Face source takes. To add one: a Task here, its outputs in Folder.model_outputs,
#: its module in builder/huggingface/module.py, its post-processing in templates/pipeline/postprocess.py
#: and its reference in builder/huggingface/reference.py.
TASKS = {t.name: t for t in (
    Task("text-classification", "text", "ForSequenceClassification", "logits"),
    Task("token-classification", "text", "ForTokenClassification", "token_logits"),
    Task("feature-extraction", "text", "Model", "embedding"),
    Task("image-classification", "image", "ForImageClassification", "logits"),
)}
#: tasks known to transformers that a source may not take yet, with what to do instead
NOT_YET = {
}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt")
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}


def task_named(task: Any, where: str) -> Task:
    if task in TASKS:
        return TASKS[task]
    if task in NOT_YET:
        raise UserInputError(f"{where}: task '{task}' is not supported yet: {NOT_YET[task]}")
    raise UserInputError(f"{where}: task {task!r} is not one of {', '.join(TASKS)}; give one of them (to add a "
                         "task: builder/huggingface/folder.py TASKS says where each part goes)")


@dataclass
class Folder:
    path: Path
    task: Task
    config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    truncation: bool  # longer texts are cut to max_length (else refused with an error naming the limit)
    max_length: int
    pooling: str | None = None  # feature-extraction: mean | cls | max
    normalize: bool = False  # feature-extraction: L2-normalised embeddings (sentence-transformers' Normalize)
    sentence_transformers: bool = False
    files: list[Path] = field(default_factory=list)  # the weights and tokenizer files: hashed into provenance
    image_shape: list[int] | None = None  # image tasks: the model's pixel_values per sample [3, H, W]

    @property
    def labels(self) -> list[str]:
        id2label = self.config.get("id2label") or {}
        count = int(self.config.get("num_labels", len(id2label) or 2))
        return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(max(count, len(id2label)))]

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or 30522)

    @property
    def hidden_size(self) -> int:
        return int(self.config.get("hidden_size") or self.config.get("dim") or self.config.get("d_model") or 768)

    def model_inputs(self) -> list[dict[str, Any]]:
        """The model step's inputs (input_ids and attention_mask, a dynamic sequence up to max_length; images:
        pixel_values of the size the folder's image processor makes)."""
        if self.image_shape is not None:
            return [{"name": "pixel_values", "dtype": "float32", "shape": list(self.image_shape)}]
        shapes = {"min_shape": [1], "opt_shape": [min(32, self.max_length)], "max_shape": [self.max_length]}
        return [{"name": "input_ids", "dtype": "int64", "shape": [-1], "value_range": [0, self.vocab_size], **shapes},
                {"name": "attention_mask", "dtype": "int64", "shape": [-1], "value_range": [1, 2], **shapes}]

    def model_outputs(self) -> list[dict[str, Any]]:
        if self.task.outputs == "logits":
            return [{"name": "logits", "dtype": "float32", "shape": [len(self.labels)]}]
        if self.task.outputs == "token_logits":
            return [{"name": "logits", "dtype": "float32", "shape": [-1, len(self.labels)]}]
        return [{"name": "embedding", "dtype": "float32", "shape": [self.hidden_size]}]


def _json(path: Path, where: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserInputError(f"{where}: {path} is not readable JSON ({' '.join(str(exc).split())[:200]}); "
                             "save the folder again with save_pretrained") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{where}: {path} holds {type(data).__name__}, not a JSON object; save the folder again "
                             "with save_pretrained")
    return data


def _pooling(path: Path, where: str) -> tuple[str | None, bool, bool]:
    """(pooling mode, normalize, is a sentence-transformers folder) from modules.json and its Pooling folder."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None, False, False
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserInputError(f"{where}: {modules_file} is not readable JSON ({exc})") from None
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m.get("path", "") for m in modules if isinstance(m, dict)}
    mode = None
    if "Pooling" in kinds:
        pooling = _json(path / kinds["Pooling"] / "config.json", where)
        chosen = [POOLING_MODES[k] for k in POOLING_MODES if pooling.get(k)]
        others = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and k not in POOLING_MODES]
        if others or len(chosen) != 1:
            raise UserInputError(f"{where}: {path / kinds['Pooling'] / 'config.json'} asks for pooling "
                                 f"{', '.join(others or chosen) or 'none'}; served pooling is one of "
                                 f"{', '.join(POOLING_MODES.values())}")
        mode = chosen[0]
    return mode, "Normalize" in kinds, True


def read_folder(path: Path, task: Any, origin: str, truncation: bool | None = None) -> Folder:
    """The folder's facts for ``task``; ``truncation`` None: as the folder's users run it (sentence-transformers
    folders truncate at max_seq_length; other folders refuse longer texts, as transformers' pipeline does)."""

    where = f"{origin}: field 'source.huggingface'"
    chosen = task_named(task, f"{origin}: field 'source.task'")
    for module in ("transformers",) + (("tokenizers",) if chosen.modality == "text" else ()):
        if importlib.util.find_spec(module) is None:
            require(module, "a Hugging Face source (source.huggingface)")
    if not path.is_dir():
        raise UserInputError(f"{where}: {path} is not a folder; give the folder save_pretrained wrote (config.json, "
                             "weights, tokenizer files)")
    if not (path / "config.json").is_file():
        raise UserInputError(f"{where}: {path} has no config.json; give the folder save_pretrained wrote")
    config = _json(path / "config.json", where)
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        raise UserInputError(f"{where}: {path} has no weights ({' or '.join(WEIGHT_FILES[::2])}); save the model with "
                             "save_pretrained (safetensors)")
    image_shape = _image_shape(path, where) if chosen.modality == "image" else None
    if chosen.modality == "text" and not (path / "tokenizer.json").is_file() and not (path / "vocab.txt").is_file():
        raise UserInputError(f"{where}: {path} has no tokenizer (tokenizer.json); save the tokenizer beside the model "
                             "with tokenizer.save_pretrained(folder)")
    tokenizer_config = _json(path / "tokenizer_config.json", where) if (path / "tokenizer_config.json").is_file() else {}
    pooling, normalize, sentence_transformers = _pooling(path, where)
    limits = [int(config.get("max_position_embeddings") or 512)]
    model_max = tokenizer_config.get("model_max_length")
    if isinstance(model_max, int) and 0 < model_max < 10**6:  # transformers writes 1e30 for "no limit"
        limits.append(model_max)
    if (path / "sentence_bert_config.json").is_file():
        seq = _json(path / "sentence_bert_config.json", where).get("max_seq_length")
        if isinstance(seq, int) and seq > 0:
            limits.append(seq)
    if chosen.outputs == "embedding" and pooling is None:
        pooling = "mean"  # transformers' feature-extraction users pool the token embeddings; mean is the common choice
    files = weights + [path / n for n in TOKENIZER_FILES + ("preprocessor_config.json",) if (path / n).is_file()] + [
        path / "config.json"]
    return Folder(path=path, task=chosen, config=config, tokenizer_config=tokenizer_config,
                  truncation=sentence_transformers if truncation is None else truncation, max_length=min(limits),
                  pooling=pooling if chosen.outputs == "embedding" else None,
                  normalize=normalize and chosen.outputs == "embedding", sentence_transformers=sentence_transformers,
                  files=files, image_shape=image_shape)


def _image_shape(path: Path, where: str) -> list[int]:
    """[3, H, W] the folder's preprocessor_config.json makes: size height/width, or shortest_edge with a crop."""
    file = path / "preprocessor_config.json"
    if not file.is_file():
        raise UserInputError(f"{where}: {path} has no preprocessor_config.json; save the image processor beside the "
                             "model with image_processor.save_pretrained(folder)")
    config = _json(file, where)
    if config.get("crop_pct") is not None:
        raise UserInputError(f"{where}: {file.name} resizes by crop_pct ({config['crop_pct']}), which the served image "
                             "step does not do yet; save a processor with size {height, width} (or shortest_edge and "
                             "crop_size)")
    size, crop = config.get("size") or {}, config.get("crop_size") or {}
    size = {"shortest_edge": size} if isinstance(size, int) else size
    crop = {"height": crop, "width": crop} if isinstance(crop, int) else crop
    target = crop if config.get("do_center_crop") and crop else size
    if "height" not in target or "width" not in target:
        raise UserInputError(f"{where}: {file.name} gives size {size} without a crop_size: the served image size is "
                             "not fixed; give size {height, width}, or do_center_crop with crop_size")
    return [3, int(target["height"]), int(target["width"])]
