"""growth: does Simic's trained policy grow networks better than the heuristic and random?

For each recipe (``digits-mlp``, ``digits-cnn``) and evaluation seed (0, 1, ... ``seeds - 1``),
whole runs in-process, arm by arm on the same seed (same data split and initialisation):

- ``none``: the host alone (Tamiyo always waits);
- ``static-large``: a host of the same shape, widened until it has at least as many parameters as
  the largest mean grown network of the three growing arms, trained alone;
- ``random``: random germination (Tamiyo's random baseline, lifecycle rules kept);
- ``heuristic``: Tamiyo's rule-based policy;
- ``gnn``: the GNN policy Simic trained first (heuristic demonstrations on seeds from 1000,
  imitation, then PPO on its own sampled rollouts), or a stored ``--policy-version``.

Reports test accuracy (mean +- std over seeds), parameters and wall time per arm, and whether
the issue's goal holds: the GNN beats the heuristic and random, and is within 0.3 points of the
static large host with fewer parameters. Everything runs on a fresh registry in a temporary
``ESPER_HOME`` unless ``home`` is given (kernels are compiled first; reuse a home to skip that).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import NO_PROGRESS, Progress
from esper_core.data import load_dataset
from esper_core.hosts import HostConfig, build_host_from_config
from esper_core.karn.catalog import default_catalog
from esper_core.pipeline import compile_job, find_published, publish_kernel
from esper_core.run.config import RunConfig
from esper_core.run.episodes import EpisodeResult, episode_config, run_episode
from esper_core.run.plan import plan_compile_jobs
from esper_core.run.recipes import RECIPES, get_recipe
from esper_core.run.simic_train import TrainingPlan, collect_episodes, get_plan, train_imitation, train_ppo
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.urza.service import Urza

GROWING_ARMS = ("random", "heuristic", "gnn")
ARMS = ("none", "static-large", *GROWING_ARMS)
GOAL_MARGIN_POINTS = 0.3


@dataclass(kw_only=True, slots=True)
class GrowthBenchConfig:
    """Options of the growth benchmark."""

    recipes: tuple[str, ...] = ("digits-mlp", "digits-cnn")
    seeds: int = 3
    """Evaluation seeds per recipe (0 .. seeds - 1)."""
    epochs: int | None = None
    """Epochs per run (None: each recipe's own, 10)."""
    plan: str = "default"
    """Simic training plan for the GNN arm (see ``esper_core.run.simic_train.PLANS``)."""
    policy_version: int | None = None
    """Evaluate this stored policy version instead of training one (needs ``home``)."""
    home: Path | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if self.policy_version is not None and self.home is None:
            raise ValueError("policy_version names a version in a registry: pass the home that holds it")
        get_plan(self.plan)
        for recipe in self.recipes:
            if not get_recipe(recipe).host.hidden:
                raise ValueError(
                    f"recipe {recipe!r} has no hidden layers for the static-large arm to widen; "
                    f"choose among {growable_recipes()}"
                )


def growable_recipes() -> list[str]:
    """Recipes the benchmark can run: their hosts have hidden layers to widen (static-large)."""
    return sorted(name for name, factory in RECIPES.items() if getattr(factory().host, "hidden", None))


def run(config: GrowthBenchConfig, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Run the benchmark; returns per-arm results, the policy's provenance and the goal checks.

    ``progress`` hears of each stage (kernel compiles, each phase of the policy's training) and
    each evaluation run, between runs (every run's wall time is a reported figure).
    """
    if config.home is not None:
        return _run_in(config, Path(config.home), progress)
    with tempfile.TemporaryDirectory(prefix="esper-growth-") as home:
        return _run_in(config, Path(home), progress)


class _Steps:
    """Counts the benchmark's steps for ``progress``: ``steps.next("what starts now")``."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def next(self, description: str) -> None:
        self.progress(description, self.done, self.total)
        self.done += 1


def _run_in(config: GrowthBenchConfig, home: Path, progress: Progress) -> dict[str, Any]:
    settings = EsperSettings(home=home)
    plan = dataclasses.replace(get_plan(config.plan), epochs=config.epochs)
    # Kernels, then (unless a stored policy is evaluated) demonstrations per recipe, imitation and
    # per PPO iteration the rollouts per recipe and the update; then every evaluation run.
    training = 0 if config.policy_version else len(config.recipes) + 1 + plan.iterations * (len(config.recipes) + 1)
    steps = _Steps(progress, 1 + training + len(config.recipes) * config.seeds * len(ARMS))
    steps.next("compiling the recipes' kernels")
    start = time.perf_counter()
    _compile_kernels(settings, config.recipes, config.device)
    compile_s = time.perf_counter() - start
    store = SimicStore.open(home)
    try:
        start = time.perf_counter()
        version = config.policy_version or _train_policy(settings, store, plan, config, steps)
        training_s = time.perf_counter() - start
        policy = store.get_policy(version)
    finally:
        store.close()
    results: dict[str, dict[str, list[EpisodeResult]]] = {}
    for recipe in config.recipes:
        arms: dict[str, list[EpisodeResult]] = {arm: [] for arm in ARMS}
        for seed in range(config.seeds):
            for arm in ("none", *GROWING_ARMS):
                run_config = episode_config(
                    recipe,
                    seed=seed,
                    policy=arm,
                    epochs=config.epochs,
                    device=config.device,
                    policy_version=version if arm == "gnn" else None,
                )
                run_config.tamiyo = dataclasses.replace(run_config.tamiyo, gnn=policy.gnn)
                run_id = _fresh(settings, f"growth-{recipe}-{arm}-s{seed}")
                steps.next(f"{recipe} seed {seed}: {arm}")
                arms[arm].append(run_episode(run_config, settings=settings, run_id=run_id))
        target = max(statistics.fmean(r.total_params for r in arms[arm]) for arm in GROWING_ARMS)
        for seed in range(config.seeds):
            static = _static_large(recipe, seed=seed, epochs=config.epochs, device=config.device, min_params=target)
            run_id = _fresh(settings, f"growth-{recipe}-static-large-s{seed}")
            steps.next(f"{recipe} seed {seed}: static-large")
            arms["static-large"].append(run_episode(static, settings=settings, run_id=run_id))
        results[recipe] = arms
    progress("done", steps.total, steps.total)
    return _report(config, results, policy_version=version, policy=policy, training_s=training_s, compile_s=compile_s)


def _compile_kernels(settings: EsperSettings, recipes: tuple[str, ...], device: str) -> None:
    urza = Urza.open(settings.home)
    catalog = default_catalog()
    try:
        for name in recipes:
            recipe = get_recipe(name)
            shape = load_dataset(recipe.data).feature_shape
            for job in plan_compile_jobs(recipe, feature_shape=shape, catalog=catalog):
                if find_published(urza, job, device) is None:
                    publish_kernel(urza, catalog, compile_job(catalog, job, device))
    finally:
        urza.close()


def _train_policy(
    settings: EsperSettings, store: SimicStore, plan: TrainingPlan, config: GrowthBenchConfig, steps: _Steps
) -> int:
    """Simic's procedure (what the train_policy flow chains), on every recipe together."""
    demos: list[str] = []
    for recipe in config.recipes:
        steps.next(f"policy: {plan.demonstrations} heuristic demonstration(s) on {recipe}")
        episodes = collect_episodes(
            settings,
            recipe=recipe,
            seeds=plan.seeds("demonstrations"),
            policy="heuristic",
            plan=plan,
            device=config.device,
        )
        demos += [r.run_id for r in episodes]
    steps.next("policy: imitation of the demonstrations")
    version = train_imitation(store, demos, plan).version
    for iteration in range(plan.iterations):
        rollouts: list[str] = []
        for recipe in config.recipes:
            steps.next(f"policy: PPO {iteration + 1}/{plan.iterations}, {plan.rollouts} rollout(s) on {recipe}")
            episodes = collect_episodes(
                settings,
                recipe=recipe,
                seeds=plan.seeds("rollouts", iteration),
                policy="gnn",
                plan=plan,
                explore=True,
                policy_version=version,
                device=config.device,
            )
            rollouts += [r.run_id for r in episodes]
        steps.next(f"policy: PPO {iteration + 1}/{plan.iterations}, update")
        version = train_ppo(
            store, version=version, rollout_run_ids=rollouts, demonstration_run_ids=demos, plan=plan
        ).version
    return version


def host_params(host: HostConfig, *, feature_shape: tuple[int, ...], num_classes: int) -> int:
    """Parameters of ``host`` for data of this shape (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = build_host_from_config(host, feature_shape=feature_shape, num_classes=num_classes)
    return sum(p.numel() for p in model.host_parameters())


def _static_large(recipe: str, *, seed: int, epochs: int | None, device: str, min_params: float) -> RunConfig:
    """The recipe's host scaled (all widths by the same factor) to at least ``min_params``."""
    config = episode_config(recipe, seed=seed, policy="none", epochs=epochs, device=device)
    data = load_dataset(config.data)
    base = config.host.hidden
    for step in range(0, 400):
        hidden = tuple(max(1, round(w * (1.0 + step / 64))) for w in base)
        host = dataclasses.replace(config.host, hidden=hidden)
        if host_params(host, feature_shape=data.feature_shape, num_classes=data.num_classes) >= min_params:
            config.host = host
            return config
    raise ValueError(f"no widening of {recipe}'s host {base} reaches {min_params:.0f} parameters")


def _fresh(settings: EsperSettings, run_id: str) -> str:
    """``run_id``, with the folder of an earlier benchmark run of the same id removed.

    Ids are deterministic so that a rerun draws the same random numbers (the random arm's and
    the GNN's sampling are seeded by run id and epoch).
    """
    shutil.rmtree(settings.runs_dir / run_id, ignore_errors=True)
    return run_id


def _report(
    config: GrowthBenchConfig,
    results: dict[str, dict[str, list[EpisodeResult]]],
    *,
    policy_version: int,
    policy: Any,  # noqa: ANN401  (PolicyVersion)
    training_s: float,
    compile_s: float,
) -> dict[str, Any]:
    table: dict[str, dict[str, dict[str, Any]]] = {}
    goals: dict[str, dict[str, Any]] = {}
    for recipe, arms in results.items():
        table[recipe] = {arm: _summary(runs) for arm, runs in arms.items()}
        t = table[recipe]
        goals[recipe] = {
            "gnn_beats_heuristic": t["gnn"]["test_acc_mean"] > t["heuristic"]["test_acc_mean"],
            "gnn_beats_random": t["gnn"]["test_acc_mean"] > t["random"]["test_acc_mean"],
            "gnn_within_0.3_of_static_large": t["static-large"]["test_acc_mean"] - t["gnn"]["test_acc_mean"]
            <= GOAL_MARGIN_POINTS,
            "gnn_fewer_params_than_static_large": t["gnn"]["params_mean"] < t["static-large"]["params_mean"],
        }
        goals[recipe]["met"] = all(goals[recipe].values())
    return {
        "bench": "growth",
        "recipes": list(config.recipes),
        "seeds": list(range(config.seeds)),
        "epochs": config.epochs,
        "device": config.device,
        "policy": {
            "version": policy_version,
            "method": policy.method,
            "parent_version": policy.parent_version,
            "training_s": training_s,
            "plan": config.plan if config.policy_version is None else None,
            "metrics": policy.provenance.get("metrics", {}),
        },
        "kernel_compile_s": compile_s,
        "results": table,
        "goals": goals,
    }


def _summary(runs: list[EpisodeResult]) -> dict[str, Any]:
    acc = [100.0 * r.test_accuracy for r in runs]
    return {
        "test_acc_mean": statistics.fmean(acc),
        "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        "params_mean": statistics.fmean(r.total_params for r in runs),
        "wall_s_mean": statistics.fmean(r.wall_s for r in runs),
        "runs": [
            {
                "seed": r.seed,
                "test_acc": 100.0 * r.test_accuracy,
                "params": r.total_params,
                "wall_s": r.wall_s,
                "commands": r.commands,
            }
            for r in runs
        ],
    }


def format_table(result: dict[str, Any]) -> str:
    """The human-readable table of ``run``'s result."""
    policy = result["policy"]
    lines = [
        f"growth on {result['device']}: seeds {result['seeds']}, epochs {result['epochs'] or 'recipe default'}; "
        f"GNN policy v{policy['version']} ({policy['method']}, trained in {policy['training_s']:.0f} s)",
        "",
        "| recipe | arm | test acc % (mean ± std) | params | wall s |",
        "|---|---|---:|---:|---:|",
    ]
    for recipe, arms in result["results"].items():
        for arm in ARMS:
            s = arms[arm]
            lines.append(
                f"| {recipe} | {arm} | {s['test_acc_mean']:.2f} ± {s['test_acc_std']:.2f} | "
                f"{s['params_mean']:.0f} | {s['wall_s_mean']:.2f} |"
            )
    lines.append("")
    for recipe, goal in result["goals"].items():
        checks = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in goal.items() if k != "met")
        lines.append(f"goal on {recipe}: {'met' if goal['met'] else 'not met'} ({checks})")
    return "\n".join(lines)


def report(args: Any, progress: Progress = NO_PROGRESS) -> str:  # noqa: ANN401  (argparse.Namespace from esper_cli.bench)
    """``esper bench growth``: run it and return the table (``--json``: one JSON object).

    The text is returned, not printed, so the CLI prints it after its progress display is gone.
    """
    result = run(
        GrowthBenchConfig(
            recipes=tuple(args.recipes),
            seeds=args.seeds,
            epochs=args.epochs,
            plan=args.plan,
            policy_version=args.policy_version,
            home=args.home,
            device=args.device,
        ),
        progress,
    )
    return json.dumps(result, indent=2) if args.json else format_table(result)
