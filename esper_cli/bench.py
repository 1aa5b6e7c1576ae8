"""``esper bench``: benchmarks against bare PyTorch in the same process."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

from esper_cli.args import positive, quiet_prefect
from esper_cli.choices import (
    DEPTH_GROWTH_PLANS,
    DEVICES,
    GROWTH_PLANS,
    PRECISIONS,
    RECIPES,
    SIMIC_PLANS,
    ZOO_FAMILIES,
)
from esper_cli.progress import progress, with_bar
from esper_core.studies.arms import GROWING_ARMS


def _cmd_bench_training(args: argparse.Namespace) -> int:
    from esper_core.benchmarks.common import BenchConfig
    from esper_core.benchmarks.training import headline, run, save_baseline, score_line

    config = BenchConfig(
        epochs=args.epochs,
        min_timed_s=args.min_seconds,
        warmup_batches=args.warmup_batches,
        device=args.device,
        compile="off" if args.no_compile else args.compile,
        compile_mode=args.compile_mode,
        compile_dynamic=args.compile_dynamic,
        compile_warmup_steps=args.compile_warmup_steps,
        seeds=args.seeds,
        gpu_dataset=args.gpu_dataset,
        amp=args.amp,
        cuda_graphs=args.cuda_graphs,
    )
    with progress(f"bench training {args.recipe}", json_output=args.json) as display:
        result = run(args.recipe, config, progress=display)
    if args.save_baseline:
        save_baseline(result, args.save_baseline)
    if args.json:
        print(json.dumps(headline(result), indent=2))
        return 0
    print(
        f"{result['workload']} on {result['device']}: {result['epochs']} epochs of {result['steps_per_epoch']} steps, "
        f"{result['active_seeds']} active seed(s), {result['precision']}, chosen path {result['chosen_path']}"
    )
    for fallback in result["fallbacks"]:
        print(f"  fell back: {fallback}")
    print(
        "  training part of an epoch (tolaria.training.latency_ms) vs the bare loop's epoch (fused optimizer, as Esper's):"
    )
    for label, key in (("esper", "esper"), ("eager", "eager"), ("bare", "bare")):
        print(f"    {label:<6} p50 {result[key + '_p50_ms']:.3f} ms  p95 {result[key + '_p95_ms']:.3f} ms")
    print(
        f"    ratio  p50 {result['ratio_p50']:.2f}  p95 {result['ratio_p95']:.2f} "
        f"(eager p50 {result['eager_ratio_p50']:.2f})  budget {result['budget_ms']} ms"
    )
    print(
        f"    against a bare loop with PyTorch's default optimizer: bare p50 {result['bare_default_p50_ms']:.3f} ms, "
        f"ratio p50 {result['ratio_default_optimizer_p50']:.2f}"
    )
    if "ratio_unmerged_p50" in result:
        print(
            f"    against the width seed unmerged in plain PyTorch (the same computation): bare "
            f"p50 {result['bare_unmerged_p50_ms']:.3f} ms, ratio p50 {result['ratio_unmerged_p50']:.2f}  "
            f"p95 {result['ratio_unmerged_p95']:.2f}"
        )
    print(
        f"  whole epoch (validation, gates, signals) vs bare epoch + validation: esper p50 "
        f"{result['epoch_esper_p50_ms']:.3f} ms, bare p50 {result['epoch_bare_p50_ms']:.3f} ms, "
        f"ratio p50 {result['epoch_ratio_p50']:.2f}  p95 {result['epoch_ratio_p95']:.2f}"
    )
    print(f"  {score_line(result)}")
    return 0


def _cmd_bench_compare(args: argparse.Namespace) -> int:
    from esper_core.telemetry import compare_baselines, format_comparison, load_baseline

    before, after = load_baseline(args.before), load_baseline(args.after)
    rows = compare_baselines(before, after)
    if not rows:
        raise ValueError(f"{args.before} and {args.after} share no latency series; compare baselines of one workload")
    print(format_comparison(rows, before=str(args.before), after=str(args.after)))
    return 0


def _cmd_bench_drill(args: argparse.Namespace) -> int:
    from esper_core.studies.drills import DRILLS

    with progress(f"drill {args.drill}", json_output=args.json) as display, display.ticking():
        # A drill is one call into the library; the display only shows that it is alive.
        display("injecting the fault into a seed-reference run", 0, None)
        result = DRILLS[args.drill](None)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"drill {result['drill']}: {'PASSED' if result['passed'] else 'FAILED'}")
        for check, ok in result["checks"].items():
            print(f"  [{'x' if ok else ' '}] {check}")
        print(f"  metrics: {result['metrics']}")
    return 0 if result["passed"] else 1


def _cmd_bench_compile(args: argparse.Namespace) -> int:
    from bench.compile import CompileBenchConfig, format_table, run

    config = CompileBenchConfig(
        blueprint=args.blueprint,
        profile=args.profile,
        backend=args.backend,
        device=args.device,
        lookups=args.lookups,
        publishes=args.publishes,
        load_repeats=args.load_repeats,
        registry_url=args.registry_url,
    )
    with progress("bench compile", json_output=args.json) as display:
        result = run(config, progress=display)
    print(json.dumps(result) if args.json else format_table(result))
    return 0


def _cmd_bench_orchestration(args: argparse.Namespace) -> int:
    quiet_prefect()  # before Prefect is imported: the temporary server's start-up wait
    from bench.orchestration import OrchestrationConfig, run

    result = run(OrchestrationConfig(recipe=args.recipe, runs=args.runs, device=args.device, heartbeat=args.heartbeat))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['workload']}: Prefect's fixed cost {result['prefect_fixed_cost_s']:.3f} s a flow run "
        f"(goal <= {result['goal_fixed_cost_s']} s), {result['prefect_per_epoch_ms']:.2f} ms an epoch "
        f"(goal <= {result['goal_per_epoch_ms']} ms), {result['prefect_overhead_share']:.1%} of a "
        f"{result['wall_s']:.2f} s run of {result['epochs']} epochs (goal <= {result['goal_share']:.0%} for "
        f"{result['goal_share_recipe']}; {result['tasks']} tasks); cold registry {result['cold_registry_share']:.1%}"
    )
    return 0


def _cmd_bench_policy(args: argparse.Namespace) -> int:
    from bench.policy import report

    with progress("bench policy", json_output=args.json) as display:
        text = report(args, display)
    print(text)
    return 0


def _cmd_bench_mnist1d(args: argparse.Namespace) -> int:
    from bench.mnist1d import cli

    return cli(args)


def _cmd_bench_growth(args: argparse.Namespace) -> int:
    return with_bar(_growth, args, "growth")


def _growth(args: argparse.Namespace, *, progress: Callable[[str, int, int], None] | None = None) -> int:
    """``esper bench growth``: print the table (``--json``: one JSON object)."""
    from esper_core.studies.growth import GrowthBenchConfig, run, save_baseline
    from esper_core.studies.growth_report import format_table

    result = run(
        GrowthBenchConfig(
            recipes=None if args.recipes is None else tuple(args.recipes),
            plan=args.plan,
            seeds=args.seeds,
            epochs=args.epochs,
            widths=None if args.widths is None else tuple(args.widths),
            simic_plan=args.simic_plan,
            policy_version=args.policy_version,
            home=args.home,
            device=args.device,
            workers=args.workers,
            dask_address=args.dask_address,
            arms=tuple(args.arms),
        ),
        progress=progress,
    )
    if args.save_baseline is not None:
        save_baseline(result, Path(args.save_baseline))
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def _cmd_bench_transfer(args: argparse.Namespace) -> int:
    return with_bar(_transfer, args, "transfer")


def _transfer(args: argparse.Namespace, *, progress: Callable[[str, int, int], None] | None = None) -> int:
    """``esper bench transfer``: print the table (``--json``: one JSON object)."""
    import dataclasses

    from esper_core.studies.transfer import TransferConfig, format_table, run, save_baseline
    from esper_core.studies.zoo_train import ZooTraining
    from esper_core.zoo import ZooSpec

    base = ZooTraining()
    plan = dataclasses.replace(
        base.plan, demonstrations=args.demonstrations, iterations=args.iterations, rollouts=args.rollouts
    )
    config = TransferConfig(
        families=tuple(args.families),
        training=ZooTraining(zoo=ZooSpec(seed=args.zoo_seed), members=args.members, plan=plan),
        eval_zoo_seed=args.eval_zoo_seed,
        eval_members=args.eval_members,
        seeds=args.seeds,
        workers=args.workers,
        device=args.device,
    )
    policies = None if args.save_baseline is None else Path(args.save_baseline) / "policies"
    result = run(config, policies_dir=policies, progress=progress)
    if args.save_baseline is not None:
        save_baseline(result, Path(args.save_baseline))
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def _cmd_bench_rules(args: argparse.Namespace) -> int:
    return with_bar(_rules, args, "rules")


def _rules(args: argparse.Namespace, *, progress: Callable[[str, int, int], None] | None = None) -> int:
    """``esper bench rules``: print the table (``--json``: one JSON object)."""
    from esper_core.studies.rules import RuleSearchConfig, format_table, run, save_baseline
    from esper_core.studies.zoo_train import ZooTraining
    from esper_core.zoo import ZooSpec

    config = RuleSearchConfig(
        training=ZooTraining(zoo=ZooSpec(seed=args.zoo_seed), members=args.members),
        families=tuple(args.families),
        eval_zoo_seed=args.eval_zoo_seed,
        eval_members=args.eval_members,
        seeds=args.seeds,
        workers=args.workers,
        device=args.device,
    )
    result = run(config, progress=progress)
    if args.save_baseline is not None:
        save_baseline(result, Path(args.save_baseline))
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def _add_evaluation_args(parser: argparse.ArgumentParser) -> None:
    """The paired evaluation's options that ``bench transfer`` and ``bench rules`` share."""
    parser.add_argument(
        "--eval-zoo-seed",
        type=int,
        default=1,
        help="the zoo seed evaluated members are drawn under: not --zoo-seed (the members trained or searched "
        "on), nor, for transfer, 0 (those the default heuristic's rule was searched on) (default: %(default)s)",
    )
    parser.add_argument(
        "--seeds", type=positive, default=5, help="paired evaluation seeds per member, 0.. (default: %(default)s)"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default: %(default)s)")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="Dask worker processes (one thread each); 0: one run after another here, same numbers (default: 0)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")


def _cmd_bench_depth_growth(args: argparse.Namespace) -> int:
    return with_bar(_depth_growth, args, "depth-growth")


def _depth_growth(args: argparse.Namespace, *, progress: Callable[[str, int, int], None] | None = None) -> int:
    """``esper bench depth-growth``: print the table (``--json``: one JSON object)."""
    from esper_core.studies.depth_growth import DepthGrowthConfig, read_result, run
    from esper_core.studies.depth_growth_report import combine, format_table, save_baseline

    config = DepthGrowthConfig(
        recipe=args.recipe,
        start_recipe=args.start_recipe,
        narrow_recipe=args.narrow_recipe,
        plan=args.plan,
        seeds=args.seeds,
        first_seed=args.first_seed,
        epochs=args.epochs,
        blend_lr_warmup_epochs=args.blend_lr_warmup,
        home=args.home,
        workers=args.workers,
    )
    # Read and checked before any run: a wrong file is refused in a second, not after an hour.
    earlier = read_result(args.merge_with, config) if args.merge_with is not None else None
    result = run(config, progress=progress)
    if earlier is not None:
        result = combine(earlier, result)
    if args.save_baseline is not None:
        save_baseline(result, Path(args.save_baseline))
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def _cmd_bench_headroom(args: argparse.Namespace) -> int:
    from bench.headroom import cli

    return with_bar(cli, args, "headroom")


def _training_options(b: argparse.ArgumentParser) -> None:
    """The training bench's options, named as the seeds' harness named them."""
    b.add_argument("--epochs", type=positive, default=30, help="timed epochs per path (default: %(default)s)")
    b.add_argument(
        "--min-seconds",
        type=float,
        default=2.0,
        help="time at least this much of the bare loop: short epochs run more than --epochs "
        "(0: exactly --epochs; default: %(default)s)",
    )
    b.add_argument("--warmup-batches", type=int, default=20, help="untimed steps first (default: %(default)s)")
    b.add_argument("--device", default="cpu", choices=DEVICES, help="device (default: %(default)s)")
    b.add_argument(
        "--compile", default="auto", choices=("auto", "on", "off"), help="step engine mode of the chosen path"
    )
    b.add_argument("--no-compile", action="store_true", help="same as --compile off")
    b.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. reduce-overhead")
    b.add_argument(
        "--compile-dynamic", action=argparse.BooleanOptionalAction, default=False, help="torch.compile dynamic shapes"
    )
    b.add_argument(
        "--compile-warmup-steps", type=int, default=2, help="eager steps before compiling (default: %(default)s)"
    )
    b.add_argument(
        "--seeds", type=int, choices=(0, 1), default=1, help="active seeds while timing (default: %(default)s)"
    )
    b.add_argument(
        "--gpu-dataset",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the training data on the device (CUDA); --no-gpu-dataset stages from pinned host memory",
    )
    b.add_argument(
        "--amp",
        default="auto",
        choices=PRECISIONS,
        help="precision of all three paths, the bare loop included (default: %(default)s: bf16 on CUDA, fp32 on CPU)",
    )
    b.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture the chosen path's step as a CUDA graph (reported and skipped on CPU)",
    )
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--save-baseline", metavar="PATH", default=None, help="also write a baseline JSON file here")
    b.set_defaults(func=_cmd_bench_training)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench <workload>``."""
    bench = sub.add_parser("bench", help="benchmarks against bare PyTorch").add_subparsers(
        dest="bench_command", required=True, metavar="WORKLOAD"
    )
    training = bench.add_parser(
        "training", help="any recipe: Tolaria (eager and chosen path) vs bare PyTorch, per epoch, same process"
    )
    training.add_argument(
        "--recipe",
        required=True,
        help=f"built-in recipe ({', '.join(RECIPES)}) or a user's pkg.mod:fn",
    )
    _training_options(training)
    for workload, text in (
        ("seed-reference", "Linear 16->4, 16 samples, batch 4 (the seeds' Phase 0 workload)"),
        ("digits-mlp", "64-64 MLP on the bundled 8x8 digits"),
        ("digits-cnn", "16-32 channel CNN on the digits as 1x8x8 images"),
    ):
        # The seeds' names for the training bench of their three workloads.
        b = bench.add_parser(workload, help=f"{text}: same as `bench training --recipe {workload}`")
        _training_options(b)
        b.set_defaults(recipe=workload)
    drill = bench.add_parser("drill", help="inject a fault into a real run and check its telemetry")
    drill.add_argument("drill", choices=("timeout", "rollback"), help="which fault to inject")
    drill.add_argument("--json", action="store_true", help="print one JSON object")
    drill.set_defaults(func=_cmd_bench_drill)
    b_compile = bench.add_parser("compile", help="Tezzeret compile cost vs Kasmina load/first use; Urza lookups")
    b_compile.add_argument("--blueprint", default="residual_mlp", help="blueprint to compile (default: %(default)s)")
    b_compile.add_argument("--profile", default="f64-b512", help="shape profile (default: %(default)s)")
    b_compile.add_argument(
        "--backend", default="aot_inductor", choices=("export", "aot_inductor"), help="Tezzeret backend"
    )
    b_compile.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default: %(default)s)")
    b_compile.add_argument("--lookups", type=positive, default=1000, help="timed registry lookups")
    b_compile.add_argument("--publishes", type=positive, default=200, help="artifacts published before the lookups")
    b_compile.add_argument("--load-repeats", type=positive, default=3, help="fresh processes timing Kasmina's load")
    b_compile.add_argument("--registry-url", default=None, help="also measure Urza on this empty scratch database")
    b_compile.add_argument("--json", action="store_true", help="print one JSON object on one line (default: a table)")
    b_compile.set_defaults(func=_cmd_bench_compile)
    orch = bench.add_parser("orchestration", help="Prefect's share of a default morphogenesis run")
    orch.add_argument(
        "--recipe",
        default="mnist1d-cnn",
        choices=RECIPES,
        help="recipe of the measured runs: %(choices)s (default: %(default)s, whose share the 2 %% goal is about)",
    )
    orch.add_argument("--runs", type=positive, default=3, help="measured runs after a cold one (default: %(default)s)")
    orch.add_argument("--device", default="cpu", choices=DEVICES, help="device (default: %(default)s)")
    orch.add_argument(
        "--heartbeat",
        action="store_true",
        help="keep Prefect's flow-run heartbeat, as deployment runs do (its thread's join adds up to 1 s a flow run)",
    )
    orch.add_argument("--json", action="store_true", help="print one JSON object")
    orch.set_defaults(func=_cmd_bench_orchestration)
    b_policy = bench.add_parser("policy", help="policy-graph: Tamiyo's GNN forward eager vs compiled vs bare PyG")
    b_policy.add_argument("--iters", type=positive, default=300, help="timed calls per path (default: %(default)s)")
    b_policy.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default: %(default)s)")
    b_policy.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode (default: %(default)s)")
    b_policy.add_argument("--no-warmup-probes", action="store_true", help="skip the cold/cached warm-up processes")
    b_policy.add_argument("--json", action="store_true", help="print one JSON object")
    b_policy.set_defaults(func=_cmd_bench_policy)
    b_growth = bench.add_parser(
        "growth", help="trained GNN policy vs heuristic, budget-matched random, periodic, no growth, static frontier"
    )
    b_growth.add_argument(
        "--recipes",
        nargs="+",
        default=None,
        metavar="RECIPE",
        # Checked by GrowthBenchConfig: an import path is allowed if its host can change width.
        help=f"recipes to grow on: built-in names ({', '.join(RECIPES)}) or pkg.mod:fn import paths "
        "whose host scales (HostConfig, or ModelSpec with build_scaled) (default: the plan's)",
    )
    b_growth.add_argument(
        "--plan",
        default="default",
        choices=GROWTH_PLANS,
        help="default: mnist1d-cnn, 8 paired seeds, 3-width frontier (~9 min on 2 cores); full: also "
        "digits-mlp, 20 seeds, 5-width frontier; smoke: 2 seeds, 2 epochs (CI)",
    )
    b_growth.add_argument("--seeds", type=positive, default=None, help="paired seeds per recipe (default: the plan's)")
    b_growth.add_argument("--epochs", type=positive, default=None, help="epochs per run (default: the plan's)")
    b_growth.add_argument(
        "--widths",
        type=float,
        nargs="+",
        default=None,
        metavar="F",
        help="frontier width factors besides 1 (default: the plan's)",
    )
    b_growth.add_argument(
        "--simic-plan",
        default=None,
        choices=SIMIC_PLANS,
        help="Simic plan that trains the learned arm (default: the growth plan's; counterfactual: forked rewards; search: imitate the best searched schedule)",
    )
    b_growth.add_argument("--policy-version", type=positive, default=None, help="evaluate a stored version")
    b_growth.add_argument("--home", type=Path, default=None, help="ESPER_HOME to use (default: a fresh temporary one)")
    b_growth.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default: %(default)s)")
    b_growth.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="Dask worker processes (one thread each) on a local cluster; 0: one run after another in this "
        "process, same numbers (default: one per core, %(default)s)",
    )
    b_growth.add_argument(
        "--dask-address",
        default=None,
        metavar="ADDRESS",
        help="fan out on this Dask scheduler (tcp://host:8786) instead; needs --home on a path every worker sees",
    )
    b_growth.add_argument(
        "--arms",
        nargs="+",
        default=list(GROWING_ARMS),
        choices=GROWING_ARMS,
        metavar="ARM",
        help=f"growing arms to run beside no growth and the frontier ({', '.join(GROWING_ARMS)}); without gnn no "
        "policy is trained; the goals are judged when gnn, heuristic and random run; random needs gnn (default: all)",
    )
    b_growth.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    b_growth.add_argument(
        "--save-baseline", type=Path, default=None, metavar="DIR", help="write growth.json and growth_frontier.png here"
    )
    b_growth.set_defaults(func=_cmd_bench_growth)
    b_transfer = bench.add_parser(
        "transfer",
        help="leave-one-family-out: a zoo policy trained without a family vs the heuristic, no growth and the "
        "static network of its grown shape (weight decay tuned on validation)",
    )
    b_transfer.add_argument(
        "--families",
        nargs="+",
        default=list(ZOO_FAMILIES),
        choices=ZOO_FAMILIES,
        metavar="FAMILY",
        help=f"families to hold out, each in turn ({', '.join(ZOO_FAMILIES)}; default: all)",
    )
    b_transfer.add_argument("--zoo-seed", type=int, default=0, help="the zoo's seed (default: %(default)s)")
    b_transfer.add_argument(
        "--members", type=positive, default=14, help="members of each held-out training (default: %(default)s)"
    )
    b_transfer.add_argument(
        "--demonstrations", type=positive, default=2, help="heuristic episodes per member (default: %(default)s)"
    )
    b_transfer.add_argument("--iterations", type=positive, default=3, help="PPO iterations (default: %(default)s)")
    b_transfer.add_argument(
        "--rollouts", type=positive, default=2, help="GNN episodes per member per iteration (default: %(default)s)"
    )
    b_transfer.add_argument(
        "--eval-members", type=positive, default=2, help="members of a held-out family scored (default: %(default)s)"
    )
    _add_evaluation_args(b_transfer)
    b_transfer.add_argument(
        "--save-baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="write transfer.json, transfer_flops.png and each held-out policy (policies/<family>/) here",
    )
    b_transfer.set_defaults(func=_cmd_bench_transfer)
    b_rules = bench.add_parser(
        "rules",
        help="the best single fixed growth rule: the heuristic's thresholds searched on the zoo's selection seeds, "
        "then scored against the static network of its grown shape on hosts the search never drew",
    )
    b_rules.add_argument("--zoo-seed", type=int, default=0, help="the searched zoo's seed (default: %(default)s)")
    b_rules.add_argument(
        "--members", type=positive, default=14, help="zoo members the rules are searched on (default: %(default)s)"
    )
    b_rules.add_argument(
        "--families",
        nargs="+",
        default=list(ZOO_FAMILIES),
        choices=ZOO_FAMILIES,
        metavar="FAMILY",
        help=f"families the chosen rule is evaluated on ({', '.join(ZOO_FAMILIES)}; default: all)",
    )
    b_rules.add_argument(
        "--eval-members", type=positive, default=2, help="members of each family evaluated (default: %(default)s)"
    )
    _add_evaluation_args(b_rules)
    b_rules.add_argument(
        "--save-baseline", type=Path, default=None, metavar="DIR", help="write rules.json and rules_flops.png here"
    )
    b_rules.set_defaults(func=_cmd_bench_rules)
    b_depth = bench.add_parser(
        "depth-growth",
        help="validation loss against training FLOPs: static final and start networks, stacked depth growth, "
        "the heuristic deepening (chars-gpt-growth)",
    )
    b_depth.add_argument("--recipe", default="chars-gpt-growth", help="final-size recipe (default: %(default)s)")
    b_depth.add_argument(
        "--start-recipe",
        default="chars-gpt-growth-start",
        help="the same recipe at the start depth (default: %(default)s)",
    )
    b_depth.add_argument(
        "--narrow-recipe",
        default="chars-gpt-growth-narrow",
        help="the same recipe at half the width, the widen arms' start (default: %(default)s)",
    )
    b_depth.add_argument(
        "--plan",
        default="default",
        choices=DEPTH_GROWTH_PLANS,
        help="default: 3 paired seeds, the recipe's 8 epochs, one block stacked after epochs 0 and 4, the whole "
        "stack copied after epoch 1 or 3, the heuristic; budgets: the final network alone at 4, 6 and 8 epochs "
        "(its frontier); crossover: the start and final networks and the heuristic at 16 epochs; crossover-budgets: the final network alone at 8, 12 and 16 epochs; crossover-stacked: the final network and stacking (after 0 and 4, whole stack after 4 or 8) at 16 epochs, to --merge-with crossover's; widen: the final network and its half-width one static, and the half-width one doubled in place after epoch 1 or 2; widen-crossover: the same at 16 epochs, doubled after epoch 3, to --merge-with crossover's; widen-points: 16 epochs, doubled after epoch 1, 3 or 5 (to choose on a selection seed); widen-late: 16 epochs, doubled after epoch 5 (widen-points' choice) or by the heuristic on the first epoch that improved by under 2.9 %%, to --merge-with widen-crossover's; widen-smooth: 6 seeds, 16 epochs, the heuristic doubling when two epochs improved by under 6.7 %%; widen-budget: 6 fresh seeds (--first-seed 6), 16 epochs, doubled after epoch 5 or by widen-late's rule once 5/16 of the run is done; smoke: 1 seed, 6 "
        "epochs on 64 training windows (CI)",
    )
    b_depth.add_argument("--seeds", type=positive, default=None, help="paired seeds (default: the plan's)")
    b_depth.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the first paired seed (default: %(default)s); from 1000 on, a selection run, reported apart",
    )
    b_depth.add_argument("--epochs", type=positive, default=None, help="epochs per run (default: the plan's)")
    b_depth.add_argument(
        "--blend-lr-warmup",
        type=int,
        default=0,
        metavar="EPOCHS",
        help="ramp the grown blocks' learning rate up over their first EPOCHS blending epochs; the growing arms "
        "are then named -wEPOCHS, to merge with a run without (default: %(default)s, no warm-up)",
    )
    b_depth.add_argument("--home", type=Path, default=None, help="ESPER_HOME to use (default: a fresh temporary one)")
    b_depth.add_argument(
        "--workers",
        type=int,
        default=0,
        help="local worker processes (one thread each); 0: one run after another here, same numbers "
        "(default: %(default)s)",
    )
    b_depth.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    b_depth.add_argument(
        "--save-baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="write depth_growth.json and depth_growth.png (loss against FLOPs) here",
    )
    b_depth.add_argument(
        "--merge-with",
        type=Path,
        default=None,
        metavar="JSON",
        help="an earlier depth_growth.json of the same recipe to report together with this run: on the same "
        "seeds, other arms (e.g. the default plan's with --plan budgets; their static-final runs must match), or "
        "the same plan on disjoint seeds (--first-seed past its seeds: more seeds)",
    )
    b_depth.set_defaults(func=_cmd_bench_depth_growth)
    b_headroom = bench.add_parser(
        "headroom", help="best fixed growth schedule in hindsight vs the heuristic: what a learned policy could gain"
    )
    b_headroom.add_argument(
        "--recipe", default="mnist1d-cnn", help="built-in recipe name or pkg.mod:fn (default: %(default)s)"
    )
    b_headroom.add_argument(
        "--plan",
        default="default",
        choices=("default", "smoke"),
        help="default: 4 training seeds, 10 held-out, recipe epochs, 3 germination points; smoke: 2+2 seeds, 3 epochs",
    )
    b_headroom.add_argument("--train-seeds", type=positive, default=None, help="Simic training seeds to rank on")
    b_headroom.add_argument("--holdout-seeds", type=positive, default=None, help="held-out seeds to confirm on")
    b_headroom.add_argument(
        "--home", type=Path, default=None, help="ESPER_HOME to use (default: a fresh temporary one)"
    )
    b_headroom.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default: %(default)s)")
    b_headroom.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    b_headroom.add_argument("--save-baseline", type=Path, default=None, metavar="DIR", help="write headroom.json here")
    b_headroom.set_defaults(func=_cmd_bench_headroom)
    b_mnist1d = bench.add_parser("mnist1d", help="static MNIST-1D hosts (logistic, MLP, CNN) vs the paper's accuracy")
    b_mnist1d.add_argument("--seeds", type=positive, default=5, help="seeds per host (default: %(default)s)")
    b_mnist1d.add_argument(
        "--num-test", type=positive, default=1000, help="test signals, published 1,000 first (default: %(default)s)"
    )
    b_mnist1d.add_argument("--epochs", type=positive, default=None, help="epochs of every host (default: its own)")
    b_mnist1d.add_argument(
        "--hosts",
        nargs="+",
        default=["logistic", "mlp", "cnn"],
        choices=("logistic", "mlp", "cnn"),
        help="hosts to train",
    )
    b_mnist1d.add_argument("--frontier", action="store_true", help="train mlp/cnn at narrower widths instead")
    b_mnist1d.add_argument("--threads", type=positive, default=None, help="torch threads (default: torch's)")
    b_mnist1d.add_argument("--json", action="store_true", help="print one JSON object")
    b_mnist1d.add_argument("--save-baseline", metavar="PATH", default=None, help="also write a baseline JSON file")
    b_mnist1d.set_defaults(func=_cmd_bench_mnist1d)
    compare = bench.add_parser("compare", help="print two baseline files side by side")
    compare.add_argument("before", help="baseline JSON (e.g. baselines/perf/digits-mlp/before.json)")
    compare.add_argument("after", help="baseline JSON to compare against it")
    compare.set_defaults(func=_cmd_bench_compare)
