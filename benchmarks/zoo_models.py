"""Model-zoo architectures that no transformers config gives (benchmarks/model_zoo.py copies this file
into each spec folder; the spec's source is ``zoo_models:build_<name>``). Plain torch, no torchvision.

- ``lstm_tagger`` / ``gru_tagger``: sequence taggers, token ids ``[batch, seq]`` (seq dynamic) ->
  per-token tag logits ``[batch, seq, tags]``. (No argmax output: with random weights two tags'
  logits can differ by less than float32 rounding, and a flipped id fails verification.)
- ``rnn_loop``: a hand-written recurrent cell stepped in a Python loop over the dynamic sequence length
  (a trace unrolls it for one length).
- ``refine_loop``: iterative refinement until every sample's update is below a tolerance (at most 12
  steps): the loop's trip count depends on the input VALUES; finished samples are frozen, so each
  sample's answer does not depend on the rest of its batch.
- ``detector``: a small single-stage detector on an image of any size (``[3, H, W]``, no batch
  dimension): a strided conv backbone, per-anchor class scores and box offsets decoded around a grid,
  kept above a score threshold - boxes ``[N, 4]``, scores ``[N]``, labels ``[N]`` with N from the data.
- ``detector_batched``: the same with ``max_batch_size: 4``, detections of the batch concatenated: refused.
- ``segmenter``: an encoder-decoder (FCN-style, skip connection) returning per-pixel class logits at the
  input's own H x W (``[batch, classes, H, W]``; the class map is the client's argmax: bilinear logits
  cross smoothly, so some pixels tie within rounding).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Tagger(nn.Module):
    def __init__(self, rnn: str, vocab: int = 5000, embed: int = 64, hidden: int = 128, tags: int = 17):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        if rnn == "lstm":
            self.rnn = nn.LSTM(embed, hidden, num_layers=1, batch_first=True, bidirectional=True)
            width = 2 * hidden
        else:
            self.rnn = nn.GRU(embed, hidden, num_layers=2, batch_first=True)
            width = hidden
        self.head = nn.Linear(width, tags)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embedding(input_ids))
        return self.head(states)


class RnnLoop(nn.Module):
    """h_t = tanh(W x_t + U h_{t-1}), stepped in Python over x.shape[1]; returns the last state's scores."""

    def __init__(self, features: int = 16, hidden: int = 64, classes: int = 5):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.rec = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], self.rec.in_features, dtype=x.dtype)
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
        return self.out(h)


class RefineLoop(nn.Module):
    """z <- z + 0.5 * (tanh(A z + B x) - z) until every sample moved less than tol (at most 12 steps)."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4, tol: float = 0.05):
        super().__init__()
        self.a = nn.Linear(hidden, hidden, bias=False)
        self.b = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, classes)
        self.tol = tol

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.zeros(x.shape[0], self.a.in_features, dtype=x.dtype)
        active = torch.ones(x.shape[0], dtype=torch.bool)
        steps = torch.zeros(x.shape[0], dtype=torch.int64)
        drive = self.b(x)
        i = 0
        while bool(active.any()) and i < 12:
            update = 0.5 * (torch.tanh(self.a(z) + drive) - z)
            z = torch.where(active.unsqueeze(-1), z + update, z)
            steps = steps + active.long()
            active = active & (update.abs().amax(-1) > self.tol)
            i += 1
        return self.out(z), steps


class Detector(nn.Module):
    """Stride-8 backbone, 3 anchors per cell, 6 classes; keeps boxes whose best class score > 0.5."""

    def __init__(self, classes: int = 6, anchors: tuple[float, ...] = (12.0, 24.0, 48.0), threshold: float = 0.5):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU())
        self.register_buffer("sizes", torch.tensor(anchors))
        self.classes, self.stride, self.threshold = classes, 8, threshold
        self.cls = nn.Conv2d(64, len(anchors) * classes, 1)
        self.box = nn.Conv2d(64, len(anchors) * 4, 1)
        # He init keeps the activations' scale through the ReLUs (the default init shrinks them ~100x over
        # four convs, leaving every score within 0.05 logits of the others); a negative class bias keeps
        # a minority of the anchors, and spread-out logits keep few of them near the threshold
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.cls.weight, std=0.5)
        nn.init.constant_(self.cls.bias, -6.0)
        nn.init.normal_(self.box.weight, std=0.05)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feat = self.backbone(image.unsqueeze(0))
        _, _, h, w = feat.shape
        a = self.sizes.shape[0]
        scores = self.cls(feat).reshape(a, self.classes, h, w).permute(2, 3, 0, 1).reshape(-1, self.classes).sigmoid()
        deltas = self.box(feat).reshape(a, 4, h, w).permute(2, 3, 0, 1).reshape(-1, 4)
        ys = (torch.arange(h, dtype=torch.float32) + 0.5) * self.stride
        xs = (torch.arange(w, dtype=torch.float32) + 0.5) * self.stride
        cy = ys.reshape(h, 1, 1).expand(h, w, a).reshape(-1)
        cx = xs.reshape(1, w, 1).expand(h, w, a).reshape(-1)
        size = self.sizes.reshape(1, 1, a).expand(h, w, a).reshape(-1)
        cx = cx + deltas[:, 0] * size
        cy = cy + deltas[:, 1] * size
        half_w = 0.5 * size * deltas[:, 2].clamp(-4.0, 4.0).exp()
        half_h = 0.5 * size * deltas[:, 3].clamp(-4.0, 4.0).exp()
        boxes = torch.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=-1)
        best, labels = scores.max(-1)
        keep = best > self.threshold
        return boxes[keep], best[keep], labels[keep]


class BatchedDetector(Detector):
    """The same detector over a batch, detections of every image concatenated: not servable with a batch
    dimension (the first dimension is not the batch) - the builder refuses it, naming max_batch_size."""

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        per_image = [super(BatchedDetector, self).forward(image) for image in images]
        return tuple(torch.cat(parts) for parts in zip(*per_image))


class Segmenter(nn.Module):
    """Two strided conv stages down, bilinear up with a skip: logits at the input's own size."""

    def __init__(self, classes: int = 8):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                   nn.Conv2d(64, 64, 3, padding=1), nn.ReLU())
        self.fuse = nn.Sequential(nn.Conv2d(64 + 32, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(32, classes, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        skip = self.down1(image)
        deep = F.interpolate(self.down2(skip), size=skip.shape[-2:], mode="bilinear", align_corners=False)
        logits = self.head(self.fuse(torch.cat([deep, skip], dim=1)))
        return F.interpolate(logits, size=image.shape[-2:], mode="bilinear", align_corners=False)


def _seeded(make):
    torch.manual_seed(0)
    return make().eval()


def build_lstm_tagger() -> nn.Module:
    return _seeded(lambda: Tagger("lstm"))


def build_gru_tagger() -> nn.Module:
    return _seeded(lambda: Tagger("gru"))


def build_rnn_loop() -> nn.Module:
    return _seeded(RnnLoop)


def build_refine_loop() -> nn.Module:
    return _seeded(RefineLoop)


def build_detector() -> nn.Module:
    return _seeded(Detector)


def build_detector_batched() -> nn.Module:
    return _seeded(BatchedDetector)


def build_segmenter() -> nn.Module:
    return _seeded(Segmenter)
