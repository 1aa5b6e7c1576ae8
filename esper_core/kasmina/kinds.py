"""Seed kinds: the steps of growing that differ between a branch seed and a width seed.

The seed manager runs one lifecycle for every seed (gates, isolation, blending, cull, embargo) and
asks the slot's ``SeedKind`` for the rest: how a seed is built and checked at germination (G0),
how it is initialised from the host's signals, what keeping it means (a branch seed stays in its
slot; a width seed merges into the host and frees the slot), what part of the architecture it
owns in a checkpoint, and how it is rebuilt on restore. The depth kind (a block inserted into a
stack) implements the same protocol; nothing outside a kind asks which kind a slot holds.

Kinds are stateless: what a seed is lives in its slot and its ``SeedRecord``. They return what
happened (verdicts, metrics, events) and the manager records it, so the order of a seed's
telemetry is the lifecycle's, whatever the kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, GateVerdict, KernelArtifact, TelemetryEvent, TelemetryLevel
from esper_core.contracts.enums import SlotKind
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina import gates
from esper_core.kasmina.fastpath import prepare_seed
from esper_core.kasmina.loader import LoadedKernel, check_guard
from esper_core.kasmina.records import SeedRecord
from esper_core.kasmina.seed_init import gradmax_init_
from esper_core.kasmina.signals import GrowthSignals

if TYPE_CHECKING:
    # The config module imports the width package, whose slot imports this module.
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.kasmina.slot import SeedSlot

KernelSource = Callable[[str, ShapeProfile], LoadedKernel]
"""``(blueprint_id, slot profile) -> kernel``: how the caller fetches a compiled kernel (from Urza,
guards checked, SHA-256 verified). Only kinds whose seeds are registry kernels call it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Nursery:
    """What a kind may read while it builds a seed: the manager's fixed parts and the caller's
    sources. ``signals``, ``kernels`` and ``optimizer`` are None when nobody supplies them."""

    catalog: KarnCatalog
    config: KasminaConfig
    slots: Mapping[str, SeedSlot]
    signals: GrowthSignals | None
    kernels: KernelSource | None
    optimizer: torch.optim.Optimizer | None = None
    """The optimizer training the host (a kind may seed a new seed's state from the host's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sprout:
    """A kind's answer to a germination: G0's verdict and, when it passed, the seed to attach.

    Attributes:
        verdict: G0 (a refusal leaves the slot DORMANT).
        module: The seed module (None when refused).
        blueprint_id: What ``SeedState.blueprint_id`` reports for the seed.
        params: The seed's parameters, kept in its record.
        artifact: The registry kernel it was loaded from, if any.
        metrics: Metrics its record starts with.
        events: Telemetry to record once the gate's verdict is (e.g. an eager fallback kernel).
    """

    verdict: GateVerdict
    module: nn.Module | None = None
    blueprint_id: str = ""
    params: dict[str, float] = field(default_factory=dict)
    artifact: KernelArtifact | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    events: tuple[TelemetryEvent, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Merge:
    """A kept seed folded into the host: its slot is free again (FOSSILIZED -> DORMANT).

    Attributes:
        reason: Why the slot is DORMANT again (the stage event's message).
        event: The merge's own telemetry event.
    """

    reason: str
    event: TelemetryEvent


class SeedKind(Protocol):
    """What one kind of seed does at the steps where kinds differ (the lifecycle is the manager's)."""

    name: str
    """The kind's name (``"branch"``, ``"width"``, ``"depth"``, ``"stream"``), as checkpointed."""
    slot_kind: SlotKind
    """What Tamiyo's graph and a ``SeedState`` call its slots (her fixed vocabulary of kinds)."""
    compiled: bool
    """Its seeds are registry kernels that Tezzeret compiles ahead of time (False: Kasmina
    builds them from the host itself, and a run plans no compile for them)."""
    merges: bool
    """Keeping a seed folds it into the host (the slot is free again); False: it stays in its slot."""
    isolated_training: bool
    """Its seeds train in isolation while TRAINING: joined with the host's value and the gradient
    of adding their delta (``SeedSlot.apply_seed``). False: a TRAINING seed is neither run nor
    trained (G1 is waived) and first trains, jointly with the host, when it blends."""
    menu: tuple[str, ...]
    """What this kind builds from the host, offered to Tamiyo beside Karn's blueprints (empty for
    a compiled kind: Karn's catalogue and the slot's profile say what fits)."""
    immediate: bool
    """``sprout`` changes the host itself, keeping its function, and the change is kept at once
    (GERMINATED -> FOSSILIZED -> DORMANT in one command; ``fossilize`` only reports it): there is
    no side module to isolate, blend or cull. False: the lifecycle runs."""

    def describe(self, entry: str) -> BlueprintDescriptor:
        """The descriptor Tamiyo sees for ``entry`` of ``menu``."""
        ...

    def param_cost(self, slot: SeedSlot, entry: str) -> int:
        """Parameters ``entry`` of ``menu`` adds in ``slot`` now (built on the meta device)."""
        ...

    def check_config(self, slot: SeedSlot, config: KasminaConfig) -> None:
        """Refuse, when a run is planned, a ``config`` under which no seed of this kind could start
        in ``slot`` (``slot`` may be on the meta device); the ``ValueError`` names the fix."""
        ...

    def sprout(self, slot: SeedSlot, blueprint_id: str, *, params: dict[str, float], nursery: Nursery) -> Sprout:
        """Check G0 for ``blueprint_id`` in ``slot`` and build the seed (not attached yet); an
        ``immediate`` kind changes the host here instead, and leaves it as it was when G0 fails."""
        ...

    def settle(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        """Work on a seed just attached to ``slot`` (initialisation, pre-warm); metrics go into
        ``record.metrics``. Returns the events to record."""
        ...

    def fossilize(self, slot: SeedSlot, optimizer: torch.optim.Optimizer | None) -> Merge | None:
        """Keep ``slot``'s seed for good. Returns how it merged into the host, or None when it
        stays in its slot (frozen). Runs before the seed's optimizer group is dropped."""
        ...

    def seed_key(self, record: SeedRecord) -> str:
        """What identifies the seed's code path (the step engine re-traces when it changes)."""
        ...

    def architecture(self, slot: SeedSlot) -> Any:
        """The part of the host's shape this slot owns, JSON-able (None when it owns none)."""
        ...

    def restore_architecture(self, slot: SeedSlot, value: Any, optimizer: torch.optim.Optimizer | None) -> None:
        """Give the host the shape ``architecture`` recorded, before its weights load; parameters
        the host gains or loses join or leave ``optimizer``'s host groups (its state is the
        checkpoint's to load)."""
        ...

    def restore(
        self, slot: SeedSlot, record: SeedRecord, load_kernel: Callable[[KernelArtifact], LoadedKernel]
    ) -> nn.Module:
        """Rebuild the seed ``record`` describes for ``slot`` (weights come with the host's state)."""
        ...

    def copy_into(
        self, slot: SeedSlot, record: SeedRecord, model: nn.Module, *, catalog: KarnCatalog, merged: bool
    ) -> None:
        """Put ``slot``'s seed into ``model``, a plain copy of the host (the same module names), as
        ordinary PyTorch: merged into the host where this kind merges and ``merged`` is set, else
        beside the module it grows on, computing what it computes in its stage now."""
        ...


class BranchKind:
    """A compiled blueprint from the registry, added to the activation of the module it grows on."""

    name = "branch"
    slot_kind = SlotKind.BRANCH
    compiled = True
    merges = False
    isolated_training = True
    immediate = False
    menu: tuple[str, ...] = ()

    def describe(self, entry: str) -> BlueprintDescriptor:
        raise ValueError(f"branch seeds are Karn blueprints: describe {entry!r} with the catalogue")

    def param_cost(self, slot: SeedSlot, entry: str) -> int:
        raise ValueError(f"branch seeds are Karn blueprints: the plan measures {entry!r} from the catalogue")

    def check_config(self, slot: SeedSlot, config: KasminaConfig) -> None:
        """Nothing to refuse: a kernel's fit to the slot is G0's to check when it germinates."""

    def sprout(self, slot: SeedSlot, blueprint_id: str, *, params: dict[str, float], nursery: Nursery) -> Sprout:
        if nursery.kernels is None:
            raise ValueError(
                f"slot {slot.slot_id} takes registry kernels: germinate it with kernels= (how to fetch one)"
            )
        kernel = nursery.kernels(blueprint_id, slot.profile)
        artifact = kernel.artifact
        params = dict(params or artifact.params)
        verdict = gates.g0_sanity(
            nursery.catalog,
            blueprint_id=artifact.blueprint_id,
            params=params,
            guard=artifact.guard,
            profile=slot.profile,
        )
        if not verdict.passed:
            return Sprout(verdict=verdict)
        events: tuple[TelemetryEvent, ...] = ()
        if kernel.fallback:
            events = (
                _event(
                    "kasmina.kernel.fallback",
                    TelemetryLevel.WARNING,
                    f"{artifact.blueprint_id} runs eagerly: {artifact.fallback_reason}",
                    slot_id=slot.slot_id,
                    blueprint_id=artifact.blueprint_id,
                ),
            )
        return Sprout(
            verdict=verdict,
            # G0 verified the guard against the slot's fixed shape: the per-call checks can go.
            module=prepare_seed(kernel.module, slot.profile),
            blueprint_id=artifact.blueprint_id,
            params=params,
            artifact=artifact,
            metrics={"kernel_load_ms": kernel.load_ms},
            events=events,
        )

    def settle(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        events = self._initialise(slot, record, nursery)
        # The initialisation's metrics come first in the record, then the kernel's timings.
        load_ms = record.metrics.pop("kernel_load_ms")
        record.metrics.update({"kernel_load_ms": load_ms, "kernel_first_use_ms": _prewarm(slot)})
        return events

    def _initialise(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        """``KasminaConfig.seed_init`` on the attached seed (one pass over a few batches)."""
        if nursery.config.seed_init != "gradmax":
            return []
        layers = nursery.catalog.get(record.blueprint_id).gradmax
        if layers is None or nursery.signals is None:
            why = "the blueprint names no GradMax layers" if layers is None else "no trainer supplies slot gradients"
            return [_event("kasmina.seed.init", TelemetryLevel.INFO, f"default init kept: {why}", slot_id=slot.slot_id)]
        assert slot.seed is not None
        signals = nursery.signals.site_signals(slot.reader, slot.joiner, nursery.config.seed_init_batches)
        result = gradmax_init_(slot.seed, layers, [(s.x, s.g) for s in signals])
        record.metrics.update(result.metrics())
        return [
            _event(
                "kasmina.seed.init",
                TelemetryLevel.INFO,
                f"gradmax: {result.rows}/{result.hidden} input rows capture {result.energy:.0%} of the slot's "
                f"gradient statistic ({result.samples} samples)",
                slot_id=slot.slot_id,
            )
        ]

    def fossilize(self, slot: SeedSlot, optimizer: torch.optim.Optimizer | None) -> Merge | None:
        assert slot.seed is not None
        for p in slot.seed.parameters():
            p.requires_grad_(False)
        slot.alpha = 1.0
        return None

    def seed_key(self, record: SeedRecord) -> str:
        assert record.artifact is not None
        return record.artifact.sha256

    def architecture(self, slot: SeedSlot) -> Any:
        return None

    def restore_architecture(self, slot: SeedSlot, value: Any, optimizer: torch.optim.Optimizer | None) -> None:
        raise ValueError(
            f"branch slot {slot.slot_id} owns no part of the host's shape, yet a checkpoint gives it {value!r}"
        )

    def restore(
        self, slot: SeedSlot, record: SeedRecord, load_kernel: Callable[[KernelArtifact], LoadedKernel]
    ) -> nn.Module:
        if record.artifact is None:
            raise ValueError(f"branch slot {slot.slot_id}: the checkpoint's seed names no kernel artifact")
        check_guard(record.artifact.guard, feature_shape=slot.profile.feature_shape, dtype=slot.profile.dtype)
        return prepare_seed(load_kernel(record.artifact).module, slot.profile)

    def copy_into(
        self, slot: SeedSlot, record: SeedRecord, model: nn.Module, *, catalog: KarnCatalog, merged: bool
    ) -> None:
        """The seed as a plain residual block built from Karn with its weights, after the module
        it grows on (the slot's id names that module)."""
        assert slot.seed is not None
        block = catalog.build(record.blueprint_id, slot.profile)
        block.load_state_dict(slot.seed.state_dict())
        parent_name, _, child = slot.slot_id.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, nn.Sequential(getattr(parent, child), Residual(block)))


BRANCH = BranchKind()


class Residual(nn.Module):
    """``x + block(x)``: how a plain PyTorch model carries a branch seed's block."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def _prewarm(slot: SeedSlot) -> float:
    # One call on a representative batch so the first training step pays no warm-up.
    assert slot.seed is not None
    param = next(slot.seed.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    x = torch.zeros((2, *slot.profile.feature_shape), device=device)
    start = time.perf_counter()
    with torch.inference_mode():
        slot.seed(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _event(name: str, level: TelemetryLevel, message: str, **attributes: str | float | bool) -> TelemetryEvent:
    return TelemetryEvent(name=name, level=level, message=message, attributes=attributes)
