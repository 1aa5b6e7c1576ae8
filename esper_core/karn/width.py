"""Karn's width menu: "widen layer L by k", offered beside the branch blueprints.

A width seed is not a compiled kernel: Kasmina builds it from the host's own layers
(``esper_core.kasmina.width``). Tamiyo still chooses it the way she chooses a blueprint, so every
policy (heuristic, random, periodic, scheduled, the GNN) and every record Simic learns from treat
both kinds alike. Each entry of the menu adds a fraction of the layer's *current* width, so a
layer grown once grows by more the next time.

Width slots carry the shape profile ``WIDTH_PROFILE`` instead of an activation shape: only the
width menu fits them, and no branch blueprint does (a width slot's input shape would otherwise
match a branch slot on the same activation).
"""

from __future__ import annotations

from esper_core.contracts import BlueprintDescriptor, BlueprintTier

WIDTH_PROFILE = "width"
"""The shape profile every width slot reports (``SeedState.shape_profile``)."""

WIDTH_MENU: dict[str, float] = {"width-25": 0.25, "width-50": 0.5, "width-100": 1.0}
"""Width "blueprints": id -> fraction of the layer's current width added as new units."""

# Risk grows with the fraction: a larger step changes more of the host at once. All are SAFE:
# a width seed starts function-preserving and goes through the same gates as a branch seed.
_RISK_PER_FRACTION = 0.2


def is_width_blueprint(blueprint_id: str) -> bool:
    """Whether ``blueprint_id`` is an entry of the width menu."""
    return blueprint_id in WIDTH_MENU


def width_descriptor(blueprint_id: str) -> BlueprintDescriptor:
    """The descriptor Tamiyo sees for a width-menu entry.

    Raises:
        ValueError: ``blueprint_id`` is not on the menu (the message lists it).
    """
    fraction = _fraction(blueprint_id)
    return BlueprintDescriptor(
        blueprint_id=blueprint_id,
        name=f"widen by {fraction:.0%}",
        tier=BlueprintTier.SAFE,
        host_kinds=(WIDTH_PROFILE,),
        description=(
            f"adds {fraction:.0%} of the layer's current units (and the consumer's matching inputs); "
            "merged into the layer when it fossilises"
        ),
        risk=round(_RISK_PER_FRACTION * fraction, 6),
    )


def width_units(blueprint_id: str, width: int) -> int:
    """Units a width-menu entry adds to a layer of ``width`` units (at least one).

    Raises:
        ValueError: ``blueprint_id`` is not on the menu.
    """
    return max(1, round(width * _fraction(blueprint_id)))


def _fraction(blueprint_id: str) -> float:
    if blueprint_id not in WIDTH_MENU:
        raise ValueError(f"{blueprint_id!r} is not on the width menu; choose one of {list(WIDTH_MENU)}")
    return WIDTH_MENU[blueprint_id]
