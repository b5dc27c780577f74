"""The model step of a Hugging Face source as a torch module the build exports like any other.

Usage::

    model = build_module(folder)          # folder: builder/huggingface/folder.py Folder
    logits = model(input_ids, attention_mask)

transformers loads the folder offline (``local_files_only``) with eager attention (plain matmul/softmax:
exports the same under trace, dynamo and the legacy exporter, and onnxruntime's transformer optimizer
fuses it). forward() takes the inputs by position and returns one plain tensor: logits, or for
feature-extraction the embedding pooled as the folder says (mean / cls / max over the real tokens,
L2-normalised where sentence-transformers' Normalize module is listed) - pooling in the graph sends
hidden-size floats per text between steps rather than a sequence of them. token_type_ids, where the model
takes them, are zeros: one text per request is one segment.
"""

from __future__ import annotations

import inspect
import os

from builder.core.errors import UserInputError
from builder.huggingface.folder import Folder


def quiet_transformers() -> None:
    """transformers' progress bars and load reports would interleave with the build's own progress."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def _auto_class(folder: Folder):
    import transformers

    name = {"ForSequenceClassification": "AutoModelForSequenceClassification",
            "ForTokenClassification": "AutoModelForTokenClassification", "Model": "AutoModel",
            "ForImageClassification": "AutoModelForImageClassification"}[folder.task.head]
    return getattr(transformers, name)


def _image_step_class():
    from torch import nn

    class ImageStep(nn.Module):
        """pixel_values [batch, 3, H, W] -> logits."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values, return_dict=True).logits

    return ImageStep


def ImageStep(model):  # noqa: N802 - a class made on first use (torch imported lazily)
    return _image_step_class()(model)


def build_module(folder: Folder):
    import torch
    from torch import nn

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_transformers()
    try:
        model = _auto_class(folder).from_pretrained(str(folder.path), local_files_only=True,
                                                    attn_implementation="eager")
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a folder it cannot load
        raise UserInputError(f"source.huggingface: transformers cannot load {folder.path} for task "
                             f"'{folder.task.name}' ({' '.join(str(exc).split())[:300]}); check that the folder was "
                             "written by save_pretrained and that the task matches its architecture") from None
    model.eval()
    if folder.task.modality == "image":
        return ImageStep(model).eval()
    takes_type_ids = "token_type_ids" in inspect.signature(model.forward).parameters

    class HuggingFaceStep(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if takes_type_ids else {}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra)
            if folder.task.outputs != "embedding":
                return out.logits
            hidden = out.last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            if folder.pooling == "cls":
                pooled = hidden[:, 0]
            elif folder.pooling == "max":
                pooled = (hidden + (mask - 1.0) * 1e9).max(dim=1).values
            else:
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if folder.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return pooled

    return HuggingFaceStep().eval()
