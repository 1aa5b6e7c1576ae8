"""The MNIST-1D static-accuracy benchmark's parts (accuracies themselves belong to the bench run)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.mnist1d import (
    MNIST1DBenchConfig,
    TrainRecipe,
    accuracy,
    bootstrap_ci,
    build_model,
    cli,
    format_table,
    run,
    train_static,
)
from esper_core.datasets import MNIST1DConfig, load_mnist1d
from esper_core.settings import EsperSettings
from esper_core.telemetry import load_baseline


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"seeds": 0}, "seeds must be >= 1"),
        ({"epochs": 0}, "epochs must be >= 1"),
        ({"hosts": ("rnn",)}, "hosts must be a non-empty subset"),
        ({"hosts": ()}, "hosts must be a non-empty subset"),
        ({"hosts": ("logistic",), "frontier": True}, "add one of them to hosts"),
        ({"num_test": 0}, "num_test must be >= 1"),
        ({"threads": 0}, "threads must be >= 1"),
    ],
)
def test_bad_bench_config_is_refused(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MNIST1DBenchConfig(**fields)  # type: ignore[arg-type]


def test_bootstrap_interval_brackets_the_mean() -> None:
    values = [0.90, 0.92, 0.95, 0.91, 0.93]
    low, high = bootstrap_ci(values)
    assert min(values) <= low < sum(values) / len(values) < high <= max(values)
    assert bootstrap_ci(values) == (low, high)  # fixed resampling RNG
    assert bootstrap_ci([0.5]) == (0.5, 0.5)
    assert bootstrap_ci([0.5, 0.5]) == (0.5, 0.5)


def test_default_widths_are_the_papers() -> None:
    assert sum(p.numel() for p in build_model("cnn", None).parameters()) == 5210
    assert sum(p.numel() for p in build_model("mlp", None).parameters()) == 15210
    assert build_model("cnn", 8).conv1.out_channels == 8


def test_training_improves_a_host_on_mnist1d(tmp_path: Path) -> None:
    data = load_mnist1d(MNIST1DConfig(num_train=400, num_val=0, num_test=100, seed=1), home=tmp_path)
    torch.manual_seed(0)
    model = build_model("cnn", 8)
    before = accuracy(model, *data.train)
    epoch_ms = train_static(model, data.train, TrainRecipe(epochs=12, lr=1e-2, batch_size=25), seed=0)
    assert len(epoch_ms) == 12 and all(ms > 0 for ms in epoch_ms)
    assert accuracy(model, *data.train) > max(before + 0.2, 0.3)  # chance: 0.1


@pytest.mark.slow
def test_one_epoch_run_prints_a_table_and_writes_a_baseline(esper_home: EsperSettings, tmp_path: Path) -> None:
    result = run(MNIST1DBenchConfig(seeds=2, epochs=1, hosts=("logistic", "cnn")))
    assert [r["host"] for r in result["rows"]] == ["logistic", "cnn"]
    cnn = result["rows"][1]
    assert cnn["width"] == 25 and cnn["params"] == 5210 and cnn["paper"] == 0.94
    assert len(cnn["accuracy"]) == 2 and len(cnn["epoch_ms"]) == 2
    assert "ours: mean [95% CI over seeds]" in format_table(result)

    path = tmp_path / "baseline.json"
    args = SimpleNamespace(
        seeds=1, num_test=1000, epochs=1, hosts=["mlp"], frontier=True, threads=None, json=True, save_baseline=path
    )
    assert cli(args) == 0
    baseline = load_baseline(path)
    assert [r["width"] for r in baseline["extra"]["rows"]] == [16, 32, 64]
    assert set(baseline["latency"]) == {"mlp-w16-epoch", "mlp-w32-epoch", "mlp-w64-epoch"}
