"""headroom: how much could any fixed growth schedule gain over the heuristic?

Before a learned controller is trusted to find better growth, measure what there is to find.
For one recipe, every fixed schedule of a small family (one germination: slot x blueprint x
epoch; or every slot with one blueprint, one epoch apart) runs on Simic's training seeds (the
seeds a learned policy may learn from), beside the heuristic and no growth on the same seeds.
The schedule with the best mean test accuracy there is the **best fixed schedule in hindsight**.

Choosing the best of many on the same seeds biases its margin upward (the winner's curse), so
the chosen schedule is then run on held-out seeds (the growth benchmark's evaluation seeds
``0 .. k-1``), paired against the heuristic and no growth with bootstrap 95 % intervals. The
held-out ``best_minus_heuristic`` is the headroom a learned controller can claim; if its interval
includes zero, no schedule this family can express beats the heuristic measurably, and the
report says so.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esper_core.karn.entries import default_catalog
from esper_core.run.plan import plan_run
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, count_halted, episode_config, run_episode
from esper_core.studies.growth import compile_kernels, fresh_run_id, in_home
from esper_core.studies.schedule_search import GERMINATION_POINTS, Schedule, candidate_schedules, schedule_name
from esper_core.studies.simic_train import get_plan
from esper_core.telemetry.paired import paired_difference

Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: called after every run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HeadroomPlan:
    """How big a headroom measurement is.

    Attributes:
        train_seeds: Simic training seeds the schedules are ranked on (from Simic's first seed).
        holdout_seeds: Evaluation seeds (0, 1, ...) the chosen schedule is confirmed on.
        epochs: Epochs per run (None: the recipe's).
        at: Germination points, as fractions of the run (0: after the first epoch).
    """

    train_seeds: int
    holdout_seeds: int
    epochs: int | None
    at: tuple[float, ...]


PLANS: dict[str, HeadroomPlan] = {
    # What CI runs: seconds per run.
    "smoke": HeadroomPlan(train_seeds=2, holdout_seeds=2, epochs=3, at=(0.0,)),
    # The family Simic's search plan searches too (``GERMINATION_POINTS``).
    "default": HeadroomPlan(train_seeds=4, holdout_seeds=10, epochs=None, at=GERMINATION_POINTS),
}


@dataclass(kw_only=True, slots=True)
class HeadroomConfig:
    """Options of the headroom measurement.

    Attributes:
        recipe: Recipe to grow (a built-in name or an import path).
        plan: Name of a ``HeadroomPlan`` in ``PLANS``.
        train_seeds: Override the plan's number of training seeds (>= 2).
        holdout_seeds: Override the plan's number of held-out seeds (>= 2).
        home: ESPER_HOME to use (default: a temporary one; reuse one to skip compiling kernels).
        device: Where runs train.
    """

    recipe: str = "mnist1d-cnn"
    plan: str = "default"
    train_seeds: int | None = None
    holdout_seeds: int | None = None
    home: Path | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ValueError(f"unknown headroom plan {self.plan!r}; choose one of {sorted(PLANS)}")
        for name in ("train_seeds", "holdout_seeds"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise ValueError(f"{name} must be >= 2 (a paired confidence interval needs two), got {value}")
        first = get_plan("default").first_seed
        if self.headroom_plan.holdout_seeds > first:
            raise ValueError(
                f"held-out seeds 0..{self.headroom_plan.holdout_seeds - 1} would overlap Simic's from {first}"
            )
        get_recipe(self.recipe)  # an unknown recipe fails here, before any kernel is compiled

    @property
    def headroom_plan(self) -> HeadroomPlan:
        """The named plan with this config's overrides."""
        plan = PLANS[self.plan]
        return dataclasses.replace(
            plan,
            train_seeds=self.train_seeds or plan.train_seeds,
            holdout_seeds=self.holdout_seeds or plan.holdout_seeds,
        )


def run(config: HeadroomConfig, *, progress: Progress | None = None) -> dict[str, Any]:
    """Measure the headroom; returns the ranking, the best schedule and the paired differences."""
    with in_home(config.home, prefix="esper-headroom-") as home:
        return _run_in(config, home, progress)


def _run_in(config: HeadroomConfig, home: Path, progress: Progress | None) -> dict[str, Any]:
    report = progress or (lambda _what, _done, _total: None)
    plan = config.headroom_plan
    settings = EsperSettings(home=home)
    start = time.perf_counter()
    compile_kernels(settings, (config.recipe,), config.device)
    recipe = get_recipe(config.recipe, epochs=plan.epochs)
    schedules = candidate_schedules(recipe, plan_run(recipe, catalog=default_catalog()), plan.at)
    first = get_plan("default").first_seed
    train_seeds = list(range(first, first + plan.train_seeds))
    holdout_seeds = list(range(plan.holdout_seeds))
    total = len(train_seeds) * (len(schedules) + 2) + len(holdout_seeds) * 3
    done = 0

    def episode(seed: int, policy: str, schedule: Schedule = ()) -> EpisodeResult:
        nonlocal done
        run_config = episode_config(
            config.recipe,
            seed=seed,
            policy=policy,
            epochs=plan.epochs,
            device=config.device,
            lr_schedule="cosine",
            schedule=schedule,
        )
        name = schedule_name(schedule) if schedule else policy
        result = run_episode(run_config, settings=settings, run_id=fresh_run_id(settings, f"headroom-s{seed}-{name}"))
        done += 1
        report(f"seed {seed}: {name}", done, total)
        return result

    train = {
        "none": [episode(s, "none") for s in train_seeds],
        "heuristic": [episode(s, "heuristic") for s in train_seeds],
    }
    for schedule in schedules:
        train[schedule_name(schedule)] = [episode(s, "scheduled", schedule) for s in train_seeds]
    ranking = sorted(
        (name for name in train if name not in ("none", "heuristic")),
        key=lambda n: (-_mean(train[n]), statistics.fmean(r.total_params for r in train[n])),
    )
    best = next(s for s in schedules if schedule_name(s) == ranking[0])
    holdout = {
        "none": [episode(s, "none") for s in holdout_seeds],
        "heuristic": [episode(s, "heuristic") for s in holdout_seeds],
        "best": [episode(s, "scheduled", best) for s in holdout_seeds],
    }
    train_best = train[ranking[0]]
    return {
        "bench": "headroom",
        "recipe": config.recipe,
        "plan": config.plan,
        "epochs": recipe.epochs,
        "device": config.device,
        "train_seeds": train_seeds,
        "holdout_seeds": holdout_seeds,
        "schedules_searched": len(schedules),
        "best_schedule": ranking[0],
        "ranking": [{"schedule": n, **_summary(train[n])} for n in [*ranking, "heuristic", "none"]],
        "train": _paired(train_best, train["heuristic"], train["none"]),
        "holdout": {
            "arms": {arm: _summary(runs) for arm, runs in holdout.items()},
            **_paired(holdout["best"], holdout["heuristic"], holdout["none"]),
        },
        "verdict": _verdict(_paired(holdout["best"], holdout["heuristic"], holdout["none"])),
        "wall_s": time.perf_counter() - start,
    }


def _points(runs: list[EpisodeResult]) -> list[float]:
    return [100.0 * r.test_accuracy for r in runs]


def _mean(runs: list[EpisodeResult]) -> float:
    return statistics.fmean(_points(runs))


def _summary(runs: list[EpisodeResult]) -> dict[str, Any]:
    return {
        "test_acc_mean": _mean(runs),
        "params_mean": statistics.fmean(r.total_params for r in runs),
        "per_seed": _points(runs),
        "commands": [r.commands for r in runs],
        # Halted runs stay in their pairs, scored at their last commit (run_episode).
        "halted": count_halted(runs),
    }


def _paired(best: list[EpisodeResult], heuristic: list[EpisodeResult], none: list[EpisodeResult]) -> dict[str, Any]:
    return {
        "best_minus_heuristic": paired_difference(_points(best), _points(heuristic)).as_dict(),
        "best_minus_none": paired_difference(_points(best), _points(none)).as_dict(),
        "heuristic_minus_none": paired_difference(_points(heuristic), _points(none)).as_dict(),
    }


def _verdict(paired: dict[str, Any]) -> str:
    d = paired["best_minus_heuristic"]
    interval = f"{d['mean']:+.2f} points, 95 % CI [{d['ci95_low']:+.2f}, {d['ci95_high']:+.2f}]"
    if d["ci95_low"] > 0:
        return f"headroom: the best fixed schedule beats the heuristic on held-out seeds by {interval}"
    if d["ci95_high"] < 0:
        return f"no headroom: the heuristic beats the best fixed schedule on held-out seeds ({interval})"
    return f"no measurable headroom: best fixed schedule minus heuristic on held-out seeds is {interval}"


def format_table(result: dict[str, Any]) -> str:
    """The human-readable report of ``run``'s result."""
    lines = [
        f"headroom on {result['recipe']} ({result['device']}, plan {result['plan']}, {result['epochs']} epochs): "
        f"{result['schedules_searched']} schedules on training seeds {result['train_seeds']}, the best confirmed on "
        f"{len(result['holdout_seeds'])} held-out seeds; wall {result['wall_s']:.0f} s",
        "",
        "| schedule (training seeds) | test acc % | params |",
        "|---|---:|---:|",
    ]
    lines += [f"| {r['schedule']} | {r['test_acc_mean']:.2f} | {r['params_mean']:.0f} |" for r in result["ranking"]]
    lines += ["", "| paired difference (points) | seeds | mean | 95 % CI |", "|---|---|---:|---:|"]
    for where in ("train", "holdout"):
        for name in ("best_minus_heuristic", "best_minus_none", "heuristic_minus_none"):
            d = result[where][name]
            lines.append(f"| {name} | {where} | {d['mean']:+.2f} | [{d['ci95_low']:+.2f}, {d['ci95_high']:+.2f}] |")
    return "\n".join([*lines, "", result["verdict"]])


def cli(args: Any, *, progress: Progress | None = None) -> int:  # noqa: ANN401  (argparse.Namespace)
    """``esper bench headroom``: print the table (``--json``: one JSON object)."""
    result = run(
        HeadroomConfig(
            recipe=args.recipe,
            plan=args.plan,
            train_seeds=args.train_seeds,
            holdout_seeds=args.holdout_seeds,
            home=args.home,
            device=args.device,
        ),
        progress=progress,
    )
    if args.save_baseline is not None:
        directory = Path(args.save_baseline)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "headroom.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


__all__ = ["PLANS", "HeadroomConfig", "HeadroomPlan", "cli", "run"]
