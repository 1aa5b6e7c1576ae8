"""Driving a seed through its gates in a unit test, without training it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from esper_core.contracts import SeedStage
from esper_core.kasmina.manager import EpochObservation, SeedManager


def pass_to_probation(
    manager: SeedManager, slot: str, *, loss: Callable[[], torch.Tensor], sample: torch.Tensor
) -> None:
    """``slot``'s seed straight to PROBATIONARY with G4 passed, as the gates would after training:
    two stage advances, then an epoch whose validation loss is 1 below the loss without the seed
    (``loss()`` is read with the seed probed out)."""
    manager.start_epoch()
    manager.advance(slot)
    manager.advance(slot)
    assert manager.slots[slot].stage is SeedStage.PROBATIONARY
    with manager.probe(slot, 0.0):
        without = float(loss())
    manager.end_epoch(
        EpochObservation(
            val_loss=without - 1.0,
            seed_grad_norms={},
            probe_losses={slot: without},
            isolation_probe=lambda _sid: 0.0,
            sample_input=lambda _sid: sample,
        )
    )
