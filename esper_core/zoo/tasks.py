"""The zoo's tasks: small data sets, each drawn from a seed, as a ``DataSpec`` an Esper run loads.

- ``mnist1d``: MNIST-1D (``esper_core.datasets.mnist1d``) generated from the task's seed, so each
  member trains on its own draw of the signals (its own split and noise); 10 classes, (40,).
- ``digits``: scikit-learn's 8x8 digits split by the task's seed; (64,) flat, or (1, 8, 8) for
  the image families. All of its ~1,080 training samples are used (``train`` does not apply).
- ``chars``: windows of the standard library's source (``esper_core.datasets.chars``) at offsets
  drawn from the task's seed; next-character targets for the causal decoder.
- ``gaussians``: a mixture with ``MODES`` Gaussian modes per class whose means are mutually
  orthogonal at the same distance ``separation`` (in units of the noise's standard deviation)
  from every other: the difficulty is set exactly (two modes are confused with probability
  ``Phi(-separation / 2)``), and a class of several modes is not linearly separable.
- ``teacher``: labels are the argmax of a random one-hidden-layer tanh network of
  ``teacher_width`` units on Gaussian inputs: a wider teacher draws a more intricate boundary.

Every split is deterministic in the task (same task, same tensors), and nothing touches the
global random state: the synthetic tasks draw from their own ``torch.Generator``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch.utils.data import TensorDataset

from esper_core.data import DataSplits
from esper_core.datasets.chars import VOCAB_SIZE, CharCorpusConfig, load_chars
from esper_core.datasets.mnist1d import MNIST1DConfig, load_mnist1d

TaskName = Literal["mnist1d", "digits", "chars", "gaussians", "teacher"]
TASKS: tuple[TaskName, ...] = get_args(TaskName)

SYNTHETIC_FEATURES = 32
"""Input features of the synthetic tasks."""
SYNTHETIC_CLASSES = 8
"""Classes of the synthetic tasks."""
MODES = 2
"""Gaussian modes per class of ``gaussians`` (``MODES * SYNTHETIC_CLASSES <= SYNTHETIC_FEATURES``
keeps every pair of means orthogonal)."""
VAL_SAMPLES = 500
"""Validation samples of ``mnist1d``, ``gaussians`` and ``teacher`` (windows of ``chars``)."""
TEST_SAMPLES = 1000
"""Test samples of ``mnist1d``, ``gaussians`` and ``teacher`` (windows of ``chars``)."""
CHARS_CONTEXT = 32
"""Characters per ``chars`` window: the decoder's context."""

# Salts of the synthetic tasks' streams, so that a split never shares its draw with another.
_SALTS = {"structure": 0, "train": 1, "val": 2, "test": 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooTask:
    """One data set of the zoo, fixed by its name, seed and size.

    Attributes:
        name: Which generator (see the module's docstring).
        seed: Seed of the draw: MNIST-1D's generation, the digits' split, the chars' window
            offsets, or the synthetic task's structure and samples.
        train: Training samples (``mnist1d``: a multiple of 8; ignored by ``digits``, which uses
            all it has).
        separation: ``gaussians`` only: distance between any two modes' means, in noise
            standard deviations.
        teacher_width: ``teacher`` only: hidden units of the labelling network.
    """

    name: TaskName
    seed: int
    train: int = 1000
    separation: float = 0.0
    teacher_width: int = 0

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"task name must be one of {TASKS}, got {self.name!r}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"task seed must lie in [0, 2**32) (MNIST-1D's generator takes no other), got {self.seed}")
        if self.train < 8:
            raise ValueError(f"train must be >= 8 samples, got {self.train}")
        if self.name == "mnist1d" and self.train % 8:
            raise ValueError(
                f"an mnist1d task's train must be a multiple of 8 (its generator draws equal classes), "
                f"got {self.train}: use {self.train - self.train % 8 or 8}"
            )
        if (self.name == "gaussians") != (self.separation > 0):
            raise ValueError(
                "separation is the gaussians task's difficulty and only its: give gaussians a separation > 0 "
                f"(e.g. 3.0), any other task 0.0; got {self.name} with separation {self.separation}"
            )
        if (self.name == "teacher") != (self.teacher_width > 0):
            raise ValueError(
                "teacher_width is the teacher task's difficulty and only its: give teacher a width >= 1 "
                f"(e.g. 16), any other task 0; got {self.name} with teacher_width {self.teacher_width}"
            )

    @property
    def label(self) -> str:
        """A short name for reports: the generator and its difficulty, e.g. ``gaussians-sep3``."""
        if self.name == "gaussians":
            return f"gaussians-sep{self.separation:g}"
        if self.name == "teacher":
            return f"teacher-w{self.teacher_width}"
        return self.name

    @property
    def num_classes(self) -> int:
        """Classes of a classification task; the chars vocabulary for ``chars``."""
        if self.name in ("gaussians", "teacher"):
            return SYNTHETIC_CLASSES
        return VOCAB_SIZE if self.name == "chars" else 10

    def load(self, *, image: bool = False) -> DataSplits:
        """The task's three splits (``image``: digits as (1, 8, 8) images, else flat).

        MNIST-1D and chars are cached under ``$ESPER_HOME/cache/datasets`` on first use.
        """
        if self.name == "mnist1d":
            mnist = load_mnist1d(
                MNIST1DConfig(num_train=self.train, num_val=VAL_SAMPLES, num_test=TEST_SAMPLES, seed=self.seed)
            )
            return _splits(mnist.train, mnist.val, mnist.test, num_classes=10)
        if self.name == "chars":
            chars = load_chars(
                CharCorpusConfig(
                    context=CHARS_CONTEXT,
                    train_windows=self.train,
                    val_windows=VAL_SAMPLES,
                    test_windows=TEST_SAMPLES,
                    seed=self.seed,
                )
            )
            return _splits(chars.train, chars.val, chars.test, num_classes=None)
        if self.name == "digits":
            return _digits(self.seed, image=image)
        sample = (
            _gaussians(self.seed, self.separation)
            if self.name == "gaussians"
            else _teacher(self.seed, self.teacher_width)
        )
        parts = {split: sample(n, _stream(self.seed, split)) for split, n in _sizes(self.train).items()}
        return _splits(parts["train"], parts["val"], parts["test"], num_classes=SYNTHETIC_CLASSES)


Sampler = functools.partial[tuple[torch.Tensor, torch.Tensor]]


def _sizes(train: int) -> dict[str, int]:
    return {"train": train, "val": VAL_SAMPLES, "test": TEST_SAMPLES}


def _stream(seed: int, salt: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + _SALTS[salt])


def _splits(
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    num_classes: int | None,
) -> DataSplits:
    return DataSplits(
        train=TensorDataset(*train), val=TensorDataset(*val), test=TensorDataset(*test), num_classes=num_classes
    )


def _digits(seed: int, *, image: bool) -> DataSplits:
    # Imported here: scikit-learn costs ~0.5 s to import and only this task needs it.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float32) / 16.0  # (N, 64), pixel values 0..16
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    if image:
        x = x.view(-1, 1, 8, 8)
    # 60 / 20 / 20, as the bundled ``digits`` data set of ``esper_core.data`` splits them.
    n_val = n_test = len(y) // 5
    n_train = len(y) - n_val - n_test
    return _splits(
        (x[:n_train], y[:n_train]),
        (x[n_train : n_train + n_val], y[n_train : n_train + n_val]),
        (x[n_train + n_val :], y[n_train + n_val :]),
        num_classes=10,
    )


def gaussian_means(seed: int, separation: float) -> torch.Tensor:
    """The ``gaussians`` task's mode means, (MODES * K, F): mode m belongs to class m mod K.

    Orthonormal directions (rows of Q from a Gaussian matrix's QR) scaled by separation / sqrt(2),
    so that every two means are exactly ``separation`` apart.
    """
    gen = _stream(seed, "structure")
    basis, _ = torch.linalg.qr(torch.randn(SYNTHETIC_FEATURES, SYNTHETIC_FEATURES, generator=gen))
    return basis[: MODES * SYNTHETIC_CLASSES] * (separation / math.sqrt(2.0))


def _gaussians(seed: int, separation: float) -> Sampler:
    """A sampler of the mixture: ``MODES`` modes a class, every pair of means ``separation`` apart."""
    return functools.partial(_sample_gaussians, gaussian_means(seed, separation))


def _sample_gaussians(means: torch.Tensor, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    mode = torch.randint(0, len(means), (n,), generator=gen)
    x = means[mode] + torch.randn(n, SYNTHETIC_FEATURES, generator=gen)
    return x, mode % SYNTHETIC_CLASSES  # mode m belongs to class m mod K


def _teacher(seed: int, width: int) -> Sampler:
    """A sampler labelled by a random ``F -> width -> K`` tanh network (unit-variance pre-activations)."""
    gen = _stream(seed, "structure")
    w1 = torch.randn(SYNTHETIC_FEATURES, width, generator=gen) / math.sqrt(SYNTHETIC_FEATURES)
    w2 = torch.randn(width, SYNTHETIC_CLASSES, generator=gen) / math.sqrt(width)
    return functools.partial(_sample_teacher, w1, w2)


def _sample_teacher(
    w1: torch.Tensor, w2: torch.Tensor, n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, SYNTHETIC_FEATURES, generator=gen)
    return x, (torch.tanh(x @ w1) @ w2).argmax(dim=1)
