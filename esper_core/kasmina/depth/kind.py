"""The depth kind: seeds that insert blocks into a stack of identical blocks and, once kept,
merge into it.

A depth seed goes through the same lifecycle as a branch or width seed. Germination builds its
blocks from the stack's own (copies of the last block or of every block, or the last block's
architecture re-initialised; no kernel from the registry) and, for copies, gives each a copy of
its source block's optimizer moments, so it trains on as the block it copies would have. The
blocks join the host after the last one as ``h + alpha * (f(h) - h)``: held out while TRAINING
(the host's output and gradients are exactly the host's), ramped in while BLENDING, gone without
a trace when culled. Keeping the seed appends its blocks to the stack and frees the slot to
deepen the stack again.

A depth seed does not train in isolation (``isolated_training`` False): while TRAINING it is
neither run nor trained, costs nothing, and the gates judge it as it is. Isolation's objective is
the gradient of adding the seed's delta at the host's output, the first-order view of a seed that
starts near zero; a block's delta ``f(h) - h`` is large from the start and that objective is
linear in it, so it grows the delta without bound. Measured on ``chars-gpt-growth`` (seeds 0
and 1): a stacked copy of the last block, probed at alpha 1 after one isolated epoch, scored
4.7-5.5 nats against the host's 2.0-2.4, while an untrained copy of the last block costs
+0.01-0.06 bits and of the whole stack +0.04-0.22 bits after epochs 1-4 (``bench/stack_probe.py``,
selection seed 1000). The copies are trained blocks already; they train on, jointly with the host
and on their real loss, from the first blending step, in the seed manager's own parameter group
(``KasminaConfig.isolation_lr`` shapes a rate only in TRAINING, where a depth seed has no
gradient). The slot owns the stack's depth, which a checkpoint records so that a restore deepens
the host before loading its weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, GateVerdict, KernelArtifact, TelemetryEvent, TelemetryLevel
from esper_core.contracts.enums import GateId, SlotKind
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.depth import DEPTH_MENU, check_depth_entry, depth_descriptor
from esper_core.kasmina.depth.merge import merge_depth_seed, resize_depth
from esper_core.kasmina.depth.seed import DepthSeed, blank_copy, new_blocks, sources
from esper_core.kasmina.kinds import Merge, Nursery, Sprout
from esper_core.kasmina.loader import LoadedKernel
from esper_core.kasmina.records import SeedRecord

if TYPE_CHECKING:
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.kasmina.depth.slot import DepthSlot
    from esper_core.kasmina.slot import SeedSlot


class DepthKind:
    """New blocks after a stack's last (``DepthSeed``), appended to the stack when kept."""

    name = "depth"
    slot_kind = SlotKind.DEPTH
    compiled = False
    merges = True
    isolated_training = False
    immediate = False
    menu = tuple(DEPTH_MENU)

    def describe(self, entry: str) -> BlueprintDescriptor:
        return depth_descriptor(entry)

    def param_cost(self, slot: SeedSlot, entry: str) -> int:
        """The new blocks' parameters (read from shapes: the host may be on the meta device)."""
        check_depth_entry(entry)
        return sum(p.numel() for block in sources(_depth_slot(slot).stack, entry) for p in block.parameters())

    def check_config(self, slot: SeedSlot, config: KasminaConfig) -> None:
        """Nothing to refuse: a depth seed starts as the identity under every ``KasminaConfig``
        (its blend is always residual, its block needs no data-aware initialisation)."""

    def sprout(self, slot: SeedSlot, blueprint_id: str, *, params: dict[str, float], nursery: Nursery) -> Sprout:
        """``blueprint_id`` is a depth-menu entry; the blocks go after the stack's last one."""
        ds = _depth_slot(slot)
        check_depth_entry(blueprint_id)
        stack = ds.stack
        depth = len(stack)
        blocks = new_blocks(stack, blueprint_id)
        verdict = GateVerdict(
            gate=GateId.G0_SANITY,
            passed=True,
            reason=(
                f"insert {len(blocks)} {blueprint_id} block(s) after {ds.site.stack}.{depth - 1} "
                f"({depth} -> {depth + len(blocks)} blocks)"
            ),
        )
        return Sprout(
            verdict=verdict,
            module=DepthSeed(blocks),
            blueprint_id=blueprint_id,
            params={},
            # "blocks" sizes the seed again when a checkpoint restores it.
            metrics={"depth": float(depth), "blocks": float(len(blocks))},
        )

    def settle(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        """A stacked copy takes copies of its source block's optimizer state (Adam's moments and
        step count), when the source has any: it continues the source's trajectory instead of
        restarting Adam's bias correction, whose first steps are about lr each."""
        ds = _depth_slot(slot)
        optimizer = nursery.optimizer
        if record.blueprint_id == "depth-fresh" or optimizer is None:
            return []
        seed = ds.seed
        assert isinstance(seed, DepthSeed)
        copied = 0
        for block, origin in zip(seed.blocks, sources(ds.stack, record.blueprint_id), strict=True):
            source = dict(origin.named_parameters())
            for name, p in block.named_parameters():
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
        last = _depth_slot(slot).stack[-1]
        return DepthSeed([blank_copy(last) for _ in range(int(record.metrics.get("blocks", 1.0)))])

    def copy_into(
        self, slot: SeedSlot, record: SeedRecord, model: nn.Module, *, catalog: KarnCatalog, merged: bool
    ) -> None:
        """Merged: the blocks appended to the copy's stack (the static network that much deeper).
        Unmerged: nothing, as a TRAINING depth seed adds nothing (it does not train in isolation)."""
        seed = slot.seed
        assert isinstance(seed, DepthSeed)
        stack = model.get_submodule(_depth_slot(slot).site.stack)
        assert isinstance(stack, nn.ModuleList | nn.Sequential), type(stack)
        if merged:
            for block in seed.blocks:
                stack.append(blank_copy(block))


def _depth_slot(slot: SeedSlot) -> DepthSlot:
    # Only a ``DepthSlot`` names this kind (and its module imports this one, so no isinstance).
    assert slot.kind is DEPTH, f"{slot.slot_id} is not a depth slot"
    return cast("DepthSlot", slot)


DEPTH = DepthKind()
