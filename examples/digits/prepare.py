"""Train the digits CNN and write weights + calibration/validation/training data.

Deterministic (fixed seeds, fixed split) and fully offline: the data set is
scikit-learn's bundled ``load_digits()``.

    python examples/digits/prepare.py
"""
import os
import sys
import time

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_digits
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import build  # noqa: E402

SEED = 0
N_CALIB = 200
N_VAL = 300
EPOCHS = 30
BATCH = 64


def load_split():
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # [N,1,8,8] in [0,1]
    labels = digits.target.astype(np.int64)
    perm = np.random.RandomState(SEED).permutation(len(labels))
    val_idx, train_idx = perm[:N_VAL], perm[N_VAL:]
    return images[train_idx], labels[train_idx], images[val_idx], labels[val_idx]


def main():
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    x_tr, y_tr, x_val, y_val = load_split()

    model = build()
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    gen = torch.Generator().manual_seed(SEED)

    t0 = time.time()
    for _ in range(EPOCHS):
        order = torch.randperm(len(yt), generator=gen)
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
        sched.step()
    train_s = time.time() - t0

    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x_val)).argmax(1).numpy()
    acc = float((pred == y_val).mean())
    print(f"train samples={len(y_tr)} val samples={len(y_val)} epochs={EPOCHS} "
          f"train time={train_s:.1f}s")
    print(f"held-out accuracy: {acc * 100:.2f}%")

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(HERE, "weights.safetensors"))
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    calib_idx = np.random.RandomState(SEED + 1).choice(len(y_tr), N_CALIB, replace=False)
    np.savez_compressed(os.path.join(HERE, "data", "calib.npz"), image=x_tr[np.sort(calib_idx)])
    np.savez_compressed(os.path.join(HERE, "data", "val.npz"), image=x_val, labels=y_val)
    write_training(x_tr, y_tr)
    print("wrote weights.safetensors, data/calib.npz, data/val.npz, data/train.npz")


def write_training(x_tr, y_tr):
    """data/train.npz: the training split with its labels (data.training: the compression variants
    fine-tune on it). ``python examples/digits/prepare.py --training-only`` rewrites just this file."""
    np.savez_compressed(os.path.join(HERE, "data", "train.npz"), image=x_tr, labels=y_tr)


if __name__ == "__main__":
    if "--training-only" in sys.argv:
        x_tr, y_tr, _, _ = load_split()
        write_training(x_tr, y_tr)
    else:
        main()
