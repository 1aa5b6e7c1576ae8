"""The task one run trains on when Simic varies it: host width, share of the training data, label noise.

An ``EpisodeTask`` is drawn per training episode (``esper_core.studies.variation.TaskVariation``) and
carried by the run's ``RunConfig.task``. Its width is applied to the host when the episode's
configuration is made (``episode_config``); its data part is applied here, once, to the loaded
splits, so bundled data (``DataConfig``) and a user's (``DataSpec``) vary the same way. Only the
training split changes: validation and test stay the recipe's, so the signal Tamiyo reads and
the yardstick a run is judged by are measured on clean, full data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import Subset

from esper_core.data import AnySplit, Dataset, DatasetSplit, Split

# Salts of the two random streams a task draws from its seed: the subset and the flipped labels
# never share a stream, so changing the fraction does not reshuffle which labels flip (and vice versa).
_SUBSET_SALT, _NOISE_SALT = 1, 2


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeTask:
    """The task of one training episode (``TaskVariation.draw``).

    Attributes:
        seed: Seeds which training samples are kept and which labels flip (the episode's seed).
        width: Factor the host's hidden widths were scaled by (``HostConfig.scaled`` or
            ``ModelSpec.scaled``; already applied to ``RunConfig.host`` by ``episode_config``).
        train_fraction: Share of the training split kept, a deterministic subset.
        label_noise: Share of the kept training samples whose label is replaced by a different
            class, drawn at random (deterministically from ``seed``).
    """

    seed: int
    width: float = 1.0
    train_fraction: float = 1.0
    label_noise: float = 0.0

    def __post_init__(self) -> None:
        if self.width <= 0:
            raise ValueError(f"a task's width factor must be > 0, got {self.width}")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ValueError(f"train_fraction must lie in (0, 1] (1 keeps every sample), got {self.train_fraction}")
        if not 0.0 <= self.label_noise < 1.0:
            raise ValueError(f"label_noise must lie in [0, 1) (0 flips no label), got {self.label_noise}")

    def to_dict(self) -> dict[str, Any]:
        """The task as plain JSON values (what provenance records)."""
        return dataclasses.asdict(self)


def vary_dataset(data: Dataset, task: EpisodeTask) -> Dataset:
    """``data`` with ``task``'s training subset and label noise applied to its training split.

    The subset keeps ``round(n * train_fraction)`` samples (at least one), chosen by ``task.seed``;
    the noise then gives ``round(kept * label_noise)`` of them a different class. Validation and
    test are returned untouched.

    Raises:
        ValueError: Label noise on data whose number of classes is unknown (a user's
            ``DataSplits`` without ``num_classes``), or on targets that are not class indices.
    """
    if task.train_fraction == 1.0 and task.label_noise == 0.0:
        return data
    train = data.train
    n = len(train)
    keep = max(1, round(n * task.train_fraction))
    if keep < n:
        order = torch.randperm(n, generator=_stream(task.seed, _SUBSET_SALT))
        train = _subset(train, order[:keep].sort().values)
    if task.label_noise > 0.0:
        if data.num_classes is None or data.num_classes < 2:
            raise ValueError(
                f"label noise flips class labels, but data set {data.name!r} declares num_classes="
                f"{data.num_classes}: give DataSplits(num_classes=...) or vary with label_noise=(0.0,)"
            )
        flips = round(len(train) * task.label_noise)
        if flips:
            gen = _stream(task.seed, _NOISE_SALT)
            index = torch.randperm(len(train), generator=gen)[:flips]
            # A shift in 1..C-1 modulo C always lands on another class, uniformly among them.
            shift = torch.randint(1, data.num_classes, (flips,), generator=gen)
            train = _relabel(train, index, shift, data.num_classes)
    return dataclasses.replace(data, train=train)


def _stream(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + salt) % 2**63)


def _subset(split: AnySplit, index: torch.Tensor) -> AnySplit:
    if isinstance(split, Split):
        index = index.to(split.x.device)
        return Split(x=split.x[index], y=split.y[index])
    return DatasetSplit(dataset=Subset(split.dataset, index.tolist()))


def _relabel(split: AnySplit, index: torch.Tensor, shift: torch.Tensor, num_classes: int) -> AnySplit:
    if isinstance(split, Split):
        if split.y.is_floating_point() or split.y.ndim != 1:
            raise ValueError("label noise needs class-index targets (an integer tensor of shape (N,))")
        index, shift = index.to(split.y.device), shift.to(split.y.device)
        y = split.y.clone()
        y[index] = (y[index] + shift) % num_classes
        return Split(x=split.x, y=y)
    labels = {}
    for i, s in zip(index.tolist(), shift.tolist(), strict=True):
        target = split.dataset[i][1]
        if isinstance(target, torch.Tensor) and (target.is_floating_point() or target.numel() != 1):
            raise ValueError("label noise needs class-index targets (an int or a 0-d integer tensor per sample)")
        labels[i] = (int(target) + s) % num_classes
    return DatasetSplit(dataset=_Relabelled(split.dataset, labels))


class _Relabelled(TorchDataset):
    """A map-style data set with some samples' class labels replaced (``index -> new class``)."""

    def __init__(self, base: TorchDataset, labels: dict[int, int]) -> None:
        self.base = base
        self.labels = labels

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        x, y = self.base[i]
        if i not in self.labels:
            return x, y
        new = self.labels[i]
        return x, torch.tensor(new, dtype=y.dtype) if isinstance(y, torch.Tensor) else new
