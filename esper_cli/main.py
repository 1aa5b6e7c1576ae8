"""``esper``: run the main job, inspect the catalogue and registry, run benchmarks.

Prefect is imported only by the commands that run flows, so ``esper --help`` and the inspection
commands start quickly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from esper_core._capabilities import DEVICE_CHOICES
from esper_core.recipes import RECIPES


def _quiet_prefect() -> None:
    # Prefect's temporary server phones home for usage analytics; without a network that only
    # logs an error. Users who set the variable themselves keep their choice.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _cmd_run(args: argparse.Namespace) -> int:
    _quiet_prefect()
    from flows.morphogenesis import morphogenesis

    summary = morphogenesis(
        recipe=args.recipe, epochs=args.epochs, device=args.device, seed=args.seed, run_id=args.run_id
    )
    print()
    print(f"run        {summary.run_id} ({summary.recipe}, {summary.epochs} epochs, {summary.device})")
    print(f"accuracy   test {summary.test_accuracy:.4f}  val {summary.val_accuracy:.4f}")
    print(f"params     host {summary.host_params}  total {summary.total_params}")
    for slot, stage in summary.seeds.items():
        print(f"seed       {slot}: {stage}")
    print(f"commands   {summary.commands}")
    print(f"outputs    {summary.run_dir}/ (summary.json, telemetry.jsonl, baseline.json, report.md)")
    return 0


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
    _quiet_prefect()
    from flows.compile_catalog import compile_catalog

    artifacts = compile_catalog(recipe=args.recipe, blueprints=args.blueprints or None, device=args.device)
    for a in artifacts:
        flag = f"FALLBACK ({a.fallback_reason})" if a.fallback else a.kind.value
        p95 = max((s.p95_ms for s in a.latency.values()), default=0.0)
        print(
            f"#{a.artifact_id} {a.blueprint_id} {a.shape_profile} v{a.version} {a.status.value} {flag} p95 {p95:.3f} ms"
        )
    return 0


def _cmd_registry_list(args: argparse.Namespace) -> int:
    from esper_core.settings import EsperSettings
    from esper_core.urza.service import Urza

    settings = EsperSettings()
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        artifacts = urza.store.list_artifacts(blueprint_id=args.blueprint)
    finally:
        urza.close()
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in artifacts], indent=2))
        return 0
    if not artifacts:
        print(f"no artifacts in {settings.home}; publish some with `esper catalog compile`")
        return 0
    print(f"{'id':>4} {'blueprint':<18} {'profile':<12} {'ver':>3} {'status':<12} {'kind':<9} {'env':<26} sha256")
    for a in artifacts:
        env = f"{a.environment.torch_version}/{a.environment.device_kind}/{a.environment.compiler}"
        print(
            f"{a.artifact_id:>4} {a.blueprint_id:<18} {a.shape_profile:<12} {a.version:>3} "
            f"{a.status.value:<12} {a.kind.value:<9} {env:<26} {a.sha256[:12]}"
        )
    return 0


def _cmd_bench_seed_reference(args: argparse.Namespace) -> int:
    from bench.seed_reference import BenchConfig, run

    result = run(BenchConfig(epochs=args.epochs, warmup_batches=args.warmup_batches, device=args.device))
    if args.save_baseline:
        from esper_core.telemetry import write_baseline

        write_baseline(
            args.save_baseline,
            name="seed-reference",
            workload={k: result[k] for k in ("workload", "epochs", "steps_per_epoch")},
            latency_ms=result["samples_ms"],
            device=result["device"],
        )
    headline = {k: v for k, v in result.items() if k != "samples_ms"}
    if args.json:
        print(json.dumps(headline, indent=2))
        return 0
    print(f"seed-reference on {result['device']} ({result['epochs']} epochs of {result['steps_per_epoch']} steps)")
    print(
        f"  esper  p50 {result['esper_p50_ms']:.3f} ms  p95 {result['esper_p95_ms']:.3f} ms  (budget {result['budget_ms']} ms)"
    )
    print(f"  bare   p50 {result['bare_p50_ms']:.3f} ms  p95 {result['bare_p95_ms']:.3f} ms")
    print(f"  ratio  p50 {result['ratio_p50']:.2f}  p95 {result['ratio_p95']:.2f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full ``esper`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="esper",
        description="Grow neural networks while they train. Outputs live under $ESPER_HOME (default ./.esper).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the morphogenesis flow (compile, train, grow)")
    run.add_argument(
        "--recipe", default="digits-mlp", choices=sorted(RECIPES), help="named recipe (default: %(default)s)"
    )
    run.add_argument("--epochs", type=_positive, default=None, help="override the recipe's epoch count")
    run.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="where to train (default: %(default)s)")
    run.add_argument("--seed", type=int, default=None, help="override the recipe's random seed")
    run.add_argument("--run-id", default=None, help="resume this run from its last committed epoch")
    run.set_defaults(func=_cmd_run)

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

    registry = sub.add_parser("registry", help="Urza's artifact registry").add_subparsers(
        dest="registry_command", required=True, metavar="ACTION"
    )
    r_list = registry.add_parser("list", help="list published kernel artifacts")
    r_list.add_argument("--blueprint", default=None, help="only this blueprint")
    r_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r_list.set_defaults(func=_cmd_registry_list)

    bench = sub.add_parser("bench", help="benchmarks against bare PyTorch").add_subparsers(
        dest="bench_command", required=True, metavar="WORKLOAD"
    )
    b_ref = bench.add_parser("seed-reference", help="Linear 16->4, 16 samples, batch 4: Tolaria vs a bare loop")
    b_ref.add_argument("--epochs", type=_positive, default=200, help="timed epochs per path (default: %(default)s)")
    b_ref.add_argument("--warmup-batches", type=int, default=20, help="untimed steps first (default: %(default)s)")
    b_ref.add_argument("--device", default="cpu", choices=DEVICE_CHOICES, help="device (default: %(default)s)")
    b_ref.add_argument("--json", action="store_true", help="print one JSON object")
    b_ref.add_argument("--save-baseline", metavar="PATH", default=None, help="also write a baseline JSON file here")
    b_ref.set_defaults(func=_cmd_bench_seed_reference)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``esper`` console command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as e:
        # Configuration and input errors carry their fix in the message; no traceback needed.
        print(f"esper: error: {e}", file=sys.stderr)
        return 2
