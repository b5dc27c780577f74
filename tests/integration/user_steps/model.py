"""A tiny classifier over four numbers, for the user-steps test (tests/integration/test_user_steps_served.py)."""
import torch
from torch import nn


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
