"""``source.huggingface``: a spec whose model is a Hugging Face save_pretrained folder.

Usage (YAML; the whole spec)::

    name: sentiment
    source: {huggingface: my-distilbert, task: text-classification}

The folder says the rest (builder/huggingface/folder.py): the model step's inputs (input_ids and
attention_mask, a dynamic sequence up to the model's limit) and outputs, so the spec lists no tensors;
max_batch_size defaults to 16. ``truncation: true`` cuts longer texts to the limit (a sentence-transformers
folder does by default, as its encode() does); without it they are refused with an error naming the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.huggingface.folder import Folder, read_folder

HF_KEYS = ("huggingface", "task", "truncation")
DEFAULT_MAX_BATCH_SIZE = 16


def parse_huggingface(f, origin: str, base: Path) -> Folder:
    """The folder of ``source`` (a spec_fields.Fields over it), read for its task."""
    for key in ("weights",):
        if f.get(key) is not None:
            raise f.error("a Hugging Face folder carries its own weights; remove source.weights", key)
    if f.get("task") is None:
        raise f.error("missing; give the task the folder serves, e.g. task: text-classification", "task")
    truncation = f.get("truncation")
    if truncation is not None and not isinstance(truncation, bool):
        raise f.error(f"must be true or false, got {truncation!r}", "truncation")
    value = f.get("huggingface")
    if not isinstance(value, str) or not value.strip():
        raise f.error(f"must be the path of a save_pretrained folder, got {value!r}", "huggingface")
    folder = Path(value) if Path(value).is_absolute() else (base / value).resolve()
    return read_folder(folder, f.get("task"), origin, truncation)


def refuse_tensor_lists(top, folder: Folder) -> None:
    """inputs/outputs come from the folder: a spec that also lists them would be ignored or contradict it."""
    for key in ("inputs", "outputs"):
        if top.get(key) is not None:
            raise top.error(f"a Hugging Face source takes its {key} from the folder ({folder.path.name}/config.json "
                            "and its tokenizer); remove the list", key)
    deploy = top.get("deploy")
    if isinstance(deploy, dict) and deploy.get("monitor") is True:
        raise top.error("deploy.monitor is not available for a Hugging Face pipeline yet (its ensemble has "
                        "tokenizer and post-processing steps, not a monitor step); remove deploy.monitor", "deploy")


def derived_tensors(folder: Folder) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return folder.model_inputs(), folder.model_outputs()
