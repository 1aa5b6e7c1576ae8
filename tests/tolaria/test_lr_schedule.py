"""TrainerConfig.lr_schedule: the cosine factor, per-group scaling, checkpoint restore, errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from esper_core.karn.entries import default_catalog
from esper_core.kasmina.loader import load_kernel
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from esper_core.tolaria.checkpoint import CheckpointStore
from esper_core.tolaria.config import TrainerConfig
from esper_core.tolaria.loop import Trainer
from esper_core.urza.service import Urza
from tests.helpers.kernels import germinate_kernel, kernel_from_registry
from tests.helpers.recipes import eager_recipe


def _cosine_trainer(epochs: int = 5) -> Trainer:
    config = eager_recipe("seed-reference", epochs=epochs)
    config.trainer = dataclasses.replace(config.trainer, lr_schedule="cosine", lr_final_factor=0.1)
    return build_trainer(config, catalog=default_catalog(), run_id="test")


def test_cosine_factor_runs_from_one_to_the_final_factor() -> None:
    config = TrainerConfig(lr_schedule="cosine", lr_final_factor=0.1)
    factors = [config.lr_factor(e, 5) for e in range(5)]
    assert factors[0] == 1.0 and math.isclose(factors[-1], 0.1)
    assert math.isclose(factors[2], 0.55)  # half-way down the cosine
    assert all(a > b for a, b in zip(factors, factors[1:], strict=False))
    assert TrainerConfig().lr_factor(3, None) == 1.0  # constant needs no length


def test_cooldown_holds_the_full_rate_then_decays_linearly_to_the_final_factor() -> None:
    config = TrainerConfig(lr_schedule="cooldown", lr_cooldown_epochs=2, lr_final_factor=0.1)
    factors = [config.lr_factor(e, 8) for e in range(8)]
    assert factors[:6] == [1.0] * 6 and math.isclose(factors[6], 0.55) and math.isclose(factors[7], 0.1)
    with pytest.raises(ValueError, match="needs the run's length"):
        config.lr_factor(0, None)
    with pytest.raises(ValueError, match="lr_cooldown_epochs must be >= 1"):
        TrainerConfig(lr_schedule="cooldown", lr_cooldown_epochs=0)


def test_cosine_scales_every_group_and_keeps_a_seeds_lr_scale(compiled_home: EsperSettings) -> None:
    trainer = _cosine_trainer()
    seen = [trainer.train_epoch().packet.learning_rate]
    kernel = kernel_from_registry(compiled_home, "lowrank_adapter", "f16-b64")
    germinate_kernel(trainer.manager, "slot0", kernel, lr_scale=0.5)
    # A learning-rate command between epochs (as Run applies one) must survive the schedule.
    trainer.optimizer.param_groups[0]["lr"] *= 2.0
    seen.append(trainer.train_epoch().packet.learning_rate)
    factor = trainer.config.lr_factor(1, 5)
    assert seen[0] == pytest.approx(0.05)
    assert seen[1] == pytest.approx(0.05 * 2.0 * factor)
    seed_group = next(g for g in trainer.optimizer.param_groups if g.get("slot_id") == "slot0")
    assert seed_group["lr"] == pytest.approx(0.05 * 0.5 * factor)


def test_cosine_schedule_resumes_exactly_from_a_checkpoint(tmp_path: Path, compiled_home: EsperSettings) -> None:
    trainer = _cosine_trainer()
    kernel = kernel_from_registry(compiled_home, "lowrank_adapter", "f16-b64")
    germinate_kernel(trainer.manager, "slot0", kernel, lr_scale=0.5)
    trainer.train_epoch()
    trainer.train_epoch()
    store = CheckpointStore(tmp_path / "ckpt")
    store.save("e2", trainer.state_dict())
    original = trainer.train_epoch().packet
    urza = Urza.open(compiled_home.home, compiled_home.registry_db_url)
    try:
        fresh = _cosine_trainer()
        fresh.load_state_dict(
            store.load("e2"),
            load_kernel=lambda a: load_kernel(a, urza.fetch_blob(a), catalog=default_catalog(), device="cpu"),
        )
        retried = fresh.train_epoch().packet
    finally:
        urza.close()
    assert retried.learning_rate == original.learning_rate
    assert retried.train_loss == original.train_loss and retried.val_loss == original.val_loss


def test_schedule_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        TrainerConfig(lr_schedule="linear")
    with pytest.raises(ValueError, match="lr_final_factor must lie in"):
        TrainerConfig(lr_schedule="cosine", lr_final_factor=0.0)
    trainer = _cosine_trainer()
    with pytest.raises(ValueError, match="pass total_epochs"):
        Trainer(
            model=trainer.model,
            manager=trainer.manager,
            data=trainer.data,
            config=trainer.config,
            loss_fn=trainer.loss_fn,
            batch_size=4,
            data_seed=0,
            device=trainer.device,
            run_id="x",
        )
