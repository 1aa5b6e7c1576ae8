"""The depth kind: seeds that insert a block into a stack of identical blocks and, once kept,
merge into it.

A depth seed goes through the same lifecycle as a branch or width seed. Germination builds the
block from the stack's last one (a copy, or the same architecture re-initialised; no kernel from
the registry) and, for a copy, gives it copies of that block's optimizer moments, so it trains on
as the block it copies would have. It joins the host after the last block as
``h + alpha * (block(h) - h)``: isolated while TRAINING (the host's output and gradients are
exactly the host's), ramped in while BLENDING, gone without a trace when culled. Keeping it
appends the block to the stack and frees the slot to deepen the stack again. The slot owns the
stack's depth, which a checkpoint records so that a restore deepens the host before loading its
weights. While training, the seed runs in the seed manager's own parameter group with
``KasminaConfig.isolation_lr``'s factor and warm-up, as every seed does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, GateVerdict, KernelArtifact, TelemetryEvent, TelemetryLevel
from esper_core.contracts.enums import GateId
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.depth import DEPTH_MENU, check_depth_entry, depth_descriptor
from esper_core.kasmina.depth.merge import merge_depth_seed, resize_depth
from esper_core.kasmina.depth.seed import DepthSeed, blank_copy, new_block
from esper_core.kasmina.kinds import Merge, Nursery, Sprout
from esper_core.kasmina.loader import LoadedKernel
from esper_core.kasmina.records import SeedRecord

if TYPE_CHECKING:
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.kasmina.depth.slot import DepthSlot
    from esper_core.kasmina.slot import SeedSlot


class DepthKind:
    """One new block after a stack's last (``DepthSeed``), appended to the stack when kept."""

    name = "depth"
    compiled = False
    merges = True
    menu = tuple(DEPTH_MENU)

    def describe(self, entry: str) -> BlueprintDescriptor:
        return depth_descriptor(entry)

    def param_cost(self, slot: SeedSlot, entry: str) -> int:
        """One block's parameters (read from shapes: the host may be on the meta device)."""
        check_depth_entry(entry)
        return sum(p.numel() for p in _depth_slot(slot).stack[-1].parameters())

    def check_config(self, slot: SeedSlot, config: KasminaConfig) -> None:
        """Nothing to refuse: a depth seed starts as the identity under every ``KasminaConfig``
        (its blend is always residual, its block needs no data-aware initialisation)."""

    def sprout(self, slot: SeedSlot, blueprint_id: str, *, params: dict[str, float], nursery: Nursery) -> Sprout:
        """``blueprint_id`` is a depth-menu entry; the block goes after the stack's last one."""
        ds = _depth_slot(slot)
        check_depth_entry(blueprint_id)
        stack = ds.stack
        depth = len(stack)
        verdict = GateVerdict(
            gate=GateId.G0_SANITY,
            passed=True,
            reason=f"insert a {blueprint_id} block after {ds.site.stack}.{depth - 1} ({depth} -> {depth + 1} blocks)",
        )
        return Sprout(
            verdict=verdict,
            module=DepthSeed(new_block(stack[-1], blueprint_id)),
            blueprint_id=blueprint_id,
            params={},
            metrics={"depth": float(depth)},
        )

    def settle(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        """A stacked copy takes copies of its source block's optimizer state (Adam's moments and
        step count), when the source has any: it continues the source's trajectory instead of
        restarting Adam's bias correction, whose first steps are about lr each."""
        ds = _depth_slot(slot)
        optimizer = nursery.optimizer
        if record.blueprint_id != "depth-stack" or optimizer is None:
            return []
        seed = ds.seed
        assert isinstance(seed, DepthSeed)
        copied = 0
        source = dict(ds.stack[-1].named_parameters())
        for name, p in seed.block.named_parameters():
            state = optimizer.state.get(source[name])
            if state:
                optimizer.state[p] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
                copied += 1
        record.metrics["moments_copied"] = float(copied)
        return []

    def fossilize(self, slot: SeedSlot, optimizer: torch.optim.Optimizer | None) -> Merge | None:
        ds = _depth_slot(slot)
        seed = ds.seed
        assert isinstance(seed, DepthSeed)
        stack = ds.stack
        before = len(stack)
        # The seed's hook sits on the block that is last now; it goes when the manager takes the
        # seed out of the slot, right after this.
        after = merge_depth_seed(ds.host, stack, seed, optimizer)
        name = ds.site.stack
        return Merge(
            reason=f"merged: {name} {before} -> {after} blocks",
            event=TelemetryEvent(
                name="kasmina.depth.merged",
                level=TelemetryLevel.INFO,
                message=f"{name} deepened {before} -> {after} blocks",
                attributes={"slot_id": ds.slot_id, "stack": name, "depth": float(after)},
            ),
        )

    def seed_key(self, record: SeedRecord) -> str:
        return f"{self.name}:{record.blueprint_id}"

    def architecture(self, slot: SeedSlot) -> Any:
        """The stack's current depth (blocks)."""
        return len(_depth_slot(slot).stack)

    def restore_architecture(self, slot: SeedSlot, value: Any, optimizer: torch.optim.Optimizer | None) -> None:
        ds = _depth_slot(slot)
        resize_depth(ds.host, ds.stack, int(value), optimizer)

    def restore(
        self, slot: SeedSlot, record: SeedRecord, load_kernel: Callable[[KernelArtifact], LoadedKernel]
    ) -> nn.Module:
        check_depth_entry(record.blueprint_id)
        # Its weights come with the host's state dict, loaded after this.
        return DepthSeed(blank_copy(_depth_slot(slot).stack[-1]))

    def copy_into(
        self, slot: SeedSlot, record: SeedRecord, model: nn.Module, *, catalog: KarnCatalog, merged: bool
    ) -> None:
        """Merged: the block appended to the copy's stack (the static network one block deeper).
        Unmerged: a copy of the seed beside the stack, run on its output by a hook with the
        isolation's arithmetic (``SeedSlot.apply_seed`` in TRAINING)."""
        seed = slot.seed
        assert isinstance(seed, DepthSeed)
        stack = model.get_submodule(_depth_slot(slot).site.stack)
        assert isinstance(stack, nn.ModuleList | nn.Sequential), type(stack)
        if merged:
            stack.append(blank_copy(seed.block))
            return
        side = DepthSeed(blank_copy(seed.block))
        model.add_module(slot.slot_id.replace(".", "_").replace("+", "_"), side)

        def join(_m: nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
            delta = side(out.detach())
            return out + (delta - delta.detach())

        stack[-1].register_forward_hook(join)


def _depth_slot(slot: SeedSlot) -> DepthSlot:
    # Only a ``DepthSlot`` names this kind (and its module imports this one, so no isinstance).
    assert slot.kind is DEPTH, f"{slot.slot_id} is not a depth slot"
    return cast("DepthSlot", slot)


DEPTH = DepthKind()
