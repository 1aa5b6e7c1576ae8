"""``esper policy``: the policies shipped in Esper's package, and where this installation serves them."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from esper_cli.args import positive, share
from esper_cli.choices import SHIPPED_POLICIES
from esper_cli.progress import with_bar


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


def _cmd_tune(args: argparse.Namespace) -> int:
    return with_bar(_tune, args, "tuning")


def _tune(args: argparse.Namespace, *, progress: Callable[[str, int, int], None] | None = None) -> int:
    """``esper policy tune``: fine-tune a shipped policy on a recipe's proxies, then judge it on held-out seeds."""
    from esper_core.fanout import FanOut
    from esper_core.settings import EsperSettings
    from esper_core.studies.policy_tune import TuneConfig, format_result, tune_policy
    from esper_core.tamiyo.shipped import DEFAULT_SHIPPED

    # Every option and the recipe are checked here, before any episode.
    config = TuneConfig(
        recipe=args.recipe,
        episodes=args.episodes,
        iterations=args.iterations,
        shipped=args.shipped or DEFAULT_SHIPPED,
        proxy_width=args.proxy_width,
        proxy_data=args.proxy_data,
        proxy_epochs=args.proxy_epochs,
        selection_seeds=args.selection_seeds,
        eval_seeds=args.eval_seeds,
        epochs=args.epochs,
        device=args.device,
    )
    with FanOut(workers=args.workers).open() as pool:
        result = tune_policy(EsperSettings(), config, pool=pool, progress=progress)
    report = result.as_dict()
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else format_result(result))
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
    tune = psub.add_parser(
        "tune",
        help="fine-tune a shipped policy on your recipe from cheap proxies of it, and say whether it beat the "
        "shipped one on held-out seeds",
        description="PPO continues from the shipped weights on exploring episodes of a proxy of the recipe "
        "(narrower where the host scales, a share of the training data); the versions are chosen "
        "among on the proxy's selection seeds (2000, ...), and the chosen one meets the shipped policy on the full "
        "recipe on held-out seeds (0, 1, ...). Versions are published to this installation's registry: serve the "
        "tuned one with esper run --policy gnn:N. docs/zoo.md, 'Tuning the shipped policy to one recipe'.",
    )
    tune.add_argument("--recipe", required=True, help="a built-in recipe or package.module:function")
    tune.add_argument(
        "--episodes", type=positive, default=48, help="exploring proxy episodes PPO learns from (default: %(default)s)"
    )
    tune.add_argument(
        "--iterations", type=positive, default=4, help="PPO updates, each a new version (default: %(default)s)"
    )
    tune.add_argument(
        "--shipped",
        choices=SHIPPED_POLICIES,
        default=None,
        help="the shipped policy tuned from (default: the default shipped policy)",
    )
    tune.add_argument(
        "--proxy-width",
        type=float,
        default=None,
        help="the proxy host's width factor (default: 0.5 where the host can be scaled, else 1)",
    )
    tune.add_argument(
        "--proxy-data", type=share, default=0.5, help="share of the training split a proxy keeps (default: %(default)s)"
    )
    tune.add_argument(
        "--proxy-epochs",
        type=positive,
        default=None,
        help="epochs of a proxy episode (default: the recipe's)",
    )
    tune.add_argument(
        "--selection-seeds",
        type=positive,
        default=2,
        help="proxy seeds the versions are chosen on (default: %(default)s)",
    )
    tune.add_argument(
        "--eval-seeds",
        type=positive,
        default=8,
        help="held-out seeds of the full recipe the chosen version meets the shipped one on (default: %(default)s)",
    )
    tune.add_argument(
        "--epochs", type=positive, default=None, help="epochs of the evaluation runs (default: the recipe's)"
    )
    tune.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default: %(default)s)")
    tune.add_argument(
        "--workers", type=int, default=0, help="Dask worker processes (one thread each); 0: here (default: 0)"
    )
    tune.add_argument("--save", type=Path, default=None, help="also write the JSON report to this file")
    tune.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    tune.set_defaults(func=_cmd_tune)
