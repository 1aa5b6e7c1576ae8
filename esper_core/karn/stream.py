"""Karn's stream menu: "double the model's width", offered beside the branch blueprints.

A stream seed is not a compiled kernel: Kasmina doubles the host's own residual stream (d_model,
heads, MLP widths; ``esper_core.kasmina.stream``), keeping the function it computes, and keeps it
at once. Tamiyo chooses it the way she chooses a blueprint or a width-menu entry, and sees its
slot as a width slot (``SlotKind.WIDTH``: the whole model's width), so the stored policy's format
does not change.

The stream slot carries the shape profile ``STREAM_PROFILE``: only the stream menu fits it.
"""

from __future__ import annotations

from esper_core.contracts import BlueprintDescriptor, BlueprintTier

STREAM_PROFILE = "stream"
"""The shape profile the stream slot reports (``SeedState.shape_profile``)."""

STREAM_MENU: dict[str, str] = {
    "stream-2x": "doubles the model's width: every embedding, projection, LayerNorm and MLP, twice the heads",
}
"""Stream "blueprints": id -> what they do. One entry: a doubling is the step that keeps the
function exactly with every unit copied once (HyperCloning's 2x)."""


def is_stream_blueprint(blueprint_id: str) -> bool:
    """Whether ``blueprint_id`` is an entry of the stream menu."""
    return blueprint_id in STREAM_MENU


def stream_descriptor(blueprint_id: str) -> BlueprintDescriptor:
    """The descriptor Tamiyo sees for a stream-menu entry.

    Raises:
        ValueError: ``blueprint_id`` is not on the menu (the message lists it).
    """
    check_stream_entry(blueprint_id)
    return BlueprintDescriptor(
        blueprint_id=blueprint_id,
        name="double the model's width",
        tier=BlueprintTier.SAFE,
        host_kinds=(STREAM_PROFILE,),
        description=(
            f"{STREAM_MENU[blueprint_id]}; function-preserving, so it is applied and kept at once (no isolation "
            "or blending to do) and judged by the training that follows"
        ),
        # About four times the parameters of every block at once: the largest single step on any menu.
        risk=0.3,
    )


def check_stream_entry(blueprint_id: str) -> None:
    """Raise unless ``blueprint_id`` is on the stream menu.

    Raises:
        ValueError: it is not (the message lists the menu).
    """
    if blueprint_id not in STREAM_MENU:
        raise ValueError(f"{blueprint_id!r} is not on the stream menu; choose one of {list(STREAM_MENU)}")
