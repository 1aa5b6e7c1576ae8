"""Training benchmarks for the reference workloads: Tolaria against bare PyTorch, same process.

For a recipe (``seed-reference``, ``digits-mlp``, ``digits-cnn``) three trainers start from the
same weights: Esper with the eager step, Esper on the path its step engine chooses
(``compile='auto'`` measures eager vs compiled), and the bare ``nn.Sequential`` twin in a plain
loop, carrying the same seed block (if one is active) as an ordinary residual block. Their epochs are interleaved so all three see the same machine state. Reported per path:
p50/p95 of the training part of an epoch (what ``tolaria.training.latency_ms`` measures: steps,
seed attribution, per-seed and per-layer metrics, one loss sync), ratios to bare, and accuracy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bench import NO_PROGRESS, Progress
from bench.common import BareLoop, BenchConfig, bare_twin, germinate_one
from esper_core.karn.catalog import default_catalog
from esper_core.run.build import build_trainer
from esper_core.run.recipes import get_recipe
from esper_core.telemetry import latency_stats
from esper_core.tolaria.loop import Trainer

# Keeps the benchmark seed in TRAINING, so every timed epoch does the same work.
_HOLD_TRAINING = 10**6


def _trainer(recipe: str, config: BenchConfig, *, compile: str) -> Trainer:
    run = get_recipe(recipe, device=config.device)
    step = dataclasses.replace(
        run.trainer.step,
        compile=compile,
        compile_mode=config.compile_mode,
        compile_dynamic=config.compile_dynamic,
        compile_warmup_steps=config.compile_warmup_steps,
    )
    loader = dataclasses.replace(run.trainer.loader, gpu_dataset=config.gpu_dataset)
    run.trainer = dataclasses.replace(run.trainer, step=step, loader=loader)
    run.kasmina = dataclasses.replace(run.kasmina, min_training_epochs=_HOLD_TRAINING)
    trainer = build_trainer(run, catalog=default_catalog(), run_id=f"bench-{recipe}")
    if config.seeds:
        germinate_one(trainer)
    return trainer


def run(recipe: str, config: BenchConfig, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Benchmark ``recipe``; returns the numbers (ms per epoch) and per-epoch samples.

    ``progress`` hears of each epoch (all three paths) after it, outside the timed regions.
    """
    progress("building trainers", 0, None)
    eager = _trainer(recipe, config, compile="off")
    chosen = _trainer(recipe, config, compile=config.compile)
    bare = BareLoop(bare_twin(eager), eager)
    steps = math.ceil(len(eager.data.train) / eager.batch_size)

    # Warm-up: whole epochs, and for the chosen path until its engine has decided.
    warmup_epochs = math.ceil(config.warmup_batches / steps)
    epoch = 0
    while epoch < warmup_epochs or not chosen.engine.decided:
        eager.train_epoch(), chosen.train_epoch(), bare.epoch(epoch)
        epoch += 1
        progress("warm-up epochs" if chosen.engine.decided else "warm-up (step engine deciding)", epoch, None)
        if epoch > warmup_epochs + 50:
            raise RuntimeError("the step engine did not decide within 50 warm-up epochs")
    samples: dict[str, list[float]] = {"esper_eager": [], "esper_chosen": [], "bare": []}
    for _ in range(config.epochs):
        samples["esper_eager"].append(eager.train_epoch().train_ms)
        samples["esper_chosen"].append(chosen.train_epoch().train_ms)
        samples["bare"].append(bare.epoch(epoch))
        epoch += 1
        progress("timed epochs", len(samples["bare"]), config.epochs)
    stats = {name: latency_stats(values) for name, values in samples.items()}
    bare_p50, bare_p95 = stats["bare"].p50_ms, stats["bare"].p95_ms
    test = eager.data.test
    return {
        "workload": recipe,
        "device": str(eager.device),
        "epochs": config.epochs,
        "steps_per_epoch": steps,
        "active_seeds": config.seeds,
        "chosen_path": chosen.engine.describe(),
        "compile_warmup_ms": chosen.engine.warmup_ms,
        "esper_p50_ms": stats["esper_chosen"].p50_ms,
        "esper_p95_ms": stats["esper_chosen"].p95_ms,
        "eager_p50_ms": stats["esper_eager"].p50_ms,
        "eager_p95_ms": stats["esper_eager"].p95_ms,
        "bare_p50_ms": bare_p50,
        "bare_p95_ms": bare_p95,
        "ratio_p50": stats["esper_chosen"].p50_ms / bare_p50,
        "ratio_p95": stats["esper_chosen"].p95_ms / bare_p95,
        "eager_ratio_p95": stats["esper_eager"].p95_ms / bare_p95,
        "accuracy_esper": eager.evaluate(test).accuracy,
        "accuracy_bare": bare.accuracy(test),
        "budget_ms": eager.config.latency_budget_ms,
        "samples_ms": samples,
    }
