"""Bundled data sets and a deterministic in-memory batcher.

The reference workloads fit in memory, so batches are slices of device-resident tensors taken in
an order derived from ``(seed, epoch)``: the data position of any epoch can be reproduced
exactly, which is what makes a retried epoch identical to the original.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

DATASETS = ("digits", "seed-reference")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Which data set to load and how to batch it."""

    name: str = "digits"
    """``digits`` (scikit-learn's bundled 8x8 digits) or ``seed-reference`` (16 synthetic samples)."""
    batch_size: int = 64
    """Training batch size; validation uses whole-split batches."""
    val_fraction: float = 0.2
    """Share of the data held out for validation (digits only)."""
    test_fraction: float = 0.2
    """Share held out for the final test accuracy (digits only)."""
    image: bool = False
    """Keep digits as (1, 8, 8) images for convolutional hosts instead of flat 64-vectors."""
    seed: int = 0
    """Seed of the split and of the per-epoch shuffle."""

    def __post_init__(self) -> None:
        if self.name not in DATASETS:
            raise ValueError(f"data name must be one of {DATASETS}, got {self.name!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not (0.0 < self.val_fraction < 1.0 and 0.0 < self.test_fraction < 1.0):
            raise ValueError("val_fraction and test_fraction must each lie in (0, 1)")
        if self.val_fraction + self.test_fraction >= 0.8:
            raise ValueError("val_fraction + test_fraction leaves under 20% for training; lower them")


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """Inputs ``x`` (N, *features) float32 and integer labels ``y`` (N,)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def to(self, device: torch.device) -> Split:
        """This split on ``device`` (pinned and copied asynchronously when moving to CUDA)."""
        if self.x.device == device:
            return self
        if device.type == "cuda":
            return Split(
                x=self.x.pin_memory().to(device, non_blocking=True),
                y=self.y.pin_memory().to(device, non_blocking=True),
            )
        return Split(x=self.x.to(device), y=self.y.to(device))


@dataclass(frozen=True, kw_only=True, slots=True)
class Dataset:
    """Train / validation / test splits and their shapes."""

    name: str
    train: Split
    val: Split
    test: Split
    feature_shape: tuple[int, ...]
    num_classes: int

    def to(self, device: torch.device) -> Dataset:
        """All splits on ``device``."""
        return Dataset(
            name=self.name,
            train=self.train.to(device),
            val=self.val.to(device),
            test=self.test.to(device),
            feature_shape=self.feature_shape,
            num_classes=self.num_classes,
        )


def load_dataset(config: DataConfig) -> Dataset:
    """Load the configured data set on the CPU.

    Args:
        config: which data set, split fractions and seed.

    Returns:
        The three splits, deterministic for a given config.
    """
    if config.name == "seed-reference":
        return _seed_reference(config.seed)
    return _digits(config)


def _digits(config: DataConfig) -> Dataset:
    # Imported here: scikit-learn costs ~0.5 s to import and only this data set needs it.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float32) / 16.0  # (N, 64), pixel values 0..16
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(config.seed))
    x, y = x[order], y[order]
    n_val = int(len(y) * config.val_fraction)
    n_test = int(len(y) * config.test_fraction)
    n_train = len(y) - n_val - n_test
    if config.image:
        x = x.view(-1, 1, 8, 8)
    feature_shape = tuple(x.shape[1:])
    return Dataset(
        name="digits",
        train=Split(x=x[:n_train], y=y[:n_train]),
        val=Split(x=x[n_train : n_train + n_val], y=y[n_train : n_train + n_val]),
        test=Split(x=x[n_train + n_val :], y=y[n_train + n_val :]),
        feature_shape=feature_shape,
        num_classes=10,
    )


def _seed_reference(seed: int) -> Dataset:
    # The seeds' Phase 0 workload: 16 samples of 16 features, 4 classes.
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(16, 4, generator=gen)

    def make(n: int) -> Split:
        x = torch.randn(n, 16, generator=gen)
        return Split(x=x, y=(x @ teacher).argmax(dim=1))

    return Dataset(
        name="seed-reference",
        train=make(16),
        val=make(16),
        test=make(16),
        feature_shape=(16,),
        num_classes=4,
    )


def epoch_order(n: int, *, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of ``epoch``: a permutation of ``n`` from its own generator, so it never
    depends on (or disturbs) the global RNG that dropout and initialisation use."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def epoch_batches(
    split: Split, *, batch_size: int, seed: int, epoch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches of ``split`` for ``epoch``, reproducible from ``(seed, epoch)``."""
    order = epoch_order(len(split), seed=seed, epoch=epoch).to(split.x.device)
    for start in range(0, len(split), batch_size):
        index = order[start : start + batch_size]
        yield split.x[index], split.y[index]
