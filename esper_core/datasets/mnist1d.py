"""MNIST-1D (Greydanus & Kobak), generated locally with the ``mnist1d`` package and cached.

MNIST-1D turns ten hand-drawn 1-D digit templates into length-40 signals through random padding,
scaling, translation, correlated and i.i.d. noise and shear. The package's ``make_dataset``
draws ``num_samples`` signals class by class from one seed of NumPy's global RNG, shuffles them,
standardises them with the whole set's mean and std, and cuts them 80 / 20 into train and test.
With its defaults (5,000 samples, seed 42) that is the published data set: 4,000 train and
1,000 test signals, equal in float32 to the authors' ``mnist1d_data.pkl`` (checked by a test
against that file's fingerprint). Nothing here downloads anything; the package's download path
(``get_dataset``) is never called.

How the splits are made, for ``MNIST1DConfig(num_train=T, num_val=V, num_test=S, seed=s)``:

- *base*: ``make_dataset``'s procedure with ``num_samples = T * 5 / 4`` and seed ``s``; train is
  its first 80 % (T signals), its last 20 % (T / 4) start the test split. ``T = 4000, s = 42`` is
  the published data. We run the package's own sampler (``mnist1d.transform.transform`` on
  ``mnist1d.data.get_templates()``) in ``make_dataset``'s order rather than calling
  ``make_dataset`` itself, because the extra splits below must be standardised with the base's
  raw mean and std, which ``make_dataset`` does not return; a test checks that the two agree.
- *test*: the base's T / 4 test signals, cut to S if S is smaller; if S is larger, the rest is
  drawn from an independent seed stream of the same generator. So a 10,000-signal test set
  starts with the published 1,000 and the train split never changes with S.
- *validation*: V signals from another independent seed stream. Carving them out of the 4,000
  training signals would train on fewer signals than the paper and make its table (logistic
  regression 32 %, MLP 68 %, CNN 94 %) incomparable; a separate draw keeps train exactly the
  published one and keeps validation independent of test.

Extra draws are standardised with the base's raw mean and std (not their own), so every split
comes from one distribution. The generator is slow (~1 ms per signal on one core), so results
are cached under ``$ESPER_HOME/cache/datasets/mnist1d-<hash>.npz``; see ``cache.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from esper_core.datasets.cache import Arrays, load_or_build, split_tensors
from esper_core.determinism import capture_rng, restore_rng
from esper_core.settings import EsperSettings

log = logging.getLogger(__name__)

PUBLISHED_NUM_TRAIN = 4000
PUBLISHED_NUM_TEST = 1000
PUBLISHED_SEED = 42
SEQ_LEN = 40
NUM_CLASSES = 10
SPLITS = ("train", "val", "test")

# Bump when the arrays a config maps to change (the procedure above, the file layout): old
# cache files then stop matching by name instead of being read as the new data.
_FORMAT_VERSION = 1
# Seed streams of the extra draws, mixed with the config's seed by NumPy's SeedSequence.
_STREAMS = {"val": 1, "test": 2}
_TRAIN_SHARE = 0.8  # make_dataset's train_split


@dataclass(kw_only=True, slots=True)
class MNIST1DConfig:
    """Sizes and generation seed of an MNIST-1D data set; the defaults are the published one."""

    num_train: int = PUBLISHED_NUM_TRAIN
    """Training signals: the first 80 % of a ``make_dataset`` draw of ``num_train * 5 / 4``
    signals (a multiple of 8, so the draw has equal classes and an exact 80 / 20 cut)."""
    num_val: int = 1000
    """Validation signals, drawn separately from the same generator (0: an empty split)."""
    num_test: int = PUBLISHED_NUM_TEST
    """Test signals: the draw's last 20 % first, then extra signals from the same generator."""
    seed: int = PUBLISHED_SEED
    """Seed of the generation (``make_dataset``'s ``seed``; 42 is the published data)."""

    def __post_init__(self) -> None:
        if self.num_train < 8 or self.num_train % 8:
            raise ValueError(
                f"num_train must be a positive multiple of 8 (the 80 % of a draw of 10 equal classes), "
                f"got {self.num_train}; the published data set has num_train=4000"
            )
        if self.num_val < 0:
            raise ValueError(f"num_val must be >= 0 (0: no validation split), got {self.num_val}")
        if self.num_test < 1:
            raise ValueError(f"num_test must be >= 1, got {self.num_test}; the published test split has 1000")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must lie in [0, 2**32) (NumPy's legacy seeding), got {self.seed}")

    @property
    def is_published(self) -> bool:
        """Whether train and the first 1,000 test signals are the published data set."""
        return self.num_train == PUBLISHED_NUM_TRAIN and self.seed == PUBLISHED_SEED


@dataclass(frozen=True, kw_only=True, slots=True)
class MNIST1DData:
    """The splits as ``(x, y)``: ``x`` (N, 40) float32 signals, ``y`` (N,) int64 labels 0..9."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    cache_path: Path
    from_cache: bool
    """Whether the arrays were read from ``cache_path`` (False: generated by this call)."""


def mnist1d_cache_path(config: MNIST1DConfig, *, home: str | Path | None = None) -> Path:
    """Where ``load_mnist1d`` caches ``config``'s arrays.

    Args:
        config: The data set.
        home: ``ESPER_HOME``; default: the ``ESPER_HOME`` setting (``./.esper``).

    Returns:
        ``<home>/cache/datasets/mnist1d-<hash>.npz``, the hash covering the config, the
        ``mnist1d`` package version and this module's format version.
    """
    root = EsperSettings(home=Path(home)).home if home is not None else EsperSettings().home
    key = {"format": _FORMAT_VERSION, "mnist1d": version("mnist1d"), **asdict(config)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / "cache" / "datasets" / f"mnist1d-{digest}.npz"


def load_mnist1d(config: MNIST1DConfig | None = None, *, home: str | Path | None = None) -> MNIST1DData:
    """MNIST-1D for ``config``, from the cache or generated (then cached) without any network.

    Args:
        config: Sizes and seed; default: the published 4,000 / 1,000 data and 1,000 validation
            signals.
        home: ``ESPER_HOME``; default: the ``ESPER_HOME`` setting.

    Returns:
        The three splits as CPU tensors, identical for equal configs whether read or generated.
    """
    config = config if config is not None else MNIST1DConfig()
    path = mnist1d_cache_path(config, home=home)
    arrays, from_cache = load_or_build(path, lambda: generate_mnist1d(config), check=_checker(config))

    return MNIST1DData(
        train=split_tensors(arrays, "train"),
        val=split_tensors(arrays, "val"),
        test=split_tensors(arrays, "test"),
        cache_path=path,
        from_cache=from_cache,
    )


def generate_mnist1d(config: MNIST1DConfig) -> Arrays:
    """Generate ``config``'s splits (no cache): ``x_<split>`` (N, 40) float32, ``y_<split>`` (N,) int64.

    Uses NumPy's global RNG, as the ``mnist1d`` package does, and restores every global RNG state
    afterwards so loading data never shifts a run's own random stream.
    """
    num_base = config.num_train * 5 // 4
    log.info(
        "generating MNIST-1D: %d + %d + %d signals (about 1 ms each)", config.num_train, config.num_val, config.num_test
    )
    saved = capture_rng()
    try:
        x_base, y_base = _draw(num_base, seed=config.seed)
        # make_dataset standardises with the statistics of the whole draw, train and test alike.
        mean, std = x_base.mean(), x_base.std()
        x_base = (x_base - mean) / std
        x_test, y_test = x_base[config.num_train :][: config.num_test], y_base[config.num_train :][: config.num_test]
        extra_test = config.num_test - len(y_test)
        if extra_test > 0:
            x_more, y_more = _draw(extra_test, seed=_stream_seed(config.seed, "test"))
            x_test = np.concatenate([x_test, (x_more - mean) / std])
            y_test = np.concatenate([y_test, y_more])
        x_val, y_val = _draw(config.num_val, seed=_stream_seed(config.seed, "val"))
        x_val = (x_val - mean) / std
    finally:
        restore_rng(saved)
    arrays = {
        "x_train": x_base[: config.num_train],
        "y_train": y_base[: config.num_train],
        "x_val": x_val,
        "y_val": y_val,
        "x_test": x_test,
        "y_test": y_test,
    }
    return {k: (a.astype(np.float32) if k[0] == "x" else a.astype(np.int64)) for k, a in arrays.items()}


def _draw(num: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``num`` raw (unstandardised) signals as ``make_dataset`` draws them: seed the global RNGs,
    ``ceil(num / 10)`` signals per class in class order, one shuffle; the first ``num`` kept."""
    # Imported here: the package pulls in scipy, requests and matplotlib.pyplot at import (~1 s)
    # and only generation needs it; a cache hit never pays for it.
    from mnist1d.data import get_dataset_args, get_templates
    from mnist1d.transform import transform
    from mnist1d.utils import set_seed

    if num == 0:
        return np.zeros((0, SEQ_LEN)), np.zeros((0,), dtype=np.int64)
    args = get_dataset_args()
    templates = get_templates()
    per_class = math.ceil(num / NUM_CLASSES)
    set_seed(seed)  # python's random and NumPy's global RNG, as make_dataset does
    xs, ys = [], []
    for label in range(NUM_CLASSES):
        for _ in range(per_class):
            x, _ = transform(templates["x"][label], templates["t"], args)
            xs.append(x)
            ys.append(templates["y"][label])
    order = np.random.permutation(len(ys))
    return np.stack(xs)[order][:num], np.stack(ys)[order][:num]


def _stream_seed(seed: int, stream: str) -> int:
    # SeedSequence mixes (seed, stream) into well-separated seeds: seed 42's validation draw is
    # not seed 43's base draw, as seed + 1 would make it.
    return int(np.random.SeedSequence([seed, _STREAMS[stream]]).generate_state(1)[0])


def _checker(config: MNIST1DConfig) -> Callable[[Arrays], None]:
    """What a cache file of ``config`` must hold: six arrays of the config's sizes and dtypes."""
    sizes = {"train": config.num_train, "val": config.num_val, "test": config.num_test}

    def check(arrays: Arrays) -> None:
        expected = {f"x_{s}" for s in SPLITS} | {f"y_{s}" for s in SPLITS}
        if set(arrays) != expected:
            raise ValueError(f"arrays {sorted(arrays)} are not {sorted(expected)}")
        for split, n in sizes.items():
            x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
            if x.shape != (n, SEQ_LEN) or x.dtype != np.float32:
                raise ValueError(f"x_{split} is {x.dtype}{x.shape}, expected float32({n}, {SEQ_LEN})")
            if y.shape != (n,) or y.dtype != np.int64:
                raise ValueError(f"y_{split} is {y.dtype}{y.shape}, expected int64({n},)")

    return check
