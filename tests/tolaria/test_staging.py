"""Batch staging: every path yields the resident path's batches; CUDA-only options are guarded."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper_core.data import DataConfig, load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_trainer
from esper_core.tolaria.staging import BatchSource, LoaderConfig
from tests.helpers.recipes import eager_recipe
from tests.helpers.runif import devices, requires_cuda

CPU = torch.device("cpu")


def _batches(config: LoaderConfig, device: torch.device = CPU) -> list[tuple[torch.Tensor, torch.Tensor]]:
    split = load_dataset(DataConfig(name="digits")).train
    source = BatchSource(split, device=device, batch_size=64, seed=3, config=config)
    return [(x.cpu(), y.cpu()) for x, y in source.epoch(2)]


def test_dataloader_workers_reproduce_the_resident_batches() -> None:
    resident = _batches(LoaderConfig())
    workers = _batches(LoaderConfig(num_workers=1, persistent_workers=True, prefetch_factor=2))
    assert len(workers) == len(resident) == 17
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resident, workers, strict=True))


@pytest.mark.parametrize("device", devices())
def test_training_through_workers_matches_resident_training(device: str) -> None:
    """On CUDA the workers read host memory although ``gpu_dataset`` is on (the default): the
    first GPU run found the loader pinning a split already moved to the device."""
    losses = []
    for loader in (LoaderConfig(), LoaderConfig(num_workers=1, persistent_workers=True)):
        config = eager_recipe("digits-mlp", device=device)
        config.trainer = dataclasses.replace(config.trainer, loader=loader)
        trainer = build_trainer(config, catalog=default_catalog(), run_id="t")
        losses.append([trainer.train_epoch().packet.train_loss for _ in range(2)])
    assert losses[0] == losses[1]


def test_gpu_staging_requested_on_cpu_is_reported() -> None:
    split = load_dataset(DataConfig(name="seed-reference")).train
    source = BatchSource(
        split, device=CPU, batch_size=4, seed=0, config=LoaderConfig(gpu_dataset=False, enable_gpu_prefetch=True)
    )
    assert not source.prefetch and source.resident
    assert len(list(source.epoch(0))) == 4
    copy_ms, events = source.drain()
    assert (
        copy_ms == 0.0 and events[0].name == "tolaria.staging.fallback" and events[0].attributes["reason"] == "no_cuda"
    )


def test_loader_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="need num_workers > 0"):
        LoaderConfig(persistent_workers=True)


@requires_cuda("host-resident data staged on a side stream")
def test_gpu_prefetch_matches_resident_batches_and_reports_copy_time() -> None:
    device = torch.device("cuda")
    resident = _batches(LoaderConfig(), device)
    split = load_dataset(DataConfig(name="digits")).train
    source = BatchSource(
        split, device=device, batch_size=64, seed=3, config=LoaderConfig(gpu_dataset=False, enable_gpu_prefetch=True)
    )
    staged = [(x.cpu(), y.cpu()) for x, y in source.epoch(2)]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(resident, staged, strict=True))
    copy_ms, _ = source.drain()
    assert copy_ms > 0


@requires_cuda("a split moved to a CUDA device it is already on")
def test_a_split_already_on_cuda_stays_put() -> None:
    """``torch.device('cuda')`` is not equal to a tensor's ``cuda:0``: moving a split there again
    must not try to pin device memory (every CUDA trainer did, until a GPU run found it)."""
    once = load_dataset(DataConfig(name="digits")).train.to(torch.device("cuda"))
    again = once.to(torch.device("cuda"))
    assert again.x.data_ptr() == once.x.data_ptr() and again.y.data_ptr() == once.y.data_ptr()


def test_split_seed_fixes_the_test_split_across_run_seeds() -> None:
    a = load_dataset(DataConfig(name="digits", seed=1, split_seed=0))
    b = load_dataset(DataConfig(name="digits", seed=2, split_seed=0))
    c = load_dataset(DataConfig(name="digits", seed=2))
    assert torch.equal(a.test.x, b.test.x) and torch.equal(a.test.y, b.test.y)
    assert not torch.equal(b.test.x, c.test.x)  # without it the split follows the run's seed
