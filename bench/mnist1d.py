"""mnist1d: do Esper's static MNIST-1D hosts land on the paper's accuracies?

Trains, with plain PyTorch and no Esper machinery, the three models of the MNIST-1D paper's
table (Greydanus & Kobak; greydanus/mnist1d) on the published data (4,000 train signals; test:
the published 1,000, or more drawn from the same generator with ``num_test``):

==============  =======================  =============
host            ours                     paper
==============  =======================  =============
``logistic``    ``MNIST1DLogistic``      32 %
``mlp``         ``MNIST1DMLP(width=100)``  68 %
``cnn``         ``MNIST1DCNN(channels=25)`` 94 %
==============  =======================  =============

Each model trains from ``seeds`` initialisations (seed ``s`` also orders the batches) with Adam
and a cosine learning-rate decay to zero (``RECIPES``: the fewest epochs that reach the paper's
numbers), and is scored once, after its last epoch, on the test split. Reported per host: test
accuracy per seed, their mean with a 95 % percentile-bootstrap interval over seeds, the
binomial half-width of one run's accuracy on this test-set size, parameters and wall time per
epoch. With ``frontier`` the MLP and the CNN train at the narrower widths of ``FRONTIER`` instead, the
capacity curve a growing network starts from (run it as well as the default for the full curve).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from esper_core.data import epoch_order
from esper_core.datasets import MNIST1DConfig, load_mnist1d
from esper_core.models import MNIST1DCNN, MNIST1DMLP, MNIST1DLogistic

PAPER_ACCURACY = {"logistic": 0.32, "mlp": 0.68, "cnn": 0.94}
"""Test accuracies of the paper's table (README of greydanus/mnist1d)."""
DEFAULT_WIDTH = {"logistic": None, "mlp": 100, "cnn": 25}
FRONTIER = {"mlp": (16, 32, 64), "cnn": (4, 8, 16)}
"""Narrower widths (MLP hidden units, CNN channels) than the paper's: the capacity frontier."""


@dataclass(kw_only=True, slots=True)
class TrainRecipe:
    """How one host trains: Adam at ``lr`` decayed to 0 by a per-step cosine over ``epochs``."""

    epochs: int
    lr: float
    batch_size: int

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"epochs, batch_size and lr must be positive, got {self}")


RECIPES = {
    "logistic": TrainRecipe(epochs=30, lr=1e-2, batch_size=100),
    "mlp": TrainRecipe(epochs=60, lr=1e-2, batch_size=100),
    "cnn": TrainRecipe(epochs=60, lr=1e-2, batch_size=100),
}


@dataclass(kw_only=True, slots=True)
class MNIST1DBenchConfig:
    """Options of the MNIST-1D static-accuracy benchmark."""

    seeds: int = 5
    """Initialisation seeds per host (0 .. seeds - 1)."""
    num_test: int = 1000
    """Test signals: the published 1,000 first, then more from the same generator."""
    epochs: int | None = None
    """Epochs of every host (None: each host's ``RECIPES`` entry)."""
    hosts: tuple[str, ...] = tuple(PAPER_ACCURACY)
    """Which of ``logistic``, ``mlp``, ``cnn`` to train."""
    frontier: bool = False
    """Train the hosts at the widths of ``FRONTIER`` instead of the paper's (logistic has none)."""
    threads: int | None = None
    """``torch.set_num_threads`` for the run (None: leave torch's default)."""

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1 (or None for each host's own), got {self.epochs}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        unknown = sorted(set(self.hosts) - set(PAPER_ACCURACY))
        if unknown or not self.hosts:
            raise ValueError(f"hosts must be a non-empty subset of {tuple(PAPER_ACCURACY)}, got {self.hosts}")
        if self.frontier and not set(self.hosts) & set(FRONTIER):
            raise ValueError(f"frontier trains {tuple(FRONTIER)} at other widths; add one of them to hosts")
        MNIST1DConfig(num_test=self.num_test)  # validates num_test


def build_model(host: str, width: int | None) -> nn.Module:
    """The static host ``host`` (``logistic``, ``mlp``, ``cnn``) at ``width`` (None: the paper's)."""
    width = width if width is not None else DEFAULT_WIDTH[host]
    if host == "logistic":
        return MNIST1DLogistic()
    if host == "mlp":
        return MNIST1DMLP(width=width)
    if host == "cnn":
        return MNIST1DCNN(channels=width)
    raise ValueError(f"host must be one of {tuple(PAPER_ACCURACY)}, got {host!r}")


def train_static(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    recipe: TrainRecipe,
    *,
    seed: int,
) -> list[float]:
    """Train ``model`` in place with plain PyTorch; returns the wall time of each epoch in ms.

    Batches follow ``esper_core.data.epoch_order(seed, epoch)``, the order Tolaria uses, so an
    Esper run of the same recipe sees the same batches.
    """
    x_train, y_train = train
    steps_per_epoch = math.ceil(len(y_train) / recipe.batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=recipe.epochs * steps_per_epoch)
    model.train()
    epoch_ms = []
    for epoch in range(recipe.epochs):
        start = time.perf_counter()
        order = epoch_order(len(y_train), seed=seed, epoch=epoch)
        for first in range(0, len(y_train), recipe.batch_size):
            index = order[first : first + recipe.batch_size]
            loss = nn.functional.cross_entropy(model(x_train[index]), y_train[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        epoch_ms.append((time.perf_counter() - start) * 1e3)
    return epoch_ms


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of ``x`` that ``model`` classifies as ``y``."""
    model.eval()
    return float((model(x).argmax(dim=1) == y).float().mean())


def bootstrap_ci(values: list[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (10,000 resamples, fixed RNG)."""
    if len(values) < 2 or len(set(values)) == 1:
        return min(values), max(values)  # nothing to resample: the interval is the values' range
    # Imported here: scipy costs ~0.3 s to import and only the summary needs it.
    from scipy.stats import bootstrap

    result = bootstrap(
        (np.asarray(values),),
        np.mean,
        confidence_level=confidence,
        n_resamples=10_000,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def run(config: MNIST1DBenchConfig) -> dict[str, Any]:
    """Train every host over the seeds; returns one row per (host, width) and the setup."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    data = load_mnist1d(MNIST1DConfig(num_val=0, num_test=config.num_test))
    x_test, y_test = data.test
    if config.frontier:
        arms = [(host, w) for host in config.hosts for w in FRONTIER.get(host, ())]
    else:
        arms = [(host, None) for host in config.hosts]
    rows = []
    start = time.perf_counter()
    for host, width in arms:
        recipe = RECIPES[host]
        if config.epochs is not None:
            recipe = TrainRecipe(epochs=config.epochs, lr=recipe.lr, batch_size=recipe.batch_size)
        accs, published, epoch_ms = [], [], []
        for seed in range(config.seeds):
            torch.manual_seed(seed)
            model = build_model(host, width)
            epoch_ms += train_static(model, data.train, recipe, seed=seed)
            accs.append(accuracy(model, x_test, y_test))
            published.append(accuracy(model, x_test[:1000], y_test[:1000]))
        rows.append(_row(host, width, model, recipe, accs, published, epoch_ms, num_test=len(y_test)))
    return {
        "workload": "mnist1d-static",
        "num_train": len(data.train[1]),
        "num_test": len(y_test),
        "seeds": config.seeds,
        "threads": torch.get_num_threads(),
        "wall_s": time.perf_counter() - start,
        "rows": rows,
    }


def _row(
    host: str,
    width: int | None,
    model: nn.Module,
    recipe: TrainRecipe,
    accs: list[float],
    published: list[float],
    epoch_ms: list[float],
    *,
    num_test: int,
) -> dict[str, Any]:
    mean = statistics.fmean(accs)
    low, high = bootstrap_ci(accs)
    return {
        "host": host,
        "width": width if width is not None else DEFAULT_WIDTH[host],
        "default_width": width is None or width == DEFAULT_WIDTH[host],
        "params": sum(p.numel() for p in model.parameters()),
        **asdict(recipe),
        "accuracy": accs,
        "accuracy_mean": mean,
        "accuracy_ci95": [low, high],
        # One run's sampling error on this test set: the 95 % binomial half-width at the mean.
        "test_halfwidth95": 1.96 * math.sqrt(mean * (1 - mean) / num_test),
        "accuracy_published_test_mean": statistics.fmean(published),
        "paper": PAPER_ACCURACY[host] if width is None or width == DEFAULT_WIDTH[host] else None,
        "epoch_ms_median": statistics.median(epoch_ms),
        "epoch_ms": epoch_ms,
    }


def format_table(result: dict[str, Any]) -> str:
    """The rows as a text table, ours beside the paper's."""
    lines = [
        f"MNIST-1D static hosts: {result['num_train']} train / {result['num_test']} test signals, "
        f"{result['seeds']} seed(s), {result['threads']} thread(s), {result['wall_s']:.0f} s",
        f"{'host':<9}{'width':>6}{'params':>8}{'epochs':>7}  {'ours: mean [95% CI over seeds]':<32}"
        f"{'paper':>6}{'ms/epoch':>10}",
    ]
    for row in result["rows"]:
        low, high = row["accuracy_ci95"]
        ours = f"{row['accuracy_mean']:.1%} [{low:.1%}, {high:.1%}]"
        paper = f"{row['paper']:.0%}" if row["paper"] is not None else "-"
        width = row["width"] if row["width"] is not None else "-"
        lines.append(
            f"{row['host']:<9}{width:>6}{row['params']:>8}{row['epochs']:>7}  {ours:<32}{paper:>6}"
            f"{row['epoch_ms_median']:>10.1f}"
        )
    halfwidth = statistics.fmean(r["test_halfwidth95"] for r in result["rows"])
    lines.append(
        f"one run's accuracy on {result['num_test']} test signals is known to about +-{halfwidth:.1%} (95 %, binomial)"
    )
    return "\n".join(lines)


def _label(row: dict[str, Any]) -> str:
    return row["host"] if row["width"] is None else f"{row['host']}-w{row['width']}"


def cli(args: Any) -> int:
    """``esper bench mnist1d``: run, print (text or ``--json``), optionally save a baseline."""
    result = run(
        MNIST1DBenchConfig(
            seeds=args.seeds,
            num_test=args.num_test,
            epochs=args.epochs,
            hosts=tuple(args.hosts),
            frontier=args.frontier,
            threads=args.threads,
        )
    )
    if args.save_baseline:
        from esper_core.telemetry import write_baseline

        write_baseline(
            args.save_baseline,
            name="mnist1d-static",
            workload={k: v for k, v in result.items() if k != "rows"},
            latency_ms={_label(r) + "-epoch": r["epoch_ms"] for r in result["rows"]},
            device="cpu",
            extra={"rows": [{k: v for k, v in r.items() if k != "epoch_ms"} for r in result["rows"]]},
        )
    if args.json:
        headline = {**result, "rows": [{k: v for k, v in r.items() if k != "epoch_ms"} for r in result["rows"]]}
        print(json.dumps(headline, indent=2))
    else:
        print(format_table(result))
    return 0
