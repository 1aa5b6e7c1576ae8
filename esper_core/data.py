"""Data sets of a run: the bundled ones (in memory) and a user's own (any map-style Dataset).

The bundled workloads fit in memory, so their batches are slices of device-resident tensors
(``Split``). A user's data set is read through a DataLoader (``DatasetSplit``), so it need not fit
in memory. Either way the sample order of an epoch derives from ``(seed, epoch)`` alone: the data
position of any epoch can be reproduced exactly, which is what makes a retried epoch identical to
the original.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import Dataset as TorchDataset

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
    """Seed of the per-epoch shuffle, and of the split unless ``split_seed`` is set."""
    split_seed: int | None = None
    """Seed of the train/validation/test split (of the generated samples for ``seed-reference``);
    None: ``seed``. Fix it to compare runs of different seeds on the same test set."""

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

    def head(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` samples as one batch."""
        return self.x[:n], self.y[:n]

    def to(self, device: torch.device) -> Split:
        """This split on ``device`` (pinned and copied asynchronously when moving to CUDA)."""
        if self.x.device == device:
            return self
        if device.type == "cuda" and self.x.device.type == "cpu":
            return Split(
                x=self.x.pin_memory().to(device, non_blocking=True),
                y=self.y.pin_memory().to(device, non_blocking=True),
            )
        # Already on a CUDA device: ``torch.device("cuda")`` is not equal to the tensor's
        # ``cuda:0``, and ``.to`` returns the same tensors when nothing moves.
        return Split(x=self.x.to(device), y=self.y.to(device))


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetSplit:
    """A split held by a map-style ``torch.utils.data.Dataset`` whose items are ``(x, y)``.

    It stays where it is (e.g. on disk): Tolaria reads it through a DataLoader, batch by batch.
    """

    dataset: TorchDataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def to(self, device: torch.device) -> DatasetSplit:
        """Itself: batches move to the device as they are read."""
        del device
        return self

    def head(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` samples, collated into one batch on the CPU."""
        loader = DataLoader(self.dataset, batch_size=min(n, len(self)), shuffle=False, generator=torch.Generator())
        return next(iter(loader))


AnySplit = Split | DatasetSplit
"""A split in memory (``Split``) or behind a ``torch.utils.data.Dataset`` (``DatasetSplit``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataSplits:
    """A user's data: three map-style data sets whose items are ``(input, target)`` pairs.

    Attributes:
        train: Training samples (shuffled per epoch by Esper, reproducibly from the run's seed).
        val: Validation samples: Tamiyo's signal and the gates' yardstick.
        test: Test samples, evaluated once at the end of the run.
        num_classes: Number of classes, when the targets are class indices (informational).
    """

    train: TorchDataset
    val: TorchDataset
    test: TorchDataset
    num_classes: int | None = None

    def __post_init__(self) -> None:
        for name in ("train", "val", "test"):
            split = getattr(self, name)
            if isinstance(split, DataLoader):
                raise ValueError(
                    f"{name} is a DataLoader; pass its data set ({name}=loader.dataset): Esper orders the "
                    "batches itself so that a retried epoch sees the same ones (loader settings go in "
                    "TrainerConfig.loader)"
                )
            if not hasattr(split, "__getitem__") or not hasattr(split, "__len__"):
                raise ValueError(
                    f"{name} must be a map-style torch.utils.data.Dataset (with __getitem__ and __len__), "
                    f"got {type(split).__name__}"
                )
            if len(split) == 0:
                raise ValueError(f"the {name} data set is empty")


@dataclass(kw_only=True, slots=True)
class DataSpec:
    """A user's data for a run: a function that builds the splits, and the batch size.

    ``load`` is called once when a run is built (in each process that builds it), so it should
    open files or generate data, not train anything.
    """

    load: Callable[[], DataSplits]
    """Returns the three splits."""
    batch_size: int = 64
    """Training batch size; validation uses ``TrainerConfig.val_batch_size``."""
    name: str = "custom"
    """Shown in reports and baselines."""
    seed: int = 0
    """Seed of the per-epoch shuffle (a recipe's ``seed`` override sets it)."""

    def __post_init__(self) -> None:
        if not callable(self.load):
            raise ValueError(f"DataSpec.load must be a function returning DataSplits, got {type(self.load).__name__}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Dataset:
    """Train / validation / test splits and their shapes."""

    name: str
    train: AnySplit
    val: AnySplit
    test: AnySplit
    feature_shape: tuple[int, ...]
    num_classes: int | None

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


def load_dataset(config: DataConfig | DataSpec) -> Dataset:
    """Load the configured data set (a bundled one on the CPU, or a user's through its ``load``).

    Args:
        config: A bundled data set's configuration, or a user's ``DataSpec``.

    Returns:
        The three splits, deterministic for a given config.

    Raises:
        ValueError: a user's ``load`` returned something other than ``DataSplits``, or samples
            that are not ``(input tensor, target)`` pairs.
    """
    if isinstance(config, DataSpec):
        return _user_data(config)
    if config.name == "seed-reference":
        return _seed_reference(config.seed if config.split_seed is None else config.split_seed)
    return _digits(config)


def _user_data(spec: DataSpec) -> Dataset:
    splits = spec.load()
    if not isinstance(splits, DataSplits):
        raise ValueError(
            f"DataSpec.load must return esper_core.data.DataSplits(train=..., val=..., test=...), "
            f"got {type(splits).__name__}"
        )
    sample = splits.train[0]
    if not (isinstance(sample, tuple | list) and len(sample) == 2 and isinstance(sample[0], torch.Tensor)):
        raise ValueError(
            f"each sample of the train data set must be an (input tensor, target) pair, got {type(sample).__name__}"
            + (f" of {len(sample)}" if isinstance(sample, tuple | list) else "")
        )
    return Dataset(
        name=spec.name,
        train=_split_of(splits.train),
        val=_split_of(splits.val),
        test=_split_of(splits.test),
        feature_shape=tuple(sample[0].shape),
        num_classes=splits.num_classes,
    )


def _split_of(dataset: TorchDataset) -> AnySplit:
    """A ``TensorDataset`` of (inputs, targets) is data in memory: it takes the resident path
    (batches are index slices, no per-sample reads or collation); anything else streams."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        x, y = dataset.tensors
        return Split(x=x, y=y)
    return DatasetSplit(dataset=dataset)


def _digits(config: DataConfig) -> Dataset:
    # Imported here: scikit-learn costs ~0.5 s to import and only this data set needs it.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float32) / 16.0  # (N, 64), pixel values 0..16
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    split_seed = config.seed if config.split_seed is None else config.split_seed
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
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
