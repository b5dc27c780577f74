"""A tiny BERT-family encoder for `source: module` specs (random weights from a BertConfig, offline): what a user
who wraps a Hugging Face encoder writes. Inputs input_ids and attention_mask, output last_hidden_state. Copied
as bert_model.py next to a spec by tests/integration/test_bert_padding_build.py and scripts/unlocked-smoke.sh."""

import torch
from transformers import BertConfig, BertModel


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64)
        self.bert = BertModel(config, add_pooling_layer=False).eval()

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def build():
    return Encoder()
