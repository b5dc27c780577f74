"""Conv net of realistic size for quantisation benchmarks.

Input: ``image`` float32 [N, 1, 64, 64] in [0, 1]. Output: ``logits`` [N, 10].
Five Conv-BN-ReLU blocks (32-128 channels), max pooling after the first four,
global average pooling and a Linear head (~0.33 M parameters, ~44 M MACs/sample).
``build()`` returns the architecture in eval mode; weights are loaded separately.
"""
import torch
from torch import nn

CHANNELS = (32, 64, 96, 128, 128)


def conv_block(c_in: int, c_out: int, pool: bool) -> nn.Sequential:
    layers = [
        nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
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
            blocks.append(conv_block(c_in, c_out, pool=i < len(channels) - 1))
            c_in = c_out
        self.features = nn.Sequential(*blocks)  # 64 -> 32 -> 16 -> 8 -> 4
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(image))
        return self.head(torch.flatten(x, 1))


def build() -> nn.Module:
    return ConvNet64().eval()
