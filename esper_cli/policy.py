"""``esper policy``: the policies shipped in Esper's package, and where this installation serves them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from esper_cli.choices import SHIPPED_POLICIES


def _describe(name: str) -> dict[str, Any]:
    """A shipped policy: its pinned digest, whether its file matches, its training, its registry version."""
    from esper_core.settings import EsperSettings
    from esper_core.simic.records import SimicStore
    from esper_core.simic.shipping import shipped_versions
    from esper_core.tamiyo.shipped import DEFAULT_SHIPPED, SHIPPED, ShippedPolicyError, provenance, read_shipped
    from esper_core.urza.service import Urza

    try:
        read_shipped(name)
        digest = "ok"
    except ShippedPolicyError as e:
        digest = f"REFUSED: {e}"
    settings = EsperSettings()
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        store = SimicStore.for_urza(urza)
        published = None if store is None else shipped_versions(store).get(name)
    finally:
        urza.close()
    try:
        trained = provenance(name)
    except ShippedPolicyError as e:
        trained = {"error": str(e)}
    return {
        "name": name,
        "default": name == DEFAULT_SHIPPED,
        "sha256": SHIPPED[name],
        "digest": digest,
        "registry_version": None if published is None else published.label,
        "registry": str(settings.home),
        "provenance": trained,
    }


def _headline(d: dict[str, Any]) -> str:
    p = d["provenance"]
    chosen = p.get("selection", {}).get("chosen", {})
    score = f"selection score {chosen['score']:.4f}" if "score" in chosen else "no selection record"
    served = d["registry_version"] or "not yet published here (the first run that serves it publishes it)"
    return (
        f"{d['name']:<10} {'default' if d['default'] else '':<8} sha256 {d['sha256'][:12]}  digest {d['digest'][:40]}  "
        f"{score}  registry: {served}"
    )


def _cmd_list(args: argparse.Namespace) -> int:
    rows = [_describe(name) for name in SHIPPED_POLICIES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(_headline(row))
    print("\nServe one: esper run --policy NAME (the heuristic decides by default); details: esper policy show NAME")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    row = _describe(args.name)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0 if row["digest"] == "ok" else 2
    p = row["provenance"]
    print(_headline(row))
    print(f"sha256     {row['sha256']}")
    print(f"digest     {row['digest']}")
    for key in ("commit", "command", "trained_at", "members", "seeds", "selection", "gnn"):
        if key in p:
            print(f"{key:<10} {json.dumps(p[key])}")
    if row["digest"] != "ok":
        print(f"esper: error: {row['digest']}", file=sys.stderr)
        return 2
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``policy`` to the top-level subcommands."""
    policy = sub.add_parser(
        "policy", help="the Tamiyo policies shipped with Esper (esper run --policy shipped serves one)"
    )
    psub = policy.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    listing = psub.add_parser("list", help="list the shipped policies, their digests and registry versions")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_cmd_list)
    show = psub.add_parser("show", help="one shipped policy: digest check, provenance, registry version")
    show.add_argument("name", choices=SHIPPED_POLICIES, help="a shipped policy's name")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=_cmd_show)
