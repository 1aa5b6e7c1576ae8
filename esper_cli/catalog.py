"""``esper catalog``: Karn's blueprints and compiling them."""

from __future__ import annotations

import argparse
import json

from esper_cli.args import local_flow_settings, prefect_for_command
from esper_cli.choices import BACKENDS, BLUEPRINT_TIERS, DEVICES, HOST_KINDS, RECIPES
from esper_cli.progress import follow_task_runs, progress

_POLICY = {
    "safe": "compiled, published active and germinated freely",
    "experimental": "compiled and germinated only with an explicit approval (--approve ID)",
    "high_risk": "quarantine-only: compiled with an approval, published quarantined, never germinated",
}
"""What each tier (``BlueprintTier``'s value) lets a blueprint do."""


def _cmd_catalog_list(args: argparse.Namespace) -> int:
    from esper_core.contracts import BlueprintTier
    from esper_core.karn.entries import default_catalog

    tier = None if args.tier is None else BlueprintTier(args.tier)
    rows = default_catalog().list(tier=tier, host_kind=args.host_kind)
    if args.json:
        from esper_core.karn.capacity import reference_profile, seed_capacity

        catalog = default_catalog()
        capacity = {
            d.blueprint_id: seed_capacity(catalog, d.blueprint_id, reference_profile(catalog.get(d.blueprint_id)))
            for d in rows
        }
        print(
            json.dumps(
                [{**d.model_dump(mode="json"), "capacity": capacity[d.blueprint_id].to_dict()} for d in rows], indent=2
            )
        )
        return 0
    print(f"{'blueprint':<20} {'tier':<13} {'risk':>5}  {'host':<5} {'params':<22} description")
    for d in rows:
        params = ", ".join(f"{n} {b.low:g}..{b.high:g}" for n, b in sorted(d.param_bounds.items())) or "-"
        print(
            f"{d.blueprint_id:<20} {d.tier.value:<13} {d.risk:>5.2f}  {','.join(d.host_kinds):<5} {params:<22} "
            f"{d.description}"
        )
    return 0


def _cmd_catalog_show(args: argparse.Namespace) -> int:
    from esper_core.karn.capacity import reference_profile, seed_capacity
    from esper_core.karn.entries import default_catalog
    from esper_core.karn.profiles import ShapeProfile

    entry = default_catalog().get(args.blueprint)  # UnknownBlueprintError lists the known ids
    d = entry.descriptor
    # A bad --profile fails here (ValueError naming the fix) before anything is built.
    profile = reference_profile(entry) if args.profile is None else ShapeProfile.parse(args.profile)
    cap = seed_capacity(default_catalog(), d.blueprint_id, profile)
    if args.json:
        gradmax = None if entry.gradmax is None else {"input": entry.gradmax.input, "output": entry.gradmax.output}
        shown = {
            **d.model_dump(mode="json"),
            "profiles": entry.describe_profiles(),
            "capacity": cap.to_dict(),
            "gradmax": gradmax,
        }
        print(json.dumps(shown, indent=2))
        return 0
    print(f"{d.blueprint_id}: {d.name}")
    print(f"  tier         {d.tier.value} ({_POLICY[d.tier.value]})")
    print(f"  risk         {d.risk:.2f}")
    print(f"  host kinds   {', '.join(d.host_kinds)}")
    print(f"  profiles     {entry.describe_profiles()}")
    if d.param_bounds:
        for name, b in sorted(d.param_bounds.items()):
            kind = "integer" if b.integer else "real"
            print(f"  param        {name}: {kind} in [{b.low:g}, {b.high:g}], default {b.default:g}")
    else:
        print("  params       none")
    print(f"  version      {d.version}")
    print(
        f"  adds         {cap.parameters} parameters, {cap.flops_per_sample} FLOPs/sample at {cap.profile}; "
        + (
            "LINEAR: folds into the neighbouring layer"
            if cap.linear
            else f"non-linear (affine gap {cap.affine_gap:.2f})"
        )
    )
    g = entry.gradmax
    print(
        "  seed init    default only (not of the form output(act(input(x))))"
        if g is None
        else f"  seed init    default or gradmax (input {g.input}, output {g.output})"
    )
    print(f"  description  {d.description}")
    return 0


def _check_compile_input(args: argparse.Namespace) -> None:
    """Refuse a bad blueprint id, approval, device or plan before any flow starts.

    The flow would refuse them too, but only after Prefect started a run and logged the error
    with a traceback. The plan is the flow's own first task body (``plan_compiles.fn``).

    Raises:
        ValueError: The problem and its fix (main prints it without a traceback).
    """
    from esper_core._capabilities import resolve_device
    from esper_core.karn.entries import default_catalog
    from tasks.plan import plan_compiles

    catalog = default_catalog()
    for blueprint_id in [*(args.blueprints or ()), *(args.approve or ())]:
        catalog.get(blueprint_id)  # UnknownBlueprintError lists the known ids
    resolve_device(args.device)
    plan_compiles.fn(args.recipe, args.blueprints or None, args.backend, args.approve or None)


def _cmd_catalog_compile(args: argparse.Namespace) -> int:
    server = prefect_for_command()  # its start overlaps the checks below
    _check_compile_input(args)
    from flows.compile_catalog import compile_catalog

    display = progress(f"catalog compile {args.recipe}")
    labels = {"compile-blueprint": "kernels compiled", "publish-artifact": "published"}
    with display, follow_task_runs(display, labels), local_flow_settings(server):
        display("starting Prefect's temporary server, then compiling", 0, None)
        artifacts = compile_catalog(
            recipe=args.recipe,
            blueprints=args.blueprints or None,
            device=args.device,
            backend=args.backend,
            approve=args.approve or None,
        )
    for a in artifacts:
        flag = f"FALLBACK ({a.fallback_reason})" if a.fallback else a.kind.value
        p95 = max((s.p95_ms for s in a.latency.values()), default=0.0)
        print(
            f"#{a.artifact_id} {a.blueprint_id} {a.shape_profile} v{a.version} {a.status.value} {flag} "
            f"{a.environment.compiler} p95 {p95:.3f} ms" + (f" ({a.status_reason})" if a.status_reason else "")
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``catalog list|show|compile``."""
    catalog = sub.add_parser("catalog", help="Karn's blueprint catalogue").add_subparsers(
        dest="catalog_command", required=True, metavar="ACTION"
    )
    c_list = catalog.add_parser("list", help="list blueprints with tier, risk, host kind and parameters")
    c_list.add_argument("--tier", choices=BLUEPRINT_TIERS, help="only this tier")
    c_list.add_argument("--host-kind", choices=HOST_KINDS, help="only blueprints for this host kind")
    c_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c_list.set_defaults(func=_cmd_catalog_list)
    c_show = catalog.add_parser("show", help="one blueprint: tier policy, profiles, parameter bounds")
    c_show.add_argument("blueprint", metavar="ID", help="blueprint id (see `esper catalog list`)")
    c_show.add_argument(
        "--profile", help="shape profile for what it adds, e.g. f128-b512 (default: its kind's reference profile)"
    )
    c_show.add_argument("--json", action="store_true", help="print JSON")
    c_show.set_defaults(func=_cmd_catalog_show)
    c_compile = catalog.add_parser("compile", help="compile blueprints for a recipe's slots and publish them to Urza")
    c_compile.add_argument("blueprints", nargs="*", metavar="BLUEPRINT", help="blueprint ids (default: the recipe's)")
    c_compile.add_argument("--recipe", default="digits-mlp", choices=RECIPES, help="recipe whose slots set the shapes")
    c_compile.add_argument("--device", default="auto", choices=DEVICES, help="compile for this device")
    c_compile.add_argument(
        "--backend",
        default="export",
        choices=BACKENDS,
        help="export: torch.export program (fast, default); aot_inductor: also an AOTInductor inference "
        "package (5-25 s per kernel on CPU)",
    )
    c_compile.add_argument(
        "--approve",
        action="append",
        metavar="ID",
        help="explicitly approve an experimental or high-risk blueprint (repeatable)",
    )
    c_compile.set_defaults(func=_cmd_catalog_compile)
