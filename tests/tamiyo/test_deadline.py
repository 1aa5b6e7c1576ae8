"""Tamiyo's deadline in a real run covers the policy that decides, not the GNN's shadow scoring."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.settings import EsperSettings
from esper_core.tamiyo.build import PreparedPolicy
from esper_core.telemetry import read_jsonl
from esper_core.tolaria.safety import SafetyConfig
from esper_core.urza.service import Urza

DEADLINE = SafetyConfig(tamiyo_deadline_ms=300.0, enforce_deadlines=True)


class _SlowForward:
    """The real prepared policy, but every forward takes ``delay_s`` longer (the injected stall)."""

    def __init__(self, inner: PreparedPolicy, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def __call__(self, *args: Any) -> Any:  # noqa: ANN401
        time.sleep(self.delay_s)
        return self.inner(*args)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        return getattr(self.inner, name)


def _run(home: EsperSettings, run_id: str, policy: str) -> Run:
    config = get_recipe("seed-reference", epochs=3, device="cpu")
    config.trainer = dataclasses.replace(
        config.trainer, safety=DEADLINE, step=dataclasses.replace(config.trainer.step, compile="off")
    )
    config.tamiyo = dataclasses.replace(
        config.tamiyo, policy=policy, compile=dataclasses.replace(config.tamiyo.compile, enabled=False)
    )
    session = Run(config=config, settings=home, run_id=run_id, urza=Urza.open(home.home))
    session.commit(START_TAG)
    session.tamiyo.policy = _SlowForward(session.tamiyo.policy, delay_s=0.6)  # type: ignore[assignment]
    for epoch in range(3):
        session.train_epoch()
        session.commit(epoch_tag(epoch, "trained"))
        session.apply(session.decide())
        session.commit(epoch_tag(epoch, "applied"))
    session.close()
    return session


def _timeouts(home: EsperSettings, run_id: str) -> float:
    packets = read_jsonl(home.runs_dir / run_id / "telemetry.jsonl")
    return sum(m.value for p in packets for m in p.metrics if m.name == "tolaria.timeout.tamiyo_total")


def test_a_slow_shadow_forward_never_turns_the_heuristic_decision_into_a_wait(compiled_home: EsperSettings) -> None:
    session = _run(compiled_home, "slow-shadow", "heuristic")
    assert _timeouts(compiled_home, "slow-shadow") == 0.0
    assert [c.issued_by for c in session.commands] == ["heuristic"] * 3
    assert any(c.action == "germinate" for c in session.commands)
    # The shadow scores are still there, measured outside the deadline.
    assert all("gnn.wait" in c.scores for c in session.commands)
    assert min(session.timings["gnn_ms"]) >= 600.0 and max(session.timings["decide_ms"]) < 300.0


def test_a_slow_deciding_gnn_still_misses_its_deadline(compiled_home: EsperSettings) -> None:
    session = _run(compiled_home, "slow-gnn", "gnn")
    assert _timeouts(compiled_home, "slow-gnn") == 3.0
    assert [c.issued_by for c in session.commands] == ["tolaria.safety"] * 3
    assert all(c.action == "wait" for c in session.commands)
