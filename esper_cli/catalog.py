"""``esper catalog``: Karn's blueprints and compiling them."""

from __future__ import annotations

import argparse
import json

from esper_cli.args import quiet_prefect
from esper_core._capabilities import DEVICE_CHOICES
from esper_core.recipes import RECIPES


def _cmd_catalog_list(args: argparse.Namespace) -> int:
    from esper_core.karn.catalog import default_catalog

    rows = default_catalog().list()
    if args.json:
        print(json.dumps([d.model_dump(mode="json") for d in rows], indent=2))
        return 0
    print(f"{'blueprint':<18} {'tier':<13} {'risk':>5}  {'hosts':<8} description")
    for d in rows:
        print(f"{d.blueprint_id:<18} {d.tier.value:<13} {d.risk:>5.2f}  {','.join(d.host_kinds):<8} {d.description}")
    return 0


def _cmd_catalog_compile(args: argparse.Namespace) -> int:
    quiet_prefect()
    from flows.compile_catalog import compile_catalog

    artifacts = compile_catalog(recipe=args.recipe, blueprints=args.blueprints or None, device=args.device)
    for a in artifacts:
        flag = f"FALLBACK ({a.fallback_reason})" if a.fallback else a.kind.value
        p95 = max((s.p95_ms for s in a.latency.values()), default=0.0)
        print(
            f"#{a.artifact_id} {a.blueprint_id} {a.shape_profile} v{a.version} {a.status.value} {flag} p95 {p95:.3f} ms"
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``catalog list|compile``."""
    catalog = sub.add_parser("catalog", help="Karn's blueprint catalogue").add_subparsers(
        dest="catalog_command", required=True, metavar="ACTION"
    )
    c_list = catalog.add_parser("list", help="list blueprints with tier, risk and host kinds")
    c_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c_list.set_defaults(func=_cmd_catalog_list)
    c_compile = catalog.add_parser("compile", help="compile blueprints for a recipe's slots and publish them to Urza")
    c_compile.add_argument("blueprints", nargs="*", metavar="BLUEPRINT", help="blueprint ids (default: the recipe's)")
    c_compile.add_argument(
        "--recipe", default="digits-mlp", choices=sorted(RECIPES), help="recipe whose slots set the shapes"
    )
    c_compile.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="compile for this device")
    c_compile.set_defaults(func=_cmd_catalog_compile)
