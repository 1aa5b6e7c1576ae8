"""What the seed manager records about each live seed."""

from __future__ import annotations

from dataclasses import dataclass, field

from esper_core.contracts import BlendSchedule, KernelArtifact


@dataclass(kw_only=True, slots=True)
class SeedRecord:
    """Kasmina's bookkeeping for the seed in one slot (its weights live in the slot's module)."""

    blueprint_id: str
    params: dict[str, float]
    artifact: KernelArtifact | None
    """The registry kernel the seed was loaded from; None for a seed built from the host."""
    lr_scale: float
    schedule: BlendSchedule
    blend_epochs: int
    age: int = 0
    epochs_in_stage: int = 0
    with_seed_losses: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
