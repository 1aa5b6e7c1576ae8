"""seed-reference: the seeds' Phase 0 workload (Linear 16 -> 4, 16 samples, batch 4).

Times the training part of a Tolaria epoch (what ``tolaria.training.latency_ms`` reports:
steps, seed attribution, per-seed and per-layer metrics, one loss sync) against a bare PyTorch
loop over the same batches with the same optimiser, interleaved epoch by epoch so both see the
same machine state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.data import epoch_batches
from esper_core.karn.catalog import default_catalog
from esper_core.recipes import get_recipe
from esper_core.telemetry import latency_stats
from esper_core.tolaria.build import build_trainer


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """Options shared by the training benchmarks."""

    epochs: int = 200
    """Timed epochs (each path)."""
    warmup_batches: int = 20
    """Untimed steps before timing, rounded up to whole epochs."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.epochs < 5:
            raise ValueError(f"epochs must be >= 5 for a p95 to mean anything, got {self.epochs}")
        if self.warmup_batches < 0:
            raise ValueError(f"warmup_batches must be >= 0, got {self.warmup_batches}")


def run(config: BenchConfig) -> dict[str, Any]:
    """Run the benchmark and return its numbers (milliseconds per epoch)."""
    recipe = get_recipe("seed-reference", device=config.device)
    trainer = build_trainer(recipe, catalog=default_catalog(), run_id="bench-seed-reference")
    data = trainer.data
    bs = recipe.data.batch_size
    steps = math.ceil(len(data.train) / bs)

    torch.manual_seed(recipe.seed)
    bare = nn.Linear(16, 4).to(trainer.device)
    bare_opt = torch.optim.SGD(
        bare.parameters(),
        lr=recipe.trainer.lr,
        momentum=recipe.trainer.momentum,
        foreach=True if trainer.device.type == "cuda" else None,
    )

    def bare_epoch(epoch: int) -> float:
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=trainer.device)
        for x, y in epoch_batches(data.train, batch_size=bs, seed=recipe.data.seed, epoch=epoch):
            bare_opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(bare(x), y)
            loss.backward()
            bare_opt.step()
            loss_sum += loss.detach() * y.shape[0]
        loss_sum.item()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        return (time.perf_counter() - start) * 1e3

    warmup_epochs = math.ceil(config.warmup_batches / steps)
    for e in range(warmup_epochs):
        trainer.train_epoch()
        bare_epoch(e)
    esper_ms, esper_full_ms, bare_ms = [], [], []
    for e in range(config.epochs):
        result = trainer.train_epoch()
        esper_ms.append(result.train_ms)
        esper_full_ms.append(result.total_ms)
        bare_ms.append(bare_epoch(warmup_epochs + e))
    esper = latency_stats(esper_ms)
    plain = latency_stats(bare_ms)
    full = latency_stats(esper_full_ms)
    return {
        "workload": "seed-reference",
        "device": str(trainer.device),
        "epochs": config.epochs,
        "steps_per_epoch": steps,
        "esper_p50_ms": esper.p50_ms,
        "esper_p95_ms": esper.p95_ms,
        "bare_p50_ms": plain.p50_ms,
        "bare_p95_ms": plain.p95_ms,
        "ratio_p50": esper.p50_ms / plain.p50_ms,
        "ratio_p95": esper.p95_ms / plain.p95_ms,
        "esper_full_epoch_p95_ms": full.p95_ms,
        "budget_ms": recipe.trainer.latency_budget_ms,
        "samples_ms": {"esper": esper_ms, "bare": bare_ms, "esper_full": esper_full_ms},
    }
