"""The run's state in one place: what a commit writes, a resume reads and a counterfactual fork copies.

``RunState`` is the run's record (``RunRecord``: history, commands, field reports, ...) plus the
components with state of their own: the trainer (model, optimizer, seed manager with its slots'
layer widths, precision, step engine, RNG, epoch) and the safety rails. Its ``state_dict()`` is a
checkpoint; ``state_dict(in_memory=True)`` adds what only the live process holds and a checkpoint
must never store: telemetry and field reports not sent yet, decisions waiting for their commit,
the rails' counters and events, the seed manager's undrained events, the commit bookkeeping.
(A commit writes the telemetry and reports it is about to send beside the state, under
``UNSENT``, for a process killed before it sends them; loading never puts them back.)
``load_state_dict`` takes either back, so commit, resume, rollback and the fork share one path.

Every field of ``RunRecord`` says which of the two it belongs to (``_kept`` with its codec, or
``_live``), and ``state_dict`` and ``load_state_dict`` walk the fields: a new field travels with
commits and forks alike, and a field that says neither fails at import.

The checkpoint's layout (``CHECKPOINT_KEYS``) is the one commits had before this module plus
``UNSENT``, which a load does without, so runs checkpointed by earlier versions resume as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from esper_core.contracts import (
    AdaptationCommand,
    FieldReport,
    KernelArtifact,
    SystemStatePacket,
    TelemetryPacket,
)
from esper_core.kasmina.loader import LoadedKernel
from esper_core.run.commits import epoch_tag, epochs_applied
from esper_core.run.field_reports import Pending, judge_pending
from esper_core.simic.records import DecisionRecord
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.telemetry.sinks import read_jsonl
from esper_core.tolaria.loop import Trainer
from esper_core.tolaria.rails import SafetyRails

_CODEC = "checkpoint_codec"
"""Field metadata key: the field's ``_Codec``, or None for a field a checkpoint never stores."""
IN_MEMORY = "in_memory"
"""Key of the live extras in ``state_dict(in_memory=True)`` (never in a checkpoint)."""
TIMINGS = ("train_ms", "epoch_ms", "decide_ms", "gnn_ms")
"""The run's timing series, in milliseconds."""


@dataclass(frozen=True, slots=True)
class _Codec:
    """How a field is written into a checkpoint (plain data ``torch.load(weights_only=True)`` reads)."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _json_list(cls: Any) -> _Codec:
    return _Codec(lambda items: [x.to_json() for x in items], lambda items: [cls.from_json(x) for x in items])


_PENDING = _Codec(
    lambda items: [(c.to_json(), loss, acc) for c, loss, acc in items],
    lambda items: [(AdaptationCommand.from_json(c), loss, acc) for c, loss, acc in items],
)
_SERIES = _Codec(
    lambda series: {k: list(v) for k, v in series.items()}, lambda series: {k: list(v) for k, v in series.items()}
)


def _kept(codec: _Codec, factory: Callable[[], Any] = list) -> Any:
    """A field the checkpoint stores, through ``codec``."""
    return field(default_factory=factory, metadata={_CODEC: codec})


def _live(*, default: Any = None, factory: Callable[[], Any] | None = None) -> Any:
    """A field only the live process holds: a fork copies it, a checkpoint never stores it."""
    if factory is not None:
        return field(default_factory=factory, metadata={_CODEC: None})
    return field(default=default, metadata={_CODEC: None})


@dataclass(kw_only=True, slots=True)
class RunRecord:
    """What the run has done, and the current step's work waiting for the next commit."""

    history: list[SystemStatePacket] = _kept(_json_list(SystemStatePacket))
    """Every trained epoch's state packet, in order."""
    commands: list[AdaptationCommand] = _kept(_json_list(AdaptationCommand))
    """Every command applied (or rejected), in order."""
    reports: list[FieldReport] = _kept(_json_list(FieldReport))
    """Field reports judged so far."""
    pending: list[Pending] = _kept(_PENDING)
    """Applied commands whose field report is not due yet."""
    timings: dict[str, list[float]] = _kept(_SERIES, lambda: {name: [] for name in TIMINGS})
    """Per-epoch timing series (``TIMINGS``)."""
    outbox: list[TelemetryPacket] = _live(factory=list)
    """Telemetry of the current step, sent at its commit."""
    report_outbox: list[FieldReport] = _live(factory=list)
    """Field reports of the current step, written at its commit."""
    decision_records: dict[str, DecisionRecord] = _live(factory=dict)
    """Tamiyo's decisions by command id, recorded for Simic at the commit that applies them."""
    candidates: list[BlueprintCandidate] | None = _live()
    """Blueprints with an active artifact, as last looked up (None: look up again)."""
    lookup_ms: float = _live(default=0.0)
    """Mean time of one registry lookup in that lookup."""
    committed_tag: str | None = _live()
    """The tag of the last commit the live state started from."""
    dirty: bool = _live(default=False)
    """Whether a step ran since that commit (a retry must restore first)."""

    def judge(self, packet: SystemStatePacket, *, run_id: str) -> None:
        """File the field reports whose window closed at ``packet`` (written at the next commit)."""
        reports, self.pending = judge_pending(self.pending, packet, self.history, run_id=run_id)
        self.reports.extend(reports)
        self.report_outbox.extend(reports)

    def best_tag(self) -> str | None:
        """The applied commit of the epoch with the lowest validation loss so far (kept by pruning)."""
        applied = [p for p in self.history if p.epoch < epochs_applied(self.committed_tag)]
        if not applied:
            return None
        return epoch_tag(min(applied, key=lambda p: p.val_loss).epoch, "applied")

    def state_dict(self, *, in_memory: bool = False) -> dict[str, Any]:
        """The checkpointed fields (encoded), and with ``in_memory`` the live ones under ``IN_MEMORY``."""
        state = {f.name: f.metadata[_CODEC].encode(getattr(self, f.name)) for f in _KEPT}
        if in_memory:
            state[IN_MEMORY] = {f.name: copy.copy(getattr(self, f.name)) for f in _LIVE}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Fill this record from ``state``; live fields only when ``state`` holds them."""
        for f in _KEPT:
            setattr(self, f.name, f.metadata[_CODEC].decode(state[f.name]))
        if IN_MEMORY in state:
            for f in _LIVE:
                setattr(self, f.name, copy.copy(state[IN_MEMORY][f.name]))


def _split(cls: type) -> tuple[tuple[Field, ...], tuple[Field, ...]]:
    undeclared = [f.name for f in fields(cls) if _CODEC not in f.metadata]
    if undeclared:
        raise TypeError(f"{cls.__name__} fields {undeclared} must be declared with _kept(codec) or _live()")
    kept = tuple(f for f in fields(cls) if f.metadata[_CODEC] is not None)
    return kept, tuple(f for f in fields(cls) if f.metadata[_CODEC] is None)


_KEPT, _LIVE = _split(RunRecord)
UNSENT = "unsent"
"""The checkpoint key of the step's telemetry and field reports, sent right after the commit.

A process killed between the commit and the send (SIGKILL cannot be deferred) would lose them
for good: a resume starts after the commit. The checkpoint therefore carries them, and a restore
hands them back so the session sends whatever its files lack (``Run.restore``).
Checkpoints written before this key existed load with nothing unsent."""
CHECKPOINT_KEYS = frozenset({"trainer", "emergency", UNSENT, *(f.name for f in _KEPT)})
"""The top-level keys of a commit's checkpoint (changing them needs a loader for the old ones)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Unsent:
    """A commit's telemetry and field reports, as its checkpoint carries them."""

    packets: tuple[TelemetryPacket, ...] = ()
    reports: tuple[FieldReport, ...] = ()

    def encode(self) -> dict[str, list[str]]:
        return {"packets": [p.to_json() for p in self.packets], "reports": [r.to_json() for r in self.reports]}

    def missing_from(self, run_dir: Path) -> Unsent:
        """What of this a run folder's ``telemetry.jsonl`` and ``field_reports.jsonl`` lack (by id)."""
        if not self.packets and not self.reports:
            return self
        telemetry, reports = run_dir / "telemetry.jsonl", run_dir / "field_reports.jsonl"
        sent = {p.packet_id for p in read_jsonl(telemetry)} if telemetry.exists() else set()
        # Complete lines only: a kill in the middle of an append leaves a last one without "\n".
        lines = reports.read_text(encoding="utf-8").split("\n")[:-1] if reports.exists() else []
        written = {FieldReport.from_json(line).report_id for line in lines if line}
        return Unsent(
            packets=tuple(p for p in self.packets if p.packet_id not in sent),
            reports=tuple(r for r in self.reports if r.report_id not in written),
        )

    @classmethod
    def decode(cls, state: dict[str, list[str]] | None) -> Unsent:
        if state is None:
            return cls()
        return cls(
            packets=tuple(TelemetryPacket.from_json(p) for p in state["packets"]),
            reports=tuple(FieldReport.from_json(r) for r in state["reports"]),
        )


class RunState:
    """The run's record and its stateful components, saved and loaded as one.

    Args:
        trainer: Model, optimizer, seed manager, precision, step engine, RNG and epoch.
        rails: The safety rails (escalation level, counters, events).
        load_kernel: Fetches a seed's kernel artifact when a state with seeds is loaded.
    """

    def __init__(
        self, *, trainer: Trainer, rails: SafetyRails, load_kernel: Callable[[KernelArtifact], LoadedKernel]
    ) -> None:
        self.trainer = trainer
        self.rails = rails
        self.load_kernel = load_kernel
        # One object for the state's lifetime (loads fill it in place), so callers may keep it.
        self.record = RunRecord()

    def state_dict(self, *, in_memory: bool = False) -> dict[str, Any]:
        """Everything to resume the run exactly (a checkpoint); with ``in_memory`` also the live
        extras a fork must put back but a checkpoint must not store.

        As with ``nn.Module.state_dict``, tensors are shared with the live run: save the result
        (a commit) or ``copy.deepcopy`` it (a fork) before the run goes on.
        """
        return {
            "trainer": self.trainer.state_dict(in_memory=in_memory),
            "emergency": self.rails.state_dict(in_memory=in_memory),
            **self.record.state_dict(in_memory=in_memory),
        }

    def load_state_dict(self, state: dict[str, Any], *, keep_escalation: bool = False) -> None:
        """Return to ``state`` (a checkpoint, or a ``state_dict(in_memory=True)``).

        From a checkpoint the live extras stay as they are (the caller decides what becomes of
        unsent telemetry). ``keep_escalation``: keep the rails' live escalation level and failure
        streak (a rollback after a failed epoch must not forget the failures it counts).
        """
        self.trainer.load_state_dict(state["trainer"], load_kernel=self.load_kernel)
        if not keep_escalation:
            self.rails.load_state_dict(state["emergency"])
        self.record.load_state_dict(state)

    # ------------------------------------------------------------------ commits

    def commit(self, tag: str) -> None:
        """Checkpoint the state under ``tag`` (on disk, and in memory for a fast rollback), with
        the step's telemetry and field reports that are sent after it (``UNSENT``)."""
        unsent = Unsent(packets=tuple(self.record.outbox), reports=tuple(self.record.report_outbox))
        self.rails.tiers.commit(tag, {**self.state_dict(), UNSENT: unsent.encode()})
        self.record.committed_tag = tag
        self.record.dirty = False

    def restore(self, tag: str, *, deadline_ms: float) -> Unsent:
        """Return to commit ``tag``, escalation included; the abandoned step's unsent telemetry
        and field reports are dropped (its retry makes them again).

        Returns:
            What the commit itself was to send after it (the caller sends what is missing).
        """
        state = self._load_commit(tag, deadline_ms=deadline_ms, why="restore", keep_escalation=False)
        self.record.outbox.clear()
        self.record.report_outbox.clear()
        self.record.committed_tag = tag
        self.record.dirty = False
        return Unsent.decode(state.get(UNSENT))

    def rollback(self, *, deadline_ms: float, why: str) -> None:
        """Back to the last commit in the middle of a step after a failure: the step's telemetry
        so far and the live escalation state are kept."""
        assert self.record.committed_tag is not None, "a run always has a commit (start) before it trains"
        self._load_commit(self.record.committed_tag, deadline_ms=deadline_ms, why=why, keep_escalation=True)

    def _load_commit(self, tag: str, *, deadline_ms: float, why: str, keep_escalation: bool) -> dict[str, Any]:
        # Through the rollback tiers (memory, then disk); the restore is a rails event.
        state, report = self.rails.tiers.restore(tag, deadline_ms=deadline_ms)
        self.load_state_dict(state, keep_escalation=keep_escalation)
        self.rails.restored(report, why=why)
        return state
