"""The training benchmark's bare twin computes what the host computes (numbers are not asserted:
timings belong to the benchmark run, not to tests)."""

from __future__ import annotations

import pytest
import torch

from esper_core.benchmarks.common import BareLoop, BenchConfig, bare_twin, germinate_one
from esper_core.benchmarks.training import _trainer, run
from esper_core.contracts import SeedStage


def test_bare_twin_matches_the_host_and_trains_the_same_without_seeds() -> None:
    result = run("digits-mlp", BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0))
    assert result["accuracy_esper"] == result["accuracy_bare"]
    assert {"esper_p95_ms", "bare_p95_ms", "ratio_p95", "chosen_path"} <= result.keys()


def test_bare_twin_carries_an_active_seed_as_a_residual_block() -> None:
    trainer, _ = _trainer("seed-reference", BenchConfig(epochs=5, seeds=0), compile="off")
    slot_id = germinate_one(trainer)
    slot = trainer.manager.slots[slot_id]
    with torch.no_grad():
        for p in slot.seed.parameters():  # type: ignore[union-attr]
            p.normal_()  # a fresh seed is neutral; make it matter
    slot.alpha = 1.0
    slot.stage = SeedStage.PROBATIONARY  # blended in at alpha 1, as the twin's block is
    twin = bare_twin(trainer)
    x = trainer.data.val.x[:8]
    with torch.inference_mode():
        assert torch.allclose(twin(x), trainer.model(x), atol=1e-6)


USER_RECIPE = "tests.helpers.user_model:recipe"


def test_a_users_recipe_benches_against_its_own_model_rebuilt_bare() -> None:
    # Streamed data (a map-style Dataset), a nested slot, SGD: the bare loop reads the same
    # batches through a DataLoader and trains to the same weights.
    result = run(USER_RECIPE, BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0))
    assert result["accuracy_esper"] == result["accuracy_bare"]
    assert result["epoch_ratio_p50"] > 0 and len(result["samples_ms"]["epoch_bare"]) == 5


def test_bare_twin_of_a_users_model_carries_the_seed_after_its_module() -> None:
    trainer, run_config = _trainer(USER_RECIPE, BenchConfig(epochs=5, seeds=0), compile="off")
    slot_id = germinate_one(trainer, run_config.blueprints)
    slot = trainer.manager.slots[slot_id]
    with torch.no_grad():
        for p in slot.seed.parameters():  # type: ignore[union-attr]
            p.normal_()
    slot.alpha = 1.0
    slot.stage = SeedStage.PROBATIONARY
    twin = bare_twin(trainer, run_config.host)  # type: ignore[arg-type]
    x = torch.randn(8, 12)
    with torch.inference_mode():
        assert torch.allclose(twin(x), trainer.model(x), atol=1e-6)


def test_bare_loop_follows_the_recipes_optimizer_and_schedule() -> None:
    trainer, run_config = _trainer("mnist1d-mlp", BenchConfig(epochs=5, seeds=0), compile="off")
    bare = BareLoop(bare_twin(trainer, run_config.host), trainer)  # type: ignore[arg-type]
    assert isinstance(bare.opt, torch.optim.Adam)
    for _ in range(3):  # cosine: the rate falls each epoch, in step with Tolaria's
        trainer._schedule_lr()
        assert bare.opt.param_groups[0]["lr"] == pytest.approx(trainer.optimizer.param_groups[0]["lr"], rel=1e-12)
        trainer.epoch += 1
        bare.opt.step()  # no gradients: changes nothing, but orders the scheduler after it
        bare.schedule.step()
    assert bare.opt.param_groups[0]["lr"] < trainer.config.lr
    with pytest.raises(ValueError, match="ModelSpec"):
        bare_twin(trainer)
