"""Create the tiny BERT's random weights and validation inputs (fixed seeds, offline).

    python examples/bert_tiny/prepare.py
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import VOCAB_SIZE, build  # noqa: E402

SEED = 0
N_VAL = 64
SEQ_LEN = 16


def main():
    torch.manual_seed(SEED)
    model = build()  # BertModel init uses the seeded global RNG
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(HERE, "weights.safetensors"))
    n_params = sum(v.numel() for v in state.values())

    rng = np.random.RandomState(SEED)
    input_ids = rng.randint(0, VOCAB_SIZE, size=(N_VAL, SEQ_LEN)).astype(np.int64)
    attention_mask = np.ones((N_VAL, SEQ_LEN), dtype=np.int64)
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    np.savez_compressed(os.path.join(HERE, "data", "val.npz"),
                        input_ids=input_ids, attention_mask=attention_mask)

    with torch.no_grad():
        emb = model(torch.from_numpy(input_ids[:4]), torch.from_numpy(attention_mask[:4]))
    print(f"parameters={n_params} embedding shape={tuple(emb.shape)}")
    print("wrote weights.safetensors, data/val.npz")


if __name__ == "__main__":
    main()
