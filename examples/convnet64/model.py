"""Conv net of realistic size for quantisation benchmarks.

Input: ``image`` float32 [N, 1, 64, 64] in [0, 1]. Output: ``logits`` [N, 10].
A strided stem (3x3, stride 2, as real conv nets downsample early) and four more Conv-BN-ReLU
blocks (64-256 channels), max pooling after blocks 2-4, global average pooling and a Linear head
(~1.1 M parameters, ~140 M MACs/sample).
``build()`` returns the architecture in eval mode; weights are loaded separately.
"""
import torch
from torch import nn

CHANNELS = (64, 128, 128, 256, 256)


def conv_block(c_in: int, c_out: int, pool: bool, stride: int = 1) -> nn.Sequential:
    layers = [
        nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class ConvNet64(nn.Module):
    def __init__(self, num_classes: int = 10, channels=CHANNELS):
        super().__init__()
        blocks = []
        c_in = 1
        for i, c_out in enumerate(channels):
            stem = i == 0
            blocks.append(conv_block(c_in, c_out, pool=0 < i < len(channels) - 1, stride=2 if stem else 1))
            c_in = c_out
        self.features = nn.Sequential(*blocks)  # 64 -> 32 (stem) -> 16 -> 8 -> 4
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(image))
        return self.head(torch.flatten(x, 1))


def build() -> nn.Module:
    return ConvNet64().eval()
