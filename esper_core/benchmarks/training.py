"""The training benchmark of every recipe: Tolaria against bare PyTorch, same process.

For a recipe (a built-in name, e.g. ``mnist1d-cnn``, or a user's ``pkg.mod:fn``) three trainers
start from the same weights: Esper with the eager step, Esper on the path its step engine chooses
(``compile='auto'`` measures eager vs compiled), and the bare twin
(``esper_core.benchmarks.common.bare_twin``) in a plain loop with the same optimizer (its fused
implementation, as Tolaria's; a second twin, ``bare_default``, with PyTorch's default one),
learning-rate schedule, loss and batches, carrying the same seed (if one is active): a branch
seed as an ordinary residual block, a width seed merged into its layer (the static network of
the grown size). With a width seed a fourth path, ``bare_unmerged``
(``common.unmerged_twin``), keeps the seed beside its layer as it trains, isolated: the same
computation as Esper's in plain PyTorch, so ``ratio_unmerged_*`` is Esper's machinery alone and
``ratio_*`` adds the seed's structural cost until its merge. Their epochs are interleaved so all
paths see the same machine state, in an order that rotates every epoch. The seed is the one the host grows (``common.germinate_one``):
a low-rank adapter or the recipe's first fitting blueprint on a branch slot, a doubling on a
host that grows in width only. Reported per path, p50/p95 over the timed epochs:

- ``train``: the training part of an epoch (what ``tolaria.training.latency_ms`` measures: steps,
  seed attribution, per-seed and per-layer metrics, one loss sync) against the bare loop's epoch;
- ``epoch``: the whole epoch (training, validation, gates, growth signals, the state packet)
  against the bare loop's epoch plus one validation pass, i.e. what a run pays per epoch.

Ratios are to bare; the score on the test split closes the report: accuracy for class targets,
bits per token for a language model's token targets (``esper_core.run.scores``), as a run says it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esper_core.benchmarks import NO_PROGRESS, Progress
from esper_core.benchmarks.common import BareLoop, BenchConfig, bare_twin, germinate_one, unmerged_twin
from esper_core.contracts import TelemetryEvent, TelemetryLevel
from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_trainer
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.run.scores import bits, token_targets
from esper_core.telemetry import latency_stats, write_baseline
from esper_core.tolaria.loop import EvalResult, Trainer

# Keeps the benchmark seed in TRAINING, so every timed epoch does the same work.
_HOLD_TRAINING = 10**6

PATHS = ("esper_chosen", "esper_eager", "bare", "bare_default")
UNMERGED = "bare_unmerged"


def _trainer(recipe: str, config: BenchConfig, *, compile: str, graphs: bool = False) -> tuple[Trainer, RunConfig]:
    run = get_recipe(recipe, device=config.device)
    step = dataclasses.replace(
        run.trainer.step,
        compile=compile,
        compile_mode=config.compile_mode,
        compile_dynamic=config.compile_dynamic,
        compile_warmup_steps=config.compile_warmup_steps,
        enable_graphs=graphs,
    )
    loader = dataclasses.replace(run.trainer.loader, gpu_dataset=config.gpu_dataset)
    run.trainer = dataclasses.replace(run.trainer, step=step, loader=loader, amp=config.amp)
    run.kasmina = dataclasses.replace(run.kasmina, min_training_epochs=_HOLD_TRAINING)
    trainer = build_trainer(run, catalog=default_catalog(), run_id=f"bench-{recipe}")
    if config.seeds:
        germinate_one(trainer, run)
    return trainer, run


def run(recipe: str, config: BenchConfig, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Benchmark ``recipe``; returns the numbers (ms per epoch) and per-epoch samples.

    ``progress`` hears of each epoch (all three paths) after it, outside the timed regions.

    Raises:
        ValueError: an unknown recipe, or ``seeds=1`` on a host none of whose blueprints fits.
    """
    progress("building trainers", 0, None)
    eager, run_config = _trainer(recipe, config, compile="off", graphs=False)
    chosen, _ = _trainer(recipe, config, compile=config.compile, graphs=config.cuda_graphs)
    spec = run_config.host if isinstance(run_config.host, ModelSpec) else None
    loops = {
        "bare": BareLoop(bare_twin(eager, spec), eager),
        "bare_default": BareLoop(bare_twin(eager, spec), eager, fused=None),
    }
    side = unmerged_twin(eager, spec)
    if side is not None:
        loops[UNMERGED] = BareLoop(side, eager)
    paths = PATHS if side is None else (*PATHS, UNMERGED)
    steps = math.ceil(len(eager.data.train) / eager.batch_size)

    # Warm-up: whole epochs, and for the chosen path until its engine has decided.
    warmup_epochs = math.ceil(config.warmup_batches / steps)
    if config.min_timed_s:
        warmup_epochs = max(warmup_epochs, 1)  # the last warm-up epoch's bare time sizes the timed part
    epoch = 0
    bare_ms = 0.0
    # Why the chosen path is not the one asked for (a capture or compile that fell back): the
    # first GPU lease saw "eager" for a --cuda-graphs case and nothing said why.
    fallbacks: list[str] = []
    while epoch < warmup_epochs or not chosen.engine.decided:
        eager.train_epoch()
        fallbacks += _fallbacks(chosen.train_epoch().events)
        for loop in reversed(loops.values()):  # "bare" last: its time sizes the timed part
            bare_ms = loop.epoch(epoch)
            loop.validate()
        epoch += 1
        progress("warm-up epochs" if chosen.engine.decided else "warm-up (step engine deciding)", epoch, None)
        if epoch > warmup_epochs + 50:
            raise RuntimeError("the step engine did not decide within 50 warm-up epochs")
    train: dict[str, list[float]] = {name: [] for name in paths}
    whole: dict[str, list[float]] = {name: [] for name in paths}
    trainers = {"esper_eager": eager, "esper_chosen": chosen}
    epochs = _timed_epochs(config, bare_ms, len(paths))
    for timed in range(epochs):
        # The order rotates every epoch: a path's place in the round is worth a few per cent on
        # the smallest workloads (whichever Esper path ran second was 3-4 % slower on
        # seed-reference and digits-mlp, whether eager or chosen), so no path keeps one place.
        turn = timed % len(paths)
        for name in paths[turn:] + paths[:turn]:
            if name in loops:
                train_ms = loops[name].epoch(epoch)
                train[name].append(train_ms)
                whole[name].append(train_ms + loops[name].validate())
            else:
                result = trainers[name].train_epoch()
                if name == "esper_chosen":
                    fallbacks += _fallbacks(result.events)
                train[name].append(result.train_ms)
                whole[name].append(result.total_ms)
        epoch += 1
        progress("timed epochs", len(train["bare"]), epochs)
    return {**_report(recipe, config, eager, chosen, loops, steps, train, whole), "fallbacks": fallbacks}


def _fallbacks(events: Sequence[TelemetryEvent]) -> list[str]:
    """The step engine's warnings that it left the configured path (not the routine INFO that a
    short last batch runs eagerly)."""
    return [
        f"{e.name}: {e.message}" for e in events if e.name.endswith("_fallback") and e.level is TelemetryLevel.WARNING
    ]


def _timed_epochs(config: BenchConfig, bare_ms: float, paths: int) -> int:
    """``config.epochs``, or more to fill ``config.min_timed_s`` of bare epochs of ``bare_ms``
    (the last warm-up epoch's), in whole rounds of the ``paths``."""
    if config.min_timed_s == 0:
        return config.epochs
    wanted = max(config.epochs, math.ceil(config.min_timed_s * 1e3 / bare_ms))
    return -(-wanted // paths) * paths


def _report(
    recipe: str,
    config: BenchConfig,
    eager: Trainer,
    chosen: Trainer,
    loops: dict[str, BareLoop],
    steps: int,
    train: dict[str, list[float]],
    whole: dict[str, list[float]],
) -> dict[str, Any]:
    stats = {name: latency_stats(values) for name, values in train.items()}
    epoch_stats = {name: latency_stats(values) for name, values in whole.items()}
    test = eager.data.test
    # Accuracy is 0 and means nothing for token targets: their loss is the score, in bits.
    tokens = token_targets(eager.data)
    metric = "bits_per_token" if tokens else "accuracy"

    def score(result: EvalResult) -> float:
        return bits(result.loss) if tokens else result.accuracy

    unmerged = {}
    if UNMERGED in stats:
        unmerged = {
            "bare_unmerged_p50_ms": stats[UNMERGED].p50_ms,
            "bare_unmerged_p95_ms": stats[UNMERGED].p95_ms,
            "ratio_unmerged_p50": stats["esper_chosen"].p50_ms / stats[UNMERGED].p50_ms,
            "ratio_unmerged_p95": stats["esper_chosen"].p95_ms / stats[UNMERGED].p95_ms,
            "epoch_ratio_unmerged_p50": epoch_stats["esper_chosen"].p50_ms / epoch_stats[UNMERGED].p50_ms,
            f"{metric}_bare_unmerged": score(loops[UNMERGED].evaluate(test)),
        }
    return {
        "workload": recipe,
        "device": str(eager.device),
        "epochs": len(train["bare"]),
        "steps_per_epoch": steps,
        "optimizer": eager.config.optimizer,
        "lr_schedule": eager.config.lr_schedule,
        "active_seeds": config.seeds,
        "chosen_path": chosen.engine.describe(),
        "precision": chosen.precision.describe(),
        "compile_warmup_ms": chosen.engine.warmup_ms,
        "esper_p50_ms": stats["esper_chosen"].p50_ms,
        "esper_p95_ms": stats["esper_chosen"].p95_ms,
        "eager_p50_ms": stats["esper_eager"].p50_ms,
        "eager_p95_ms": stats["esper_eager"].p95_ms,
        "bare_p50_ms": stats["bare"].p50_ms,
        "bare_p95_ms": stats["bare"].p95_ms,
        "bare_default_p50_ms": stats["bare_default"].p50_ms,
        "ratio_p50": stats["esper_chosen"].p50_ms / stats["bare"].p50_ms,
        # Against the twin with PyTorch's default optimizer: what a user who never passes
        # ``fused`` would see (below 1 where the fused update saves more than Esper costs).
        "ratio_default_optimizer_p50": stats["esper_chosen"].p50_ms / stats["bare_default"].p50_ms,
        "ratio_p95": stats["esper_chosen"].p95_ms / stats["bare"].p95_ms,
        "eager_ratio_p50": stats["esper_eager"].p50_ms / stats["bare"].p50_ms,
        "eager_ratio_p95": stats["esper_eager"].p95_ms / stats["bare"].p95_ms,
        "epoch_esper_p50_ms": epoch_stats["esper_chosen"].p50_ms,
        "epoch_esper_p95_ms": epoch_stats["esper_chosen"].p95_ms,
        "epoch_bare_p50_ms": epoch_stats["bare"].p50_ms,
        "epoch_bare_p95_ms": epoch_stats["bare"].p95_ms,
        "epoch_ratio_p50": epoch_stats["esper_chosen"].p50_ms / epoch_stats["bare"].p50_ms,
        "epoch_ratio_p95": epoch_stats["esper_chosen"].p95_ms / epoch_stats["bare"].p95_ms,
        "epoch_ratio_default_optimizer_p50": epoch_stats["esper_chosen"].p50_ms / epoch_stats["bare_default"].p50_ms,
        "metric": metric,
        f"{metric}_esper": score(eager.evaluate(test)),
        # The chosen path trained its own copy: a graph or compiled step that computed something
        # else than the eager one shows here.
        f"{metric}_chosen": score(chosen.evaluate(test)),
        f"{metric}_bare": score(loops["bare"].evaluate(test)),
        f"{metric}_bare_default": score(loops["bare_default"].evaluate(test)),
        **unmerged,
        "budget_ms": eager.config.latency_budget_ms,
        "samples_ms": {**train, **{f"epoch_{name}": values for name, values in whole.items()}},
    }


def score_line(result: dict[str, Any]) -> str:
    """The report's closing line: each path's test score, named by ``result["metric"]``."""
    metric = result["metric"]
    name, digits = ("bits per token", 3) if metric == "bits_per_token" else ("accuracy", 4)
    paths = (("esper eager", "esper"), ("chosen", "chosen"), ("bare", "bare"))
    return f"test {name} " + "  ".join(f"{label} {result[f'{metric}_{key}']:.{digits}f}" for label, key in paths)


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """``run``'s numbers without the per-epoch samples."""
    return {k: v for k, v in result.items() if k != "samples_ms"}


def save_baseline(
    result: dict[str, Any], path: str | Path, *, name: str | None = None, extra: dict[str, Any] | None = None
) -> None:
    """Write ``run``'s ``result`` as a baseline file (``esper bench compare`` reads it); ``name``
    defaults to the recipe."""
    write_baseline(
        path,
        name=name or result["workload"],
        workload=headline(result),
        latency_ms=result["samples_ms"],
        device=result["device"],
        extra=extra,
    )
