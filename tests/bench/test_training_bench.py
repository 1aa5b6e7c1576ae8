"""The training benchmark's bare twin computes what the host computes (numbers are not asserted:
timings belong to the benchmark run, not to tests)."""

from __future__ import annotations

import torch

from bench.common import BenchConfig, bare_twin, germinate_one
from bench.training import _trainer, run
from esper_core.contracts import SeedStage


def test_bare_twin_matches_the_host_and_trains_the_same_without_seeds() -> None:
    result = run("digits-mlp", BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0))
    assert result["accuracy_esper"] == result["accuracy_bare"]
    assert {"esper_p95_ms", "bare_p95_ms", "ratio_p95", "chosen_path"} <= result.keys()


def test_bare_twin_carries_an_active_seed_as_a_residual_block() -> None:
    trainer = _trainer("seed-reference", BenchConfig(epochs=5, seeds=0), compile="off")
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
