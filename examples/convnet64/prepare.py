"""Train ConvNet64 on scikit-learn digits upscaled to 64x64; write weights and data.

Deterministic (fixed seeds, fixed split) and offline. The 8x8 digits (scaled to
[0, 1]) are upscaled with bilinear interpolation
(``torch.nn.functional.interpolate``, ``align_corners=False``).

    python examples/convnet64/prepare.py
"""
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from sklearn.datasets import load_digits
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import build  # noqa: E402

SEED = 0
SIZE = 64
N_VAL = 300
N_CALIB = 128
EPOCHS = 6
BATCH = 64


def upscale(images: np.ndarray) -> np.ndarray:
    x = torch.from_numpy(images.astype(np.float32))[:, None]  # [N,1,8,8]
    return F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False).numpy()


def load_split():
    digits = load_digits()
    images = upscale(digits.images / 16.0)  # [N,1,64,64] float32 in [0,1]
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
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    steps_per_epoch = (len(yt) + BATCH - 1) // BATCH
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=3e-3, total_steps=EPOCHS * steps_per_epoch, pct_start=0.25)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)

    t0 = time.time()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(yt), generator=gen)
        total = 0.0
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1}/{EPOCHS} loss={total / len(yt):.4f} "
              f"elapsed={time.time() - t0:.1f}s", flush=True)
    train_s = time.time() - t0

    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(x_val[i:i + 100])) for i in range(0, N_VAL, 100)])
    acc = float((pred.argmax(1).numpy() == y_val).mean())
    print(f"train samples={len(y_tr)} val samples={len(y_val)} epochs={EPOCHS} "
          f"train time={train_s:.1f}s")
    print(f"held-out accuracy: {acc * 100:.2f}%")

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(HERE, "weights.safetensors"))
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    calib_idx = np.random.RandomState(SEED + 1).choice(len(y_tr), N_CALIB, replace=False)
    np.savez_compressed(os.path.join(HERE, "data", "calib.npz"), image=x_tr[np.sort(calib_idx)])
    np.savez_compressed(os.path.join(HERE, "data", "val.npz"), image=x_val, labels=y_val)
    print("wrote weights.safetensors, data/calib.npz, data/val.npz")


if __name__ == "__main__":
    main()
