"""Same recipe, same seed, same result: in a fresh ESPER_HOME and in a used one (caches present).

The used home is the fresh one after a run, holding what a run leaves behind (a finished run),
plus the step decision that a loaded machine's noisy measurement once wrote there: "the compiled
step is faster". Before the fix a
run in such a home trained on the compiled step (a few ulps different from eager) and gave
other numbers than the fresh-home run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from esper_core.run.commits import epoch_tag
from esper_core.run.reports import finish_run
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings

EPOCHS = 3  # the step engine decides at step 18 (~1 epoch of digits-mlp) and switches after it


def _run(home: EsperSettings, run_id: str) -> tuple[dict[str, Any], str]:
    # Pinned to the rule, which the comment on "commands" below is about.
    spec = RunSpec(recipe="digits-mlp", epochs=EPOCHS, device=None, run_id=run_id, policy="heuristic")
    session = Run.start(spec, settings=home)
    for epoch in range(EPOCHS):
        session.train_epoch()
        session.commit(epoch_tag(epoch, "trained"))
        session.apply(session.decide())
        session.commit(epoch_tag(epoch, "applied"))
    summary = finish_run(session)
    session.close()
    return {
        "epochs": [(p.epoch, p.train_loss, p.val_loss, p.val_accuracy) for p in session.history],
        # Not the GNN's shadow scores: its graph holds measured latencies (epoch, lookup), which
        # are telemetry and differ from run to run; the heuristic decides without them.
        "commands": [(c.epoch, c.action, c.slot_id, c.blueprint_id, c.issued_by, c.reason) for c in session.commands],
        "test": (summary.test_accuracy, summary.test_loss, summary.seeds),
    }, session.trainer.engine.cache_key


@pytest.mark.slow
def test_a_fresh_and_a_used_home_give_identical_runs(compiled_home: EsperSettings) -> None:
    decisions_path = compiled_home.home / "step_decisions.json"
    fresh, key = _run(compiled_home, "fresh")
    # Three epochs are far too short to repay a compile (StepEngineConfig.compile_budget):
    # the step stays eager, and nothing is cached for the next, maybe longer, run.
    assert not decisions_path.exists()
    # What the noisy measurement of an earlier version left: compiled "wins", unchecked.
    decisions_path.write_text(
        json.dumps({key: {"compiled": True, "eager_ms": 243.0, "compiled_ms": 194.0, "warmup_ms": 1.0}})
    )
    used, _ = _run(compiled_home, "used")
    assert used == fresh
    assert any(c[1] == "germinate" for c in fresh["commands"])  # the run really grew a seed


@pytest.mark.slow
def test_the_size_of_tamiyos_network_does_not_change_a_runs_numbers(esper_home: EsperSettings) -> None:
    """The host's seeds draw their initial weights from the run's random stream after Tamiyo is
    built; an untrained policy network must not draw from it, or a new graph feature (a wider
    input) would change every grown run's numbers."""
    import dataclasses

    from esper_core.studies.episodes import episode_config
    from esper_core.tamiyo.model import TamiyoGNNConfig

    def grown(hidden_dim: int) -> list[tuple[float, float]]:
        config = episode_config("mnist1d-mlp-width", seed=3, policy="periodic", epochs=8)
        config.tamiyo = dataclasses.replace(config.tamiyo, gnn=TamiyoGNNConfig(hidden_dim=hidden_dim))
        session = Run.start(config, settings=esper_home, run_id=f"gnn-{hidden_dim}")
        try:
            for epoch in range(config.epochs):
                session.train_epoch()
                session.apply(session.decide())
                del epoch
            assert any(c.action == "germinate" and c.epoch < config.epochs - 2 for c in session.commands)
            return [(p.train_loss, p.val_loss) for p in session.history]
        finally:
            session.close()

    assert grown(16) == grown(64)
