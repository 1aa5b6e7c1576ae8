"""Fault drills: inject a real fault into a real run and check the telemetry it leaves.

``run_timeout_drill`` makes Tamiyo answer after its deadline and Kasmina overrun its budget;
``run_rollback_drill`` poisons the host's weights with NaN (a rollback cures it) and then the
training data (no rollback can), which must end in a halt. Each returns ``{"drill", "passed", "checks", "metrics"}``; a failed check
names what was expected.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from esper_core.contracts import TelemetryPacket
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.settings import EsperSettings
from esper_core.tamiyo.service import TamiyoService
from esper_core.telemetry import read_jsonl
from esper_core.tolaria.safety import SafetyConfig, TrainingHalted
from esper_core.urza.service import Urza

_DRILL_SAFETY = SafetyConfig(
    tamiyo_deadline_ms=200.0, kasmina_deadline_ms=10_000.0, max_failed_epochs=3, enforce_deadlines=True
)


class _SlowTamiyo:
    """Tamiyo that answers correctly, but ``delay_s`` late for the decisions of ``slow_epochs``
    (the injected fault)."""

    def __init__(self, inner: TamiyoService, *, delay_s: float, slow_epochs: frozenset[int]) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.slow_epochs = slow_epochs

    def decide(self, history: Any, *args: Any, **kwargs: Any) -> Any:
        if history[-1].epoch in self.slow_epochs:
            time.sleep(self.delay_s)
        return self.inner.decide(history, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Everything but the slow decision is the real service (config, breaker, policy swap).
        return getattr(self.inner, name)


def _config(safety: SafetyConfig) -> RunConfig:
    config: RunConfig = get_recipe("seed-reference", device="cpu")
    step = dataclasses.replace(config.trainer.step, compile="off")
    config.trainer = dataclasses.replace(config.trainer, safety=safety, step=step)
    return config


def _session(home: Path, run_id: str, *, config: RunConfig, tamiyo: Any = None) -> Run:
    """A drill's run; faults come in through the collaborators it is built with."""
    settings = EsperSettings(home=home)
    session = Run(config=config, settings=settings, run_id=run_id, urza=Urza.open(settings.home), tamiyo=tamiyo)
    session.commit(START_TAG)
    return session


def _epoch(session: Run) -> None:
    epoch = session.epoch
    session.train_epoch()
    session.commit(epoch_tag(epoch, "trained"))
    session.apply(session.decide())
    session.commit(epoch_tag(epoch, "applied"))


def _total(packets: list[TelemetryPacket], name: str) -> float:
    return sum(p.value for packet in packets for p in packet.metrics if p.name == name)


def _events(packets: list[TelemetryPacket], name: str) -> list[Any]:
    return [e for packet in packets for e in packet.events if e.name == name]


def _in_home(home: Path | None, body: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    if home is not None:
        return body(home)
    with tempfile.TemporaryDirectory(prefix="esper-drill-") as tmp:
        return body(Path(tmp))


def run_timeout_drill(home: Path | None = None) -> dict[str, Any]:
    """Tamiyo misses its deadline once, then Kasmina overruns its budget once."""

    def body(root: Path) -> dict[str, Any]:
        config = _config(_DRILL_SAFETY)
        tamiyo = TamiyoService(config.tamiyo, cache_dir=root / "cache" / "inductor")
        slow = _SlowTamiyo(tamiyo, delay_s=0.6, slow_epochs=frozenset({1}))
        session = _session(root, "drill-timeout", config=config, tamiyo=slow)
        _epoch(session)
        _epoch(session)  # the decision after epoch 1 misses its deadline
        held = session.commands[-1]
        # Kasmina: any command that calls it now overruns a 1 us budget and is undone.
        session.config.trainer.safety = dataclasses.replace(_DRILL_SAFETY, kasmina_deadline_ms=0.001)
        session.train_epoch()
        session.commit(epoch_tag(2, "trained"))
        optimizer = held.model_copy(update={"command_type": held.command_type.OPTIMIZER, "lr_scale": 0.5, "epoch": 2})
        lr_before = session.trainer.optimizer.param_groups[0]["lr"]
        outcome = session.apply(optimizer)
        lr_after = session.trainer.optimizer.param_groups[0]["lr"]
        session.commit(epoch_tag(2, "applied"))
        session.close()
        packets = read_jsonl(root / "runs" / "drill-timeout" / "telemetry.jsonl")
        checks = {
            "tamiyo timeout counted once": _total(packets, "tolaria.timeout.tamiyo_total") == 1.0,
            "timed-out decision became a conservative WAIT": held.action == "wait"
            and held.issued_by == "tolaria.safety",
            "conservative mode reported": any(
                p.value >= 1 for packet in packets for p in packet.metrics if p.name == "tolaria.emergency.level"
            ),
            "kasmina timeout counted once": _total(packets, "tolaria.timeout.kasmina_total") == 1.0,
            "overrunning command was undone": outcome.startswith("rejected") and lr_after == lr_before,
            "training continued": session.epoch == 3,
        }
        return {
            "drill": "timeout",
            "passed": all(checks.values()),
            "checks": checks,
            "metrics": {
                "tamiyo_timeouts": _total(packets, "tolaria.timeout.tamiyo_total"),
                "kasmina_timeouts": _total(packets, "tolaria.timeout.kasmina_total"),
            },
        }

    return _in_home(home, body)


def run_rollback_drill(home: Path | None = None) -> dict[str, Any]:
    """NaN weights roll back to the last commit and recover; a diverging setup halts."""

    def body(root: Path) -> dict[str, Any]:
        session = _session(root, "drill-rollback", config=_config(_DRILL_SAFETY))
        _epoch(session)
        with torch.no_grad():
            session.trainer.model.layers[0].weight.fill_(float("nan"))  # the injected fault
        _epoch(session)  # fails, rolls back (memory tier), remediates, retries and succeeds
        recovered = torch.isfinite(session.trainer.model.layers[0].weight).all().item()
        session.rails.tiers.drop_fast_tier()  # exercise the disk tier too
        with torch.no_grad():
            session.trainer.model.layers[0].weight.fill_(float("nan"))
        _epoch(session)
        session.close()
        halting = _session(root, "drill-halt", config=_config(_DRILL_SAFETY))
        halting.trainer.data.train.x[0, 0] = float("nan")  # corrupt data survives every rollback
        halted = ""
        try:
            _epoch(halting)
        except TrainingHalted as e:
            halted = str(e)
        halting.close()
        packets = read_jsonl(root / "runs" / "drill-rollback" / "telemetry.jsonl")
        halt_packets = read_jsonl(root / "runs" / "drill-halt" / "telemetry.jsonl")
        rollbacks = _events(packets, "tolaria.rollback")
        latencies = [
            p.value for packet in packets for p in packet.metrics if p.name == "tolaria.rollback.restore_latency_ms"
        ]
        checks = {
            "failed epochs reported": len(_events(packets, "tolaria.epoch.failed")) == 2,
            "restored from memory, then from disk": [e.attributes["tier"] for e in rollbacks] == ["memory", "disk"],
            "restore latency recorded": len(latencies) == 2 and all(ms > 0 for ms in latencies),
            "weights recovered": bool(recovered),
            "remediation recorded": len(_events(packets, "tolaria.remediation")) == 2,
            "run went on": session.epoch == 3,
            "diverging run halted": "halted" in halted and len(_events(halt_packets, "tolaria.emergency.halt")) == 1,
        }
        return {
            "drill": "rollback",
            "passed": all(checks.values()),
            "checks": checks,
            "metrics": {
                "restore_latency_ms": latencies,
                "deadline_exceeded": _total(packets, "tolaria.rollback.deadline_exceeded_total"),
                "failures": _total(packets, "tolaria.rollback.failures_total"),
            },
        }

    return _in_home(home, body)


DRILLS: dict[str, Callable[[Path | None], dict[str, Any]]] = {
    "timeout": run_timeout_drill,
    "rollback": run_rollback_drill,
}
