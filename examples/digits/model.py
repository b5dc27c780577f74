"""Small CNN for 8x8 handwritten digits (scikit-learn ``load_digits``).

Input: ``image`` float32 [N, 1, 8, 8] scaled to [0, 1]. Output: ``logits`` [N, 10].
``build()`` returns the architecture in eval mode; weights are loaded separately.
"""
import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(32, 64, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.head = nn.Linear(64 * 2 * 2, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.features(image)
        return self.head(torch.flatten(x, 1))


def build() -> nn.Module:
    return DigitsCNN().eval()
