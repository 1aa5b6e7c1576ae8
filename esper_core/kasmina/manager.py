"""Kasmina's seed manager: germinates seeds into slots and moves them through their lifecycle.

Kasmina never compiles: kernels arrive already built (``LoadedKernel`` from Urza via the loader).
Per-seed gradient norms arrive once per epoch from the trainer (accumulated on the device);
``attribute_batch`` and ``export_seed_states`` are plain Python and run outside any compiled or
captured region.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from esper_core.contracts import (
    BlendSchedule,
    GateVerdict,
    KernelArtifact,
    SeedStage,
    SeedState,
    TelemetryEvent,
    TelemetryLevel,
)
from esper_core.karn.catalog import KarnCatalog
from esper_core.kasmina import gates
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.kinds import KernelSource, Nursery
from esper_core.kasmina.lifecycle import blend_alpha, check_transition
from esper_core.kasmina.loader import LoadedKernel
from esper_core.kasmina.param_groups import SeedParamGroups
from esper_core.kasmina.records import SeedRecord
from esper_core.kasmina.signals import GrowthSignals
from esper_core.kasmina.slot import SeedSlot

S = SeedStage
# Stages whose seed parameters are updated by the optimizer.
TRAINABLE = frozenset({S.TRAINING, S.BLENDING, S.PROBATIONARY})


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochObservation:
    """What Tolaria measured at the end of an epoch, for the gates.

    ``probe_losses`` maps a slot to the validation loss with its seed forced in (at the alpha its
    blend would start at) for TRAINING seeds, or forced out (alpha 0) for blended seeds; ``seed_grad_norms`` holds each
    trainable seed's epoch gradient norm (RMS over steps); ``isolation_probe`` returns the
    largest host-gradient difference between the seed present and absent for one slot, relative
    to the largest host gradient.
    """

    val_loss: float
    seed_grad_norms: dict[str, float]
    probe_losses: dict[str, float]
    isolation_probe: Callable[[str], float]
    sample_input: Callable[[str], torch.Tensor]


class SeedManager:
    """Owns the seed slots of one host model and runs every seed's lifecycle; the steps where
    kinds of seed differ are each slot's ``kind`` (``kinds.SeedKind``)."""

    def __init__(
        self,
        slots: dict[str, SeedSlot],
        *,
        catalog: KarnCatalog,
        config: KasminaConfig | None = None,
    ) -> None:
        self.slots = slots
        self.catalog = catalog
        self.config = config or KasminaConfig()
        self._seeds: dict[str, SeedRecord] = {}
        self._last_gate: dict[str, GateVerdict] = {}
        self._embargo_left: dict[str, int] = {}
        self._events: list[TelemetryEvent] = []
        self._samples: dict[str, int] = {}
        self.param_groups = SeedParamGroups()
        self._signals: GrowthSignals | None = None
        for slot in slots.values():
            slot.blend_mode = self.config.blend_mode

    # ------------------------------------------------------------------ optimizer binding

    def bind_optimizer(self, optimizer: torch.optim.Optimizer, *, base_lr: float) -> None:
        """Give each seed its own parameter group in ``optimizer`` (learning rate scaled)."""
        self.param_groups.bind(optimizer, base_lr=base_lr)

    def bind_signals(self, source: GrowthSignals) -> None:
        """Where data-aware initialisations read the host's signals (Tolaria's trainer)."""
        self._signals = source

    def optimizer_param_count(self, slot_id: str) -> int:
        """Parameters of ``slot_id`` still registered with the optimizer (G5 checks 0)."""
        return self.param_groups.param_count(slot_id)

    # ------------------------------------------------------------------ commands

    def germinate(
        self,
        slot_id: str,
        blueprint_id: str,
        *,
        params: dict[str, float],
        blend_schedule: BlendSchedule,
        blend_epochs: int,
        lr_scale: float,
        kernels: KernelSource | None = None,
    ) -> GateVerdict:
        """Grow a seed of the slot's kind in a DORMANT slot if G0 passes (a kind whose change is
        ``immediate`` is kept at once: the slot is DORMANT again when this returns).

        Args:
            slot_id: The slot.
            blueprint_id: A Karn blueprint for a branch slot, a width- or depth-menu entry for those slots.
            params: The seed's parameters (empty: the blueprint's defaults).
            blend_schedule: The alpha ramp once it blends.
            blend_epochs: The ramp's length.
            lr_scale: The seed's learning rate against the host's.
            kernels: How to fetch a compiled kernel, for kinds whose seeds are registry kernels.

        Returns:
            The G0 verdict; on failure the slot stays DORMANT.
        """
        slot = self._slot(slot_id)
        check_transition(slot_id, slot.stage, S.GERMINATED)
        nursery = self._nursery(kernels)
        sprout = slot.kind.sprout(slot, blueprint_id, params=params, nursery=nursery)
        self._gate(slot_id, sprout.verdict)
        if not sprout.verdict.passed:
            return sprout.verdict
        self._events.extend(sprout.events)
        if slot.kind.immediate:
            # G0 applied it (function-preserving): kept at once, and the slot is free again.
            self._set_stage(slot_id, S.GERMINATED)
            merge = slot.kind.fossilize(slot, self.param_groups.optimizer)
            assert merge is not None, f"an immediate kind merges: {slot.kind.name}"
            self._set_stage(slot_id, S.FOSSILIZED)
            self._set_stage(slot_id, S.DORMANT, reason=merge.reason)
            self._events.append(merge.event)
            return sprout.verdict
        slot.seed = sprout.module
        slot.alpha = 0.0
        record = SeedRecord(
            blueprint_id=sprout.blueprint_id,
            params=sprout.params,
            artifact=sprout.artifact,
            lr_scale=lr_scale,
            schedule=blend_schedule,
            blend_epochs=blend_epochs,
            metrics=dict(sprout.metrics),
        )
        self._seeds[slot_id] = record
        self._set_stage(slot_id, S.GERMINATED)
        self._events.extend(slot.kind.settle(slot, record, nursery))
        self.param_groups.add(slot_id, self.seed_parameters(slot_id), lr_scale=lr_scale)
        return sprout.verdict

    def advance(self, slot_id: str) -> SeedStage:
        """Tamiyo's ADVANCE: move a seed one stage on now, if its gates allow."""
        slot = self._slot(slot_id)
        seed = self._require_seed(slot_id)
        if slot.stage is S.GERMINATED:
            self._set_stage(slot_id, S.TRAINING)
        elif slot.stage is S.TRAINING:
            last = self._last_gate.get(slot_id)
            if last is not None and not last.passed:
                raise ValueError(f"slot {slot_id} cannot advance: {last.gate.value} failed ({last.reason})")
            self._enter_blending(slot_id)
        elif slot.stage is S.BLENDING:
            slot.alpha = 1.0
            self._set_stage(slot_id, S.PROBATIONARY)
        else:
            raise ValueError(
                f"slot {slot_id} is {slot.stage.value}; advance moves germinated, training or blending seeds"
            )
        seed.epochs_in_stage = 0
        return slot.stage

    def fossilize(self, slot_id: str) -> None:
        """Keep a PROBATIONARY seed for good: freeze its parameters and drop its optimizer group."""
        slot = self._slot(slot_id)
        last = self._last_gate.get(slot_id)
        if slot.stage is not S.PROBATIONARY or last is None or last.gate.value != "g4_system_impact" or not last.passed:
            raise ValueError(
                f"slot {slot_id} cannot be fossilized: it must be probationary with a passed G4 "
                f"(stage {slot.stage.value}, last gate {last.gate.value if last else 'none'})"
            )
        merge = slot.kind.fossilize(slot, self.param_groups.optimizer)
        self.param_groups.remove(slot_id)
        if merge is None:  # the seed stays in its slot, frozen
            self._set_stage(slot_id, S.FOSSILIZED)
            return
        # The seed is part of the host now: the slot is free to grow it again.
        slot.seed = None
        slot.alpha = 0.0
        self._set_stage(slot_id, S.FOSSILIZED)
        self._seeds.pop(slot_id)
        self._set_stage(slot_id, S.DORMANT, reason=merge.reason)
        self._events.append(merge.event)

    def cull(self, slot_id: str, *, reason: str) -> None:
        """Remove a seed, free its parameters and optimizer state, and embargo the slot."""
        slot = self._slot(slot_id)
        check_transition(slot_id, slot.stage, S.CULLED)
        self.param_groups.remove(slot_id)
        slot.seed = None
        slot.alpha = 0.0
        self._seeds.pop(slot_id, None)
        self._set_stage(slot_id, S.CULLED, reason=reason)
        self._set_stage(slot_id, S.EMBARGOED)
        self._embargo_left[slot_id] = self.config.embargo_epochs

    # ------------------------------------------------------------------ per step / per epoch

    def start_epoch(self) -> None:
        """Promote germinated seeds to TRAINING, set each seed's learning-rate factor
        (``KasminaConfig.isolation_lr`` in TRAINING, the ``blend_lr_warmup_epochs`` ramp early in
        BLENDING, 1 otherwise), reset the per-epoch accumulators."""
        for slot_id, slot in self.slots.items():
            if slot.stage is S.GERMINATED:
                self._set_stage(slot_id, S.TRAINING)
        schedule, warmup = self.config.isolation_lr, self.config.blend_lr_warmup_epochs
        for slot_id, seed in self._seeds.items():
            stage = self.slots[slot_id].stage
            factor = 1.0
            if stage is S.TRAINING:
                factor = schedule.factor_at(seed.epochs_in_stage, self.config.min_training_epochs)
            elif stage is S.BLENDING and seed.epochs_in_stage < warmup:
                factor = (seed.epochs_in_stage + 1) / (warmup + 1)
            self.param_groups.set_factor(slot_id, factor)
        self._samples.clear()

    def structure_signature(self) -> tuple[tuple[str, str, str | None, Any], ...]:
        """What the forward pass's code path depends on (stage, seed and owned shape of each slot);
        alphas are left out because slots read them from device buffers."""
        return tuple(
            (sid, slot.stage.value, self._seed_key(sid), slot.kind.architecture(slot))
            for sid, slot in self.slots.items()
        )

    def trainable_slots(self) -> list[str]:
        """Slots whose seed is updated by the optimizer this epoch, in forward order."""
        return [sid for sid, slot in self.slots.items() if slot.stage in TRAINABLE and slot.seed is not None]

    def attribute_batch(self, batch_size: int) -> dict[str, int]:
        """Samples of this batch attributed to each trainable seed (every sample passes through
        every slot, so each trainable seed sees the whole batch)."""
        share = {sid: batch_size for sid, slot in self.slots.items() if slot.stage in TRAINABLE}
        for sid, n in share.items():
            self._samples[sid] = self._samples.get(sid, 0) + n
        return share

    def probe_plan(self) -> dict[str, float]:
        """Which slots Tolaria should evaluate with the seed forced in (at the blend's first alpha)
        or out (0.0)."""
        plan = {}
        for sid, slot in self.slots.items():
            if slot.stage is S.TRAINING:
                # G2 asks whether the seed can take the blend's first step, so probe at that alpha.
                # At alpha 1 a seed trained in isolation is judged on an output it never had to
                # keep in scale (its gradient is that of adding delta, which does not shrink as
                # delta grows); blending then trains it jointly with the host. On mnist1d-cnn,
                # probing at 1 culled the best fixed schedule's seed on 4 of 8 held-out seeds,
                # and the seeds it culled gained when the check was lifted (docs/growth-benchmark.md, "Headroom").
                seed = self._seeds[sid]
                plan[sid] = blend_alpha(seed.schedule, 1, seed.blend_epochs)
            elif slot.stage in (S.BLENDING, S.PROBATIONARY):
                plan[sid] = 0.0
        return plan

    @contextlib.contextmanager
    def probe(self, slot_id: str, alpha: float) -> Iterator[None]:
        """Within the block, slot ``slot_id`` applies its seed at ``alpha`` (for evaluation)."""
        slot = self._slot(slot_id)
        slot.probe_alpha = alpha
        try:
            yield
        finally:
            slot.probe_alpha = None

    @contextlib.contextmanager
    def without_seed(self, slot_id: str) -> Iterator[None]:
        """Within the block, slot ``slot_id`` passes its input through untouched."""
        slot = self._slot(slot_id)
        seed, slot.seed = slot.seed, None
        try:
            yield
        finally:
            slot.seed = seed

    def end_epoch(self, obs: EpochObservation) -> list[GateVerdict]:
        """Run the gates due for each slot on this epoch's measurements."""
        norms = obs.seed_grad_norms
        verdicts: list[GateVerdict] = []
        for sid, slot in self.slots.items():
            verdict = self._end_epoch_slot(sid, slot, obs, norms.get(sid, 0.0))
            if verdict is not None:
                self._gate(sid, verdict)
                verdicts.append(verdict)
        return verdicts

    def _end_epoch_slot(self, sid: str, slot: SeedSlot, obs: EpochObservation, grad_norm: float) -> GateVerdict | None:
        cfg = self.config
        if slot.stage is S.EMBARGOED:
            self._embargo_left[sid] -= 1
            if self._embargo_left[sid] > 0:
                return None
            verdict = gates.g5_reset(
                has_seed=slot.seed is not None, alpha=slot.alpha, optimizer_params=self.optimizer_param_count(sid)
            )
            if verdict.passed:
                self._set_stage(sid, S.DORMANT)
            return verdict
        seed = self._seeds.get(sid)
        if seed is None or slot.stage is S.FOSSILIZED:
            return None
        seed.age += 1
        seed.epochs_in_stage += 1
        seed.metrics.update({"grad_norm": grad_norm, "samples": float(self._samples.get(sid, 0))})
        probe = obs.probe_losses.get(sid)
        if slot.stage is S.TRAINING:
            if probe is not None:
                seed.with_seed_losses.append(probe)
                seed.metrics.update({"val_loss_with_seed": probe, "val_loss_without_seed": obs.val_loss})
            if slot.kind.isolated_training:
                verdict = gates.g1_gradient_health(grad_norm, config=cfg.gates)
            else:
                verdict = gates.g1_waived(slot.kind.name)
                self._gate(sid, verdict)  # recorded: a reader of the run sees why no gradient was fine
            if not verdict.passed:
                return verdict
            verdict = gates.g2_stability(seed.with_seed_losses, host_val_loss=obs.val_loss, config=cfg.gates)
            if not verdict.passed or seed.epochs_in_stage < cfg.min_training_epochs:
                return verdict
            self._gate(sid, verdict)
            return self._g3_then_blend(sid, slot, obs)
        if probe is not None:
            seed.metrics.update({"val_loss_with_seed": obs.val_loss, "val_loss_without_seed": probe})
        if slot.stage is S.BLENDING:
            slot.alpha = blend_alpha(seed.schedule, seed.epochs_in_stage + 1, seed.blend_epochs)
            if seed.epochs_in_stage >= seed.blend_epochs:
                slot.alpha = 1.0
                self._set_stage(sid, S.PROBATIONARY)
            return None
        if slot.stage is S.PROBATIONARY and probe is not None:
            return gates.g4_system_impact(val_loss_with=obs.val_loss, val_loss_without=probe, config=cfg.gates)
        return None

    def _g3_then_blend(self, sid: str, slot: SeedSlot, obs: EpochObservation) -> GateVerdict:
        assert slot.seed is not None
        x = obs.sample_input(sid)
        with torch.inference_mode():
            y = slot.seed(x)
        verdict = gates.g3_interface(
            input_shape=slot.delta_shape(x),
            output_shape=tuple(y.shape),
            input_dtype=x.dtype,
            output_dtype=y.dtype,
            isolation_rel_diff=obs.isolation_probe(sid),
            config=self.config.gates,
        )
        if verdict.passed:
            self._enter_blending(sid)
        else:
            self._event(
                "kasmina.isolation.violation",
                TelemetryLevel.ERROR,
                verdict.reason,
                slot_id=sid,
            )
        return verdict

    def _enter_blending(self, sid: str) -> None:
        seed = self._seeds[sid]
        self._set_stage(sid, S.BLENDING)
        seed.epochs_in_stage = 0
        self.slots[sid].alpha = blend_alpha(seed.schedule, 1, seed.blend_epochs)

    # ------------------------------------------------------------------ exports

    def seed_parameters(self, slot_id: str) -> list[nn.Parameter]:
        """Parameters of the seed in ``slot_id`` (empty when the slot holds none)."""
        seed = self._slot(slot_id).seed
        return [] if seed is None else list(seed.parameters())

    def export_seed_states(
        self, *, activation_grad_norms: Mapping[str, float | None] | None = None
    ) -> tuple[SeedState, ...]:
        """A ``SeedState`` per slot, in forward order (plain Python: no tensor work).

        Args:
            activation_grad_norms: Tolaria's bottleneck signal per slot id, if measured.
        """
        norms = activation_grad_norms or {}
        states = []
        for sid, slot in self.slots.items():
            seed = self._seeds.get(sid)
            states.append(
                SeedState(
                    slot_id=sid,
                    layer=slot.layer,
                    shape_profile=slot.profile_name,
                    stage=slot.stage,
                    kind=slot.kind.slot_kind,
                    blueprint_id=seed.blueprint_id if seed else None,
                    artifact_sha256=seed.artifact.sha256 if seed and seed.artifact else None,
                    alpha=slot.alpha,
                    blend_mode=slot.blend_mode,
                    age_epochs=seed.age if seed else 0,
                    epochs_in_stage=seed.epochs_in_stage if seed else 0,
                    param_count=sum(p.numel() for p in self.seed_parameters(sid)),
                    metrics=dict(seed.metrics) if seed else {},
                    last_gate=self._last_gate.get(sid),
                    activation_grad_norm=norms.get(sid),
                )
            )
        return tuple(states)

    def copy_seeds_into(self, model: nn.Module, *, merged: bool) -> None:
        """Put every live seed into ``model``, a plain copy of the host with the same module names
        (``SeedKind.copy_into``): seeds that merge first, while the host's names are unchanged.

        Args:
            model: The plain copy, changed in place.
            merged: Fold seeds that merge into the host's layers, or keep them beside as they train.
        """
        live = [(sid, slot) for sid, slot in self.slots.items() if slot.seed is not None and sid in self._seeds]
        for sid, slot in sorted(live, key=lambda item: not item[1].kind.merges):
            slot.kind.copy_into(slot, self._seeds[sid], model, catalog=self.catalog, merged=merged)

    def copy_fossils_into(self, model: nn.Module) -> None:
        """Put every fossilised seed that stays in its slot (a branch seed; a width seed merged
        when it fossilised) into ``model``, a plain copy of the host with the same module names,
        as ordinary PyTorch (``SeedKind.copy_into``): they are part of the network it exports.

        Args:
            model: The plain copy (``GrowableModel.plain_copy``), changed in place.
        """
        for sid, slot in self.slots.items():
            if slot.seed is not None and slot.stage is SeedStage.FOSSILIZED and sid in self._seeds:
                slot.kind.copy_into(slot, self._seeds[sid], model, catalog=self.catalog, merged=True)

    def drain_events(self) -> list[TelemetryEvent]:
        """Events recorded since the last call (gate verdicts, stage changes, fallbacks)."""
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self, *, in_memory: bool = False) -> dict:
        """Lifecycle state of every slot; seed weights live in the host's own state dict.

        ``in_memory``: also the events not drained yet (a fork of the live run puts them back; a
        checkpoint never holds them).
        """
        slots = {}
        for sid, slot in self.slots.items():
            seed = self._seeds.get(sid)
            slots[sid] = {
                "stage": slot.stage.value,
                "alpha": slot.alpha,
                "embargo_left": self._embargo_left.get(sid, 0),
                "last_gate": self._last_gate[sid].to_json() if sid in self._last_gate else None,
                "seed": None
                if seed is None
                else {
                    "blueprint_id": seed.blueprint_id,
                    "params": seed.params,
                    "artifact": seed.artifact.to_json() if seed.artifact else None,
                    "lr_scale": seed.lr_scale,
                    "schedule": seed.schedule.value,
                    "blend_epochs": seed.blend_epochs,
                    "age": seed.age,
                    "epochs_in_stage": seed.epochs_in_stage,
                    "with_seed_losses": list(seed.with_seed_losses),
                    "metrics": dict(seed.metrics),
                    "frozen": slot.stage is S.FOSSILIZED,
                },
            }
        # The part of the host's shape each slot owns (a width slot's layer width, a depth slot's
        # stack depth), so that a restore reshapes the host before its weights load.
        architecture = {sid: a for sid, slot in self.slots.items() if (a := slot.kind.architecture(slot)) is not None}
        state = {"slots": slots, "group_order": self.param_groups.order(), "architecture": architecture}
        return {**state, "events": list(self._events)} if in_memory else state

    def load_state_dict(self, state: dict, *, load_kernel: Callable[[KernelArtifact], LoadedKernel]) -> None:
        """Restore slots (re-fetching kernels through ``load_kernel``) and optimizer groups.

        Undrained events are replaced only by a state that holds them (``state_dict(in_memory=True)``).
        """
        for sid in list(self._seeds):
            self.param_groups.remove(sid)
        self._seeds.clear()
        self._last_gate.clear()
        self._embargo_left.clear()
        # Checkpoints before seed kinds recorded only widths, under "widths".
        for sid, value in state.get("architecture", state.get("widths", {})).items():
            slot = self._slot(sid)
            slot.kind.restore_architecture(slot, value, self.param_groups.optimizer)
        for sid, entry in state["slots"].items():
            slot = self._slot(sid)
            slot.stage = S(entry["stage"])
            slot.alpha = float(entry["alpha"])
            slot.seed = None
            if entry["embargo_left"]:
                self._embargo_left[sid] = int(entry["embargo_left"])
            if entry["last_gate"]:
                self._last_gate[sid] = GateVerdict.from_json(entry["last_gate"])
            s = entry["seed"]
            if s is None:
                continue
            record = SeedRecord(
                blueprint_id=s["blueprint_id"],
                params=dict(s["params"]),
                artifact=None if s["artifact"] is None else KernelArtifact.from_json(s["artifact"]),
                lr_scale=float(s["lr_scale"]),
                schedule=BlendSchedule(s["schedule"]),
                blend_epochs=int(s["blend_epochs"]),
                age=int(s["age"]),
                epochs_in_stage=int(s["epochs_in_stage"]),
                with_seed_losses=list(s["with_seed_losses"]),
                metrics=dict(s["metrics"]),
            )
            slot.seed = slot.kind.restore(slot, record, load_kernel)
            if s["frozen"]:
                for p in slot.seed.parameters():
                    p.requires_grad_(False)
            self._seeds[sid] = record
        for sid in state["group_order"]:
            self.param_groups.add(sid, self.seed_parameters(sid), lr_scale=self._seeds[sid].lr_scale)
        if "events" in state:
            self._events = list(state["events"])

    # ------------------------------------------------------------------ internals

    def _seed_key(self, slot_id: str) -> str | None:
        seed = self._seeds.get(slot_id)
        if seed is None:
            return None
        return self.slots[slot_id].kind.seed_key(seed)

    def _slot(self, slot_id: str) -> SeedSlot:
        slot = self.slots.get(slot_id)
        if slot is None:
            raise ValueError(f"unknown slot {slot_id!r}; this host has slots {sorted(self.slots)}")
        return slot

    def _require_seed(self, slot_id: str) -> SeedRecord:
        seed = self._seeds.get(slot_id)
        if seed is None:
            raise ValueError(f"slot {slot_id} holds no seed (stage {self.slots[slot_id].stage.value})")
        return seed

    def _nursery(self, kernels: KernelSource | None) -> Nursery:
        return Nursery(
            catalog=self.catalog,
            config=self.config,
            slots=self.slots,
            signals=self._signals,
            kernels=kernels,
            optimizer=self.param_groups.optimizer,
        )

    def _set_stage(self, slot_id: str, stage: SeedStage, *, reason: str = "") -> None:
        slot = self.slots[slot_id]
        check_transition(slot_id, slot.stage, stage)
        previous, slot.stage = slot.stage, stage
        seed = self._seeds.get(slot_id)
        if seed is not None:
            seed.epochs_in_stage = 0
        self._event(
            "kasmina.seed.stage",
            TelemetryLevel.INFO,
            reason or f"{previous.value} -> {stage.value}",
            slot_id=slot_id,
            previous=previous.value,
            stage=stage.value,
        )

    def _gate(self, slot_id: str, verdict: GateVerdict) -> None:
        self._last_gate[slot_id] = verdict
        self._event(
            f"kasmina.gate.{verdict.gate.value}",
            TelemetryLevel.INFO if verdict.passed else TelemetryLevel.WARNING,
            verdict.reason,
            slot_id=slot_id,
            passed=verdict.passed,
        )

    def _event(self, name: str, level: TelemetryLevel, message: str, **attributes: str | float | bool) -> None:
        self._events.append(TelemetryEvent(name=name, level=level, message=message, attributes=attributes))
