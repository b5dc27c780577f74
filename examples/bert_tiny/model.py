"""Tiny BERT encoder (random weights) returning a mask-weighted mean-pooled embedding.

Inputs: ``input_ids`` int64 [N, S], ``attention_mask`` int64 [N, S].
Output: ``embedding`` float32 [N, HIDDEN].

The config is built offline (no hub download). transformers 5 models must be
called with keyword arguments, so the wrapper's positional ``forward`` calls
``BertModel`` with keywords and returns a single tensor, which keeps both
``torch.jit.trace`` and ``torch.onnx.export(dynamo=True)`` happy.
``build()`` does not load weights; the builder loads ``weights.safetensors``.
"""
import torch
from torch import nn
from transformers import BertConfig, BertModel

VOCAB_SIZE = 1000
HIDDEN = 64
MAX_POSITION = 128


def make_config() -> BertConfig:
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITION,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        # Plain matmul/softmax attention: exports identically under trace and
        # dynamo and avoids backend-specific SDPA kernels.
        attn_implementation="eager",
    )
    return config


class BertMeanPool(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # token_type_ids is passed explicitly so BertModel does not slice its
        # registered buffer by the (dynamic) sequence length.
        hidden = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=torch.zeros_like(input_ids),
            return_dict=True,
        ).last_hidden_state  # [N, S, H]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [N, S, 1]
        summed = (hidden * mask).sum(dim=1)
        count = mask.sum(dim=1).clamp(min=1.0)
        return summed / count


def build() -> nn.Module:
    return BertMeanPool(make_config()).eval()
