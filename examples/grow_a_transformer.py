"""Grow a transformer: an ``nn.TransformerEncoder`` of your own, a data set and a recipe.

    esper run --recipe examples.grow_a_transformer:recipe --epochs 3
    esper recipes show examples.grow_a_transformer:recipe   # each slot's shape and the seeds that fit

Seeds grow on the outputs of the two encoder layers, (B, L, D) token features; the recipe names
no blueprints, so every approved one that fits a token slot is a candidate (a per-token MLP, a
low-rank adapter, a self-attention head). The task needs the model to look across the sequence:
which of four symbols occurs most often in a sequence of 16.
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset

from esper_core.run import DataSpec, DataSplits, ModelSpec, RunConfig, TrainerConfig

SYMBOLS, LENGTH = 4, 16


def majority(n: int, seed: int) -> TensorDataset:
    """Sequences of symbol ids (n, LENGTH), labelled by their most frequent symbol (ties: the lowest)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, SYMBOLS, (n, LENGTH), generator=gen)
    counts = torch.nn.functional.one_hot(x, SYMBOLS).sum(dim=1)  # (n, SYMBOLS)
    return TensorDataset(x, counts.argmax(dim=1))


class MajorityTransformer(nn.Module):
    """Symbol embeddings, a 2-layer transformer encoder (batch first), mean pooling, a linear head."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(SYMBOLS, width)
        self.position = nn.Parameter(torch.zeros(1, LENGTH, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, SYMBOLS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x) + self.position)  # (B, L, D)
        return self.head(h.mean(dim=1))


def data() -> DataSplits:
    return DataSplits(train=majority(2000, seed=1), val=majority(500, seed=2), test=majority(2000, seed=3))


def recipe() -> RunConfig:
    """10 epochs of Adam; seeds may grow on either encoder layer's output."""
    return RunConfig(
        epochs=10,
        # The inputs are symbol ids, so the dry forward that finds the slots' shapes feeds it longs.
        host=ModelSpec(
            build=MajorityTransformer, slots=("encoder.layers.0", "encoder.layers.1"), input_dtype=torch.long
        ),
        data=DataSpec(load=data, batch_size=64, name="majority"),
        trainer=TrainerConfig(optimizer="adam", lr=3e-3),
    )
