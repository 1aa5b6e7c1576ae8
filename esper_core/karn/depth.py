"""Karn's depth menu: "insert a block into the stack", offered beside the branch blueprints.

A depth seed is not a compiled kernel: Kasmina builds it from a block of the host's own stack
(``esper_core.kasmina.depth``). Tamiyo chooses it the way she chooses a blueprint or a width-menu
entry, so every policy and every record Simic learns from treat the kinds alike.

Depth slots carry the shape profile ``DEPTH_PROFILE`` instead of an activation shape: only the
depth menu fits them, and no branch blueprint or width entry does.
"""

from __future__ import annotations

from esper_core.contracts import BlueprintDescriptor, BlueprintTier

DEPTH_PROFILE = "depth"
"""The shape profile every depth slot reports (``SeedState.shape_profile``)."""

DEPTH_MENU: dict[str, str] = {
    "depth-stack": "a copy of the stack's last block, weights and optimizer moments included",
    "depth-stack-all": "a copy of every block of the stack, in order, weights and optimizer moments included "
    "(G_stack: the stack doubles)",
    "depth-fresh": "a freshly initialised block of the stack's own type (its modules' reset_parameters)",
}
"""Depth "blueprints": id -> how the inserted blocks start. They are inserted after the stack's
last block and join the host through the blend ``h + alpha * (f(h) - h)``, ``f`` the new blocks
as a chain: the identity at alpha 0, so the network is unchanged when it germinates."""

# A stacked copy starts where training left the block it copies; copying the whole stack changes
# the function more (every block again, on inputs they were not trained on); a fresh block starts
# far from anything the host has learnt, so ramping it in changes most.
_RISK = {"depth-stack": 0.2, "depth-stack-all": 0.25, "depth-fresh": 0.3}


_NAMES = {
    "depth-stack": "insert one block (stack)",
    "depth-stack-all": "double the stack (stack all)",
    "depth-fresh": "insert one block (fresh)",
}


def is_depth_blueprint(blueprint_id: str) -> bool:
    """Whether ``blueprint_id`` is an entry of the depth menu."""
    return blueprint_id in DEPTH_MENU


def depth_descriptor(blueprint_id: str) -> BlueprintDescriptor:
    """The descriptor Tamiyo sees for a depth-menu entry.

    Raises:
        ValueError: ``blueprint_id`` is not on the menu (the message lists it).
    """
    check_depth_entry(blueprint_id)
    return BlueprintDescriptor(
        blueprint_id=blueprint_id,
        name=_NAMES[blueprint_id],
        tier=BlueprintTier.SAFE,
        host_kinds=(DEPTH_PROFILE,),
        description=(
            f"inserts {DEPTH_MENU[blueprint_id]} after the stack's last block, blended in from the identity; "
            "merged into the stack when it fossilises"
        ),
        risk=_RISK[blueprint_id],
    )


def check_depth_entry(blueprint_id: str) -> None:
    """Raise unless ``blueprint_id`` is on the depth menu.

    Raises:
        ValueError: it is not (the message lists the menu).
    """
    if blueprint_id not in DEPTH_MENU:
        raise ValueError(f"{blueprint_id!r} is not on the depth menu; choose one of {list(DEPTH_MENU)}")
