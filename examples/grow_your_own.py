"""Grow your own model: a network, a data set and a recipe, using only Esper's public API.

    esper run --recipe examples.grow_your_own:recipe --epochs 3

Seeds grow on the outputs of the modules named in ``slots``; Esper finds their shapes itself.
"""

import math

import torch
from torch import nn
from torch.utils.data import Dataset

from esper_core.run import DataSpec, DataSplits, ModelSpec, RunConfig, TrainerConfig


class Spirals(Dataset):
    """Two interleaved noisy spirals: (x, y) points, label 0 or 1. Stands in for data on disk."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        t = torch.rand(n, generator=gen) * 3 * math.pi + 0.5
        label = torch.randint(0, 2, (n,), generator=gen)
        angle = t + label * math.pi
        points = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], dim=1) / 10
        self.x = points + 0.02 * torch.randn(n, 2, generator=gen)
        self.y = label

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class SpiralNet(nn.Module):
    """A small MLP: too narrow to separate the spirals well, so added capacity can help."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(2, width)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(x)))


def spirals() -> DataSplits:
    return DataSplits(train=Spirals(2000, seed=1), val=Spirals(500, seed=2), test=Spirals(2000, seed=3), num_classes=2)


def recipe() -> RunConfig:
    """20 epochs of SGD; seeds may grow on the embedding's and the body's outputs."""
    return RunConfig(
        epochs=20,
        host=ModelSpec(build=SpiralNet, slots=("embed", "body")),
        data=DataSpec(load=spirals, batch_size=64, name="spirals"),
        trainer=TrainerConfig(lr=0.1, momentum=0.9),
        blueprints=("residual_mlp",),
    )
