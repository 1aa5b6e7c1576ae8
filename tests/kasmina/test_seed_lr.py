"""The per-seed learning-rate schedule while a seed trains in isolation (KasminaConfig.isolation_lr)."""

from __future__ import annotations

import dataclasses

import pytest

from esper_core.contracts import SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.seed_lr import IsolationLRConfig
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from tests.helpers.kernels import germinate_kernel, kernel_from_registry
from tests.helpers.recipes import eager_recipe


def test_warmup_then_cosine_per_isolation_epoch() -> None:
    schedule = IsolationLRConfig(factor=2.0, warmup_epochs=1, schedule="cosine", final_factor=0.1, epochs=4)
    values = [schedule.factor_at(epoch, length=1) for epoch in range(6)]
    # Warm-up 2 * 1/2, then half a cosine over the remaining 3 epochs from 2 to 0.2, then held.
    assert values == pytest.approx([1.0, 2.0, 1.1, 0.2, 0.2, 0.2])


def test_constant_and_default_schedules() -> None:
    assert [IsolationLRConfig().factor_at(e, 3) for e in range(4)] == [1.0] * 4
    constant = IsolationLRConfig(factor=3.0, warmup_epochs=2)
    assert [constant.factor_at(e, 3) for e in range(4)] == pytest.approx([1.0, 2.0, 3.0, 3.0])
    # Without ``epochs`` the cosine spans the isolation length it is given (min_training_epochs).
    cosine = IsolationLRConfig(schedule="cosine", final_factor=0.5)
    assert [cosine.factor_at(e, 3) for e in range(3)] == pytest.approx([1.0, 0.75, 0.5])


def _seed_rates(home: EsperSettings, epochs: int, *, blend_epochs: int, **kasmina: object) -> tuple[list, list, float]:
    """A lowrank seed (lr_scale 0.5) germinated in slot0 of seed-reference under ``kasmina``'s
    settings: its stage before each epoch and its group's rate after, and the seed's own rate."""
    config = eager_recipe("seed-reference", epochs=6)
    config.kasmina = dataclasses.replace(config.kasmina, **kasmina)  # type: ignore[arg-type]
    trainer = build_trainer(config, catalog=default_catalog(), run_id="test")
    kernel = kernel_from_registry(home, "lowrank_adapter", "f16-b64")
    germinate_kernel(trainer.manager, "slot0", kernel, blend_epochs=blend_epochs, lr_scale=0.5)
    rates, stages = [], []
    for _ in range(epochs):
        stages.append(trainer.manager.slots["slot0"].stage)
        trainer.train_epoch()
        group = next(g for g in trainer.optimizer.param_groups if g.get("slot_id") == "slot0")
        rates.append(group["lr"])
    # The host's group never moves.
    assert trainer.optimizer.param_groups[0]["lr"] == config.trainer.lr
    return stages, rates, config.trainer.lr * 0.5


def test_seed_group_follows_the_schedule_then_returns_to_its_rate(compiled_home: EsperSettings) -> None:
    schedule = IsolationLRConfig(factor=3.0, warmup_epochs=1, schedule="cosine", final_factor=0.1)
    stages, rates, seed_lr = _seed_rates(compiled_home, 4, blend_epochs=2, min_training_epochs=3, isolation_lr=schedule)
    assert stages == [SeedStage.GERMINATED] + [SeedStage.TRAINING] * 2 + [SeedStage.BLENDING]
    # Three isolation epochs (warm-up, peak, cosine end), then blending at the seed's own rate.
    assert rates == pytest.approx([seed_lr * 1.5, seed_lr * 3.0, seed_lr * 0.3, seed_lr])


def test_a_blending_seed_warms_up_to_its_rate(compiled_home: EsperSettings) -> None:
    stages, rates, seed_lr = _seed_rates(compiled_home, 5, blend_epochs=4, blend_lr_warmup_epochs=2)
    # Stages seen before each epoch's start: germinated (trains in TRAINING), then blending.
    assert stages == [SeedStage.GERMINATED] + [SeedStage.BLENDING] * 4
    # Isolation at the seed's rate, then blending epochs 0 and 1 at 1/3 and 2/3 of it, then all of it.
    assert rates == pytest.approx([seed_lr, seed_lr / 3, seed_lr * 2 / 3, seed_lr, seed_lr])
    with pytest.raises(ValueError, match=r"blend_lr_warmup_epochs must be >= 0 \(0: no warm-up\), got -1"):
        KasminaConfig(blend_lr_warmup_epochs=-1)


def test_isolation_lr_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"isolation_lr.factor must be a finite number > 0 \(1 = unchanged\)"):
        IsolationLRConfig(factor=0.0)
    with pytest.raises(ValueError, match=r"isolation_lr.schedule must be one of \('constant', 'cosine'\)"):
        IsolationLRConfig(schedule="linear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"final_factor must lie in \(0, 1\]"):
        IsolationLRConfig(final_factor=0.0)
    with pytest.raises(ValueError, match="warmup_epochs must be >= 0"):
        IsolationLRConfig(warmup_epochs=-1)
    with pytest.raises(ValueError, match=r"isolation_lr.epochs = 2\): lower warmup_epochs or lengthen the isolation"):
        IsolationLRConfig(warmup_epochs=2, epochs=2)
    with pytest.raises(ValueError, match=r"\(min_training_epochs = 1\): lower warmup_epochs or lengthen"):
        KasminaConfig(isolation_lr=IsolationLRConfig(warmup_epochs=1))
    KasminaConfig(min_training_epochs=2, isolation_lr=IsolationLRConfig(warmup_epochs=1))
