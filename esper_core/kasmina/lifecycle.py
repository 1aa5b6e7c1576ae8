"""The seed lifecycle as a transition table (DESIGN.md "Seed lifecycle")."""

from __future__ import annotations

import math

from esper_core.contracts import BlendSchedule, SeedStage

S = SeedStage

TRANSITIONS: dict[SeedStage, frozenset[SeedStage]] = {
    S.DORMANT: frozenset({S.GERMINATED}),
    # An immediate kind's change (a doubled stream: function-preserving, applied by G0) is kept
    # at once, with nothing to train or blend.
    S.GERMINATED: frozenset({S.TRAINING, S.CULLED, S.FOSSILIZED}),
    S.TRAINING: frozenset({S.BLENDING, S.CULLED}),
    S.BLENDING: frozenset({S.PROBATIONARY, S.CULLED}),
    S.PROBATIONARY: frozenset({S.FOSSILIZED, S.CULLED}),
    # Only a slot whose seed merges leaves FOSSILIZED (width, depth, stream): once its seed is part
    # of the host, the slot is free to grow it again. A branch seed lives on in its slot for good.
    S.FOSSILIZED: frozenset({S.DORMANT}),
    S.CULLED: frozenset({S.EMBARGOED}),
    S.EMBARGOED: frozenset({S.DORMANT}),
}


class IllegalTransitionError(ValueError):
    """A lifecycle move that the transition table forbids."""


def check_transition(slot_id: str, current: SeedStage, target: SeedStage) -> None:
    """Raise ``IllegalTransitionError`` unless ``current -> target`` is allowed.

    Args:
        slot_id: named in the message.
        current: the slot's stage now.
        target: the stage asked for.
    """
    allowed = TRANSITIONS[current]
    if target not in allowed:
        options = ", ".join(sorted(s.value for s in allowed)) or "none (terminal stage)"
        raise IllegalTransitionError(
            f"slot {slot_id}: cannot go from {current.value} to {target.value}; allowed from {current.value}: {options}"
        )


def blend_alpha(schedule: BlendSchedule, step: int, total: int) -> float:
    """Alpha after ``step`` of ``total`` blending epochs, rising from 0 to exactly 1.

    Args:
        schedule: ramp shape.
        step: completed blending epochs, 0..total.
        total: length of the ramp in epochs (>= 1).
    """
    if total < 1:
        raise ValueError(f"blend length must be >= 1 epoch, got {total}")
    frac = min(max(step / total, 0.0), 1.0)
    if schedule is BlendSchedule.COSINE:
        return 0.5 * (1.0 - math.cos(math.pi * frac))
    return frac
