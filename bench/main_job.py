"""main_job: does a grown network beat the static network of its own shape?

``make run`` grows ``mnist1d-cnn-grown`` (the learned width policy's schedule, replayed) and its
summary sets the one network it grows beside a yardstick measured here. Per seed, paired (same
initialisation stream, data order and data), these are trained:

- ``grown``: the recipe as ``make run`` runs it (the episodes' eager step);
- ``static``: the host at the grown network's final widths, trained from scratch, no growth;
- ``tuned``: the same with its weight decay chosen on the validation split from a grid (the
  test split is read only after the choice): the yardstick;
- ``tuned_early``: the same grid with early stopping too, each run scored at its best validation
  epoch (``yardstick.early_stopped``) before the weight decay is chosen. Measured, it did worse on
  test than ``tuned`` (the best of 60 noisy validation readings on 1,000 signals is mostly noise:
  docs/growth-results.md), so it is reported beside the yardstick, not as it.

The same protocol measures any MNIST-1D width recipe under any policy (``--recipe``,
``--policy``): e.g. the default controller on a recipe, ``--default-heuristic`` replacing the
recipe's own thresholds with the rule ``HeuristicConfig()`` ships (the one searched over the zoo),
as a model Esper never saw would run it.

The schedule was read off the learned policy's behaviour on seeds 0-19, the recipes' thresholds
were chosen and their static frontiers trained on them, so the seeds here start at 20: nothing
was chosen on them. ``--data-per-seed`` draws a fresh MNIST-1D data set per seed
(``mnist1d_splits(seed=...)``, from the generator's seed 10,000 + seed) so that the interval
covers the data's spread too; without it every seed trains and tests on the published data set,
the one ``make run`` uses, which is what the run summary compares a run with
(``esper_core.run.frontier.SHAPE_YARDSTICKS``).

    OMP_NUM_THREADS=1 python -m bench.main_job [--recipe R] [--policy P] [--default-heuristic] [--grow-until F] \
        [--seeds 40] [--first-seed 20] [--workers 1] [--data-per-seed] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import multiprocessing
import statistics
import tempfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench._output import save_json
from esper_core.data import DataSpec, load_dataset
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.recipes import get_recipe, mnist1d_splits
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.studies.yardstick import best_on_validation, early_stopped, static_shape
from esper_core.tamiyo.config import POLICIES
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.tamiyo.risk import RiskConfig
from esper_core.telemetry.paired import paired_difference

RECIPES = ("mnist1d-cnn-grown", "mnist1d-cnn-width", "mnist1d-mlp-width")
"""The MNIST-1D recipes with width slots: their static network of a grown shape is the host at
other widths, and their data can be drawn per seed."""
WEIGHT_DECAYS = (0.0, 1e-4, 1e-3)
"""The tuned arm's grid, the transfer benchmark's (0 is the ``static`` arm)."""
ARMS = ("grown", "static", "tuned", "tuned_early")
DATA_SEED_OFFSET = 10_000
"""A seed's own data set is the generator's seed ``10,000 + seed``: far from the published 42."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Subject:
    """What grows: a recipe, its policy (None: the recipe's own) and whose heuristic thresholds."""

    recipe: str = "mnist1d-cnn-grown"
    policy: str | None = None
    default_heuristic: bool = False
    grow_until: float = 1.0
    """``RiskConfig.grow_until``: the share of the run after which no seed is germinated."""

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(
                f"--recipe {self.recipe!r}: the own-shape yardstick needs an MNIST-1D recipe with width slots, one of {RECIPES}"
            )
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"--policy {self.policy!r}: must be one of {POLICIES}")
        RiskConfig(grow_until=self.grow_until)  # its own check: a share of the run in (0, 1]
        tamiyo = get_recipe(self.recipe).tamiyo
        policy = self.policy or tamiyo.policy
        if policy == "scheduled" and not tamiyo.schedule:
            raise ValueError(f"--policy scheduled: {self.recipe} has no schedule to replay; use mnist1d-cnn-grown")
        if self.default_heuristic and policy != "heuristic":
            raise ValueError(
                f"--default-heuristic: the rule decides only under policy heuristic, and {self.recipe} runs {policy}; "
                "add --policy heuristic"
            )

    def config(self, seed: int, data_per_seed: bool) -> RunConfig:
        config = get_recipe(self.recipe)
        if self.default_heuristic:
            config.tamiyo = dataclasses.replace(config.tamiyo, heuristic=HeuristicConfig())
        if self.grow_until != 1.0:
            config.tamiyo = dataclasses.replace(
                config.tamiyo, risk=dataclasses.replace(config.tamiyo.risk, grow_until=self.grow_until)
            )
        if data_per_seed:
            assert isinstance(config.data, DataSpec), "the MNIST-1D recipes load through a DataSpec"
            config.data = dataclasses.replace(
                config.data, load=functools.partial(mnist1d_splits, seed=DATA_SEED_OFFSET + seed)
            )
        policy = self.policy or config.tamiyo.policy
        schedule = config.tamiyo.schedule if policy == "scheduled" else ()
        return episode_config(config, seed=seed, policy=policy, schedule=schedule)


def _score(r: EpisodeResult) -> dict[str, Any]:
    return {
        "test_acc": round(100.0 * r.test_accuracy, 2),
        "val_acc": round(100.0 * r.val_accuracy, 2),
        "params": r.total_params,
        "train_flops": r.train_flops,
        "halted": r.halted,
    }


def run_seed(seed: int, *, subject: Subject, data_per_seed: bool, weight_decays: Sequence[float]) -> dict[str, Any]:
    """One seed's arms (the grid's every run recorded)."""
    torch.set_num_threads(1)
    config = subject.config(seed, data_per_seed)
    with tempfile.TemporaryDirectory(prefix="esper-main-job-") as home:
        settings = EsperSettings(home=home)
        grown = run_episode(config, settings=settings, run_id=f"grown-{seed}")
        host = config.host
        assert isinstance(host, ModelSpec), "a built-in recipe's host is a ModelSpec"
        shape = load_dataset(config.data).feature_shape
        static_host = dataclasses.replace(
            host, build=functools.partial(static_shape, host.build, grown.widths, shape, host.input_dtype)
        )
        static_config = episode_config(dataclasses.replace(config, host=static_host), seed=seed, policy="none")
        grid = {}
        for wd in weight_decays:
            c = dataclasses.replace(static_config, trainer=dataclasses.replace(static_config.trainer, weight_decay=wd))
            grid[wd] = run_episode(c, settings=settings, run_id=f"static-wd{wd:g}-{seed}", early_stopping=True)
    best = best_on_validation(grid, language_model=False)
    stopped = {wd: early_stopped(r) for wd, r in grid.items()}
    best_early = best_on_validation(stopped, language_model=False)
    # None: a run that halted before its first epoch ended (scored at its start commit).
    early = grid[best_early].early_stop
    return {
        "seed": seed,
        "widths": dict(grown.widths),
        "grown": _score(grown),
        "static": _score(grid[0.0]),
        "tuned": {**_score(grid[best]), "weight_decay": best},
        "tuned_early": {
            **_score(stopped[best_early]),
            "weight_decay": best_early,
            "epoch": None if early is None else early.epoch,
        },
        "grid": {f"{wd:g}": _score(r) for wd, r in grid.items()},
        "grid_early_stopped": {f"{wd:g}": _score(r) for wd, r in stopped.items()},
    }


def _diff(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    d = paired_difference(a, b)
    return {"mean": round(d.mean, 2), "ci95_low": round(d.ci95_low, 2), "ci95_high": round(d.ci95_high, 2), "n": d.n}


def summarise(runs: Sequence[dict[str, Any]], *, subject: Subject, data_per_seed: bool) -> dict[str, Any]:
    """Paired differences over every seed (each grown network against the static network of its
    own shape), and the static arms' means at the shape most seeds grew to (what one run of that
    shape is compared with)."""
    shapes = Counter(tuple(sorted(r["widths"].items())) for r in runs)
    modal, count = shapes.most_common(1)[0]
    at_modal = [r for r in runs if tuple(sorted(r["widths"].items())) == modal]

    def acc(rs: Sequence[dict[str, Any]], arm: str) -> list[float]:
        return [r[arm]["test_acc"] for r in rs]

    return {
        "bench": "main_job",
        "recipe": subject.recipe,
        "policy": subject.policy or get_recipe(subject.recipe).tamiyo.policy,
        "heuristic": "HeuristicConfig() (the default rule)" if subject.default_heuristic else "the recipe's",
        "grow_until": subject.grow_until,
        "epochs": get_recipe(subject.recipe).epochs,
        "data": "a fresh MNIST-1D draw per seed" if data_per_seed else "the published MNIST-1D (make run's)",
        "data_per_seed": data_per_seed,
        "seeds": [r["seed"] for r in runs],
        "weight_decays": list(WEIGHT_DECAYS),
        "grown_test_accuracy_mean": round(statistics.fmean(acc(runs, "grown")), 2),
        "grown_minus_static": _diff(acc(runs, "grown"), acc(runs, "static")),
        "grown_minus_tuned": _diff(acc(runs, "grown"), acc(runs, "tuned")),
        "grown_minus_tuned_early": _diff(acc(runs, "grown"), acc(runs, "tuned_early")),
        # A halted run stays in its pair, scored at its last commit (``run_episode``).
        "halted": {arm: sum(r[arm]["halted"] is not None for r in runs) for arm in ARMS},
        "tuned_weight_decays": dict(Counter(f"{r['tuned']['weight_decay']:g}" for r in runs)),
        "tuned_early_epochs": sorted(r["tuned_early"]["epoch"] for r in runs if r["tuned_early"]["epoch"] is not None),
        "shape": {
            "widths": dict(modal),
            "seeds": count,
            "static_test_accuracy_mean": round(statistics.fmean(acc(at_modal, "static")), 2),
            "tuned_test_accuracy_mean": round(statistics.fmean(acc(at_modal, "tuned")), 2),
            "tuned_early_test_accuracy_mean": round(statistics.fmean(acc(at_modal, "tuned_early")), 2),
            "grown_test_accuracy_mean": round(statistics.fmean(acc(at_modal, "grown")), 2),
            "grown_test_accuracy_sd": round(statistics.stdev(acc(at_modal, "grown")), 2) if count > 1 else 0.0,
        },
        "other_shapes": [
            {
                "seed": r["seed"],
                "widths": r["widths"],
                "grown_minus_static": round(r["grown"]["test_acc"] - r["static"]["test_acc"], 2),
            }
            for r in runs
            if tuple(sorted(r["widths"].items())) != modal
        ],
        "train_flops_mean": {arm: statistics.fmean(r[arm]["train_flops"] for r in runs) for arm in ARMS},
        "runs": list(runs),
    }


def check_seeds(*, seeds: int, first_seed: int, workers: int) -> None:
    """Refuse, before any work, seeds that chose something measured here, or too few to pair."""
    if first_seed < 20:
        raise ValueError(
            f"--first-seed {first_seed}: seeds 0-19 chose the main job's schedule and the recipes' thresholds "
            "and trained their frontiers; start at 20 or later so that nothing measured here was chosen on the same seeds"
        )
    if seeds < 2:
        raise ValueError(f"--seeds {seeds}: the paired interval needs at least 2 seeds")
    if workers < 1:
        raise ValueError(f"--workers {workers}: at least 1 (1 runs the seeds in this process)")


def run(*, subject: Subject, seeds: int, first_seed: int, workers: int, data_per_seed: bool) -> dict[str, Any]:
    """Every seed's arms (``workers`` processes), summarised."""
    check_seeds(seeds=seeds, first_seed=first_seed, workers=workers)
    job = functools.partial(run_seed, subject=subject, data_per_seed=data_per_seed, weight_decays=WEIGHT_DECAYS)
    order = range(first_seed, first_seed + seeds)
    if workers <= 1:
        runs = [job(s) for s in order]
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            runs = list(pool.map(job, order))
    return summarise(runs, subject=subject, data_per_seed=data_per_seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="mnist1d-cnn-grown", choices=RECIPES)
    parser.add_argument("--policy", default=None, choices=POLICIES, help="default: the recipe's own")
    parser.add_argument(
        "--default-heuristic", action="store_true", help="the rule HeuristicConfig() ships, not the recipe's thresholds"
    )
    parser.add_argument(
        "--grow-until", type=float, default=1.0, help="germinate nothing after this share of the run (default: 1.0)"
    )
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--data-per-seed", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    # Every argument checked before the first of ~160 episodes runs.
    try:
        subject = Subject(
            recipe=args.recipe, policy=args.policy, default_heuristic=args.default_heuristic, grow_until=args.grow_until
        )
        check_seeds(seeds=args.seeds, first_seed=args.first_seed, workers=args.workers)
    except ValueError as e:
        parser.error(str(e))
    result = run(
        subject=subject,
        seeds=args.seeds,
        first_seed=args.first_seed,
        workers=args.workers,
        data_per_seed=args.data_per_seed,
    )
    print(save_json({k: v for k, v in result.items() if k != "runs"}, None))
    save_json(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
