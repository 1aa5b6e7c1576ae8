"""``esper recipes``: the built-in recipes, and checking a recipe of your own."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esper_core.run.config import RunConfig
    from esper_core.run.plan import RunPlan


def _describe(name: str, config: RunConfig) -> dict[str, object]:
    from esper_core.data import DataConfig
    from esper_core.hosts import HostConfig
    from esper_core.run.recipes import RECIPES

    host = config.host
    data = config.data
    factory = RECIPES.get(name)
    doc = (factory.__doc__ if factory is not None else None) or ""
    return {
        "recipe": name,
        "epochs": config.epochs,
        "data": data.name,
        "batch_size": data.batch_size,
        "host": f"{host.kind} {list(host.hidden)}" if isinstance(host, HostConfig) else "custom model",
        "slots": list(host.slot_ids)
        if not isinstance(host, HostConfig)
        else [f"input of layer {i}" for i in host.slot_inputs],
        "blueprints": list(config.blueprints) or "every approved blueprint that fits a slot",
        "summary": doc.strip().splitlines()[0] if doc.strip() else "",
        "bundled_data": isinstance(data, DataConfig),
    }


def _cmd_list(args: argparse.Namespace) -> int:
    from esper_core.run.recipes import RECIPES, get_recipe

    rows = [_describe(name, get_recipe(name)) for name in sorted(RECIPES)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['recipe']:<16} {r['epochs']:>3} epochs  {r['data']:<16} {r['host']:<18} {r['summary']}")
    print("\nYour own: esper run --recipe package.module:function (see examples/grow_your_own.py)")
    return 0


def _built_profile(plan: RunPlan, slot_id: str) -> str:
    """The profile a slot whose kind builds its seeds from the host reports (its menu's)."""
    fits = set(plan.slot_fits[slot_id])
    return ",".join(
        sorted({p for c in plan.built_candidates if c.descriptor.blueprint_id in fits for p in c.shape_profiles})
    )


def _cmd_show(args: argparse.Namespace) -> int:
    from esper_core.karn.profiles import ShapeProfile
    from esper_core.run.plan import check_recipe
    from esper_core.run.recipes import get_recipe

    config = get_recipe(args.recipe)
    row = _describe(args.recipe, config)
    # Planned on the meta device: a blueprint that fits no slot is refused here, as by `esper run`.
    plan = check_recipe(config)
    row["slots"] = [
        {
            "slot": sid,
            "shape": list(ShapeProfile.parse(profile).feature_shape),
            "profile": profile,
            "blueprints": list(plan.slot_fits[sid]),
        }
        for sid, profile in plan.slots.items()
    ] + [
        {"slot": sid, "widens": layer, "profile": _built_profile(plan, sid), "blueprints": list(plan.slot_fits[sid])}
        for sid, layer in plan.built_slots.items()
    ]
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    for k, v in row.items():
        if k != "slots":
            print(f"{k:<13}{v}")
    for s in row["slots"]:
        where = f"widens {s['widens']}" if "widens" in s else f"{tuple(s['shape'])} ({s['profile']})"
        print(f"slot         {s['slot']}: {where} -> {', '.join(s['blueprints'])}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``recipes`` to the top-level subcommands."""
    recipes = sub.add_parser("recipes", help="list the built-in recipes, check your own")
    rsub = recipes.add_subparsers(dest="recipes_command", required=True, metavar="ACTION")
    listing = rsub.add_parser("list", help="the built-in recipes")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_cmd_list)
    show = rsub.add_parser("show", help="load a recipe (built-in or package.module:function) and describe it")
    show.add_argument("recipe", help="a built-in name or package.module:function")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=_cmd_show)
