"""A user's own model, data set and recipe, defined outside esper_core (not an Esper host).

The recipe functions are found by import path (``tests.helpers.user_model:recipe``), as a user's
would be.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from esper_core.run import (
    DataSpec,
    DataSplits,
    HeuristicConfig,
    ModelSpec,
    RunConfig,
    StepEngineConfig,
    TamiyoConfig,
    TrainerConfig,
)


class Blobs(Dataset):
    """Gaussian blobs in 12 dimensions, 3 classes, read item by item like data on disk."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        centres = torch.randn(3, 12, generator=torch.Generator().manual_seed(0)) * 1.5
        self.y = torch.randint(0, 3, (n,), generator=gen)
        self.x = centres[self.y] + torch.randn(n, 12, generator=gen)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return self.x[i], self.y[i]


class TwoTower(nn.Module):
    """Not an Esper host: plain modules, a nested Sequential, a parameter-free activation."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(12, 16)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


def blobs() -> DataSplits:
    return DataSplits(train=Blobs(256, seed=1), val=Blobs(128, seed=2), test=Blobs(128, seed=3), num_classes=3)


def recipe() -> RunConfig:
    """Seeds may grow on the stem's and the body's outputs; the first germinates after epoch 0."""
    return RunConfig(
        epochs=4,
        host=ModelSpec(build=TwoTower, slots=("stem", "body.1"), batch_max=128),
        data=DataSpec(load=blobs, batch_size=32, name="blobs"),
        # Eager: these tests are about growing a user's model, not about the step compiler.
        trainer=TrainerConfig(lr=0.05, val_batch_size=128, step=StepEngineConfig(compile="off")),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=0, blend_epochs=1)),
        blueprints=("residual_mlp",),
    )


def not_a_config() -> dict[str, int]:
    """A recipe function that returns the wrong thing."""
    return {"epochs": 3}


NOT_CALLABLE = 3


def wrong_targets() -> RunConfig:
    """The recipe with a loss its targets do not fit: class indices given to a regression loss."""
    config = recipe()
    config.loss = torch.nn.functional.mse_loss
    return config
