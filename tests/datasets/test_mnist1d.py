"""MNIST-1D generation and its cache: the published data, determinism, splits, no network."""

from __future__ import annotations

import hashlib
import random
import socket
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from esper_core.datasets import MNIST1DConfig, MNIST1DData, generate_mnist1d, load_mnist1d, mnist1d_cache_path
from esper_core.datasets.cache import CorruptCacheWarning
from esper_core.settings import EsperSettings

# A small draw: 100 base signals (80 train, 20 test), fast to generate (~0.1 s).
SMALL = dict(num_train=80, num_val=30, num_test=20, seed=7)

# SHA-256 over x (float32) and y (int64) of train then test of the authors' mnist1d_data.pkl
# (greydanus/mnist1d, the published 4,000 / 1,000 data set), taken once from that file.
PUBLISHED_SHA256 = "b09ad3e22c854bc5a1948b85c373aab653ceb38c9170f5ed05b7d054e4160db9"


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _as_arrays(data: MNIST1DData) -> dict[str, np.ndarray]:
    return {f"{c}_{s}": getattr(data, s)[i].numpy() for s in ("train", "val", "test") for i, c in enumerate("xy")}


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"num_train": 100}, "multiple of 8"),
        ({"num_train": 0}, "multiple of 8"),
        ({"num_val": -1}, "num_val must be >= 0"),
        ({"num_test": 0}, "num_test must be >= 1"),
        ({"seed": -1}, r"seed must lie in \[0, 2\*\*32\)"),
        ({"seed": 2**32}, r"seed must lie in \[0, 2\*\*32\)"),
    ],
)
def test_bad_config_is_refused_with_the_fix(fields: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MNIST1DConfig(**fields)


def test_default_config_is_the_published_split_sizes() -> None:
    config = MNIST1DConfig()
    assert (config.num_train, config.num_test, config.seed) == (4000, 1000, 42)
    assert config.is_published
    assert not MNIST1DConfig(seed=1).is_published


def test_generation_follows_make_dataset_exactly() -> None:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = 100, 7
    reference = make_dataset(args)
    ours = generate_mnist1d(MNIST1DConfig(**SMALL))
    assert np.array_equal(ours["x_train"], reference["x"].astype(np.float32))
    assert np.array_equal(ours["y_train"], reference["y"])
    assert np.array_equal(ours["x_test"], reference["x_test"].astype(np.float32))
    assert np.array_equal(ours["y_test"], reference["y_test"])


def test_a_larger_test_set_keeps_train_and_extends_test() -> None:
    small = generate_mnist1d(MNIST1DConfig(**SMALL))
    large = generate_mnist1d(MNIST1DConfig(**{**SMALL, "num_test": 60}))
    assert np.array_equal(large["x_train"], small["x_train"])
    assert np.array_equal(large["x_val"], small["x_val"])
    assert np.array_equal(large["x_test"][:20], small["x_test"])
    extra = large["x_test"][20:]
    assert extra.shape == (40, 40)
    # Fresh signals, standardised like the base draw (mean ~0, std ~1), not copies of it.
    assert not any(np.array_equal(row, seen) for row in extra for seen in large["x_train"])
    assert abs(float(extra.mean())) < 0.3 and 0.7 < float(extra.std()) < 1.3
    assert set(large["y_test"][20:].tolist()) == set(range(10))


def test_fewer_test_signals_than_the_base_draw_are_its_prefix() -> None:
    full = generate_mnist1d(MNIST1DConfig(**SMALL))
    cut = generate_mnist1d(MNIST1DConfig(**{**SMALL, "num_test": 5, "num_val": 0}))
    assert np.array_equal(cut["x_test"], full["x_test"][:5])
    assert cut["x_val"].shape == (0, 40) and cut["y_val"].shape == (0,)


def test_validation_is_its_own_draw() -> None:
    arrays = generate_mnist1d(MNIST1DConfig(**SMALL))
    pool = np.concatenate([arrays["x_train"], arrays["x_test"]])
    assert not any(np.array_equal(row, seen) for row in arrays["x_val"] for seen in pool)
    other_seed = generate_mnist1d(MNIST1DConfig(**{**SMALL, "seed": 8}))
    assert not np.array_equal(other_seed["x_val"], arrays["x_val"])


def test_generation_leaves_the_global_rngs_as_they_were() -> None:
    random.seed(123)
    np.random.seed(123)
    before = (random.random(), np.random.rand())
    random.seed(123)
    np.random.seed(123)
    generate_mnist1d(MNIST1DConfig(**SMALL))
    assert (random.random(), np.random.rand()) == before


def test_load_caches_under_esper_home_and_reads_back_identical(esper_home: EsperSettings) -> None:
    config = MNIST1DConfig(**SMALL)
    first = load_mnist1d(config)
    path = esper_home.home / "cache" / "datasets" / first.cache_path.name
    assert first.cache_path == path == mnist1d_cache_path(config)
    assert path.name.startswith("mnist1d-") and path.suffix == ".npz" and len(path.stem) == len("mnist1d-") + 16
    assert path.is_file() and not first.from_cache
    second = load_mnist1d(config)
    assert second.from_cache
    assert _same(_as_arrays(first), _as_arrays(second))
    assert _same(_as_arrays(second), generate_mnist1d(config))
    x, y = second.train
    assert x.dtype == torch.float32 and x.shape == (80, 40)
    assert y.dtype == torch.int64 and y.shape == (80,)
    assert [t[0].shape[0] for t in (second.val, second.test)] == [30, 20]
    assert not list(path.parent.glob("*.tmp")), "a finished write leaves no temporary file"


def test_every_field_of_the_config_changes_the_cache_file(tmp_path: Path) -> None:
    base = MNIST1DConfig(**SMALL)
    paths = {mnist1d_cache_path(base, home=tmp_path)}
    for field, value in (("num_train", 88), ("num_val", 31), ("num_test", 21), ("seed", 8)):
        paths.add(mnist1d_cache_path(MNIST1DConfig(**{**SMALL, field: value}), home=tmp_path))
    assert len(paths) == 5
    assert mnist1d_cache_path(base, home=tmp_path) == mnist1d_cache_path(MNIST1DConfig(**SMALL), home=tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong-shape"])
def test_a_corrupt_cache_file_is_rebuilt_with_a_warning(tmp_path: Path, damage: str) -> None:
    config = MNIST1DConfig(**SMALL)
    good = _as_arrays(load_mnist1d(config, home=tmp_path))
    path = mnist1d_cache_path(config, home=tmp_path)
    if damage == "garbage":
        path.write_bytes(b"not an npz file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        np.savez(path, **{**good, "x_train": good["x_train"][:10]})
    with pytest.warns(CorruptCacheWarning, match="rebuilding it"):
        rebuilt = load_mnist1d(config, home=tmp_path)
    assert not rebuilt.from_cache
    assert _same(_as_arrays(rebuilt), good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_mnist1d(config, home=tmp_path).from_cache  # the rebuilt file reads cleanly


def test_generation_never_touches_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access during MNIST-1D generation: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    import mnist1d.data

    # The package's download path would also reach the network through requests.
    monkeypatch.setattr(mnist1d.data, "get_dataset", refuse)
    data = load_mnist1d(MNIST1DConfig(**SMALL), home=tmp_path)
    assert not data.from_cache and data.train[0].shape == (80, 40)


@pytest.mark.slow
def test_the_default_config_is_the_published_data_set(tmp_path: Path) -> None:
    data = load_mnist1d(MNIST1DConfig(num_val=0), home=tmp_path)  # ~5 s: 5,000 signals
    digest = hashlib.sha256()
    for tensor in (*data.train, *data.test):
        digest.update(tensor.numpy().tobytes())
    assert digest.hexdigest() == PUBLISHED_SHA256
    assert np.bincount(data.train[1].numpy(), minlength=10).min() > 350  # all ten classes, shuffled
