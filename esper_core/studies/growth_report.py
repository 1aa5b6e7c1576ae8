"""The growth benchmark's statistics, table and plot, from the runs ``esper_core.studies.growth`` made.

Every comparison is paired by seed (the arms of one seed share initialisation, data order and
test set): differences in the recipe's metric (accuracy points, or bits per character for a
language model, where lower is better) with a paired-bootstrap 95 % interval
(``esper_core.telemetry.paired``). A grown network is scored against the static frontier at its
own parameter count: the frontier's accuracy of the same seed, interpolated linearly in
log(parameters) between the two frontier widths around it (clamped at the ends, and counted as
``extrapolated``). Interpolation rather than a static host trained at each grown size: grown sizes
differ per seed and arm, so matching each would cost a run per (seed, arm), while the frontier is
trained once per seed and is what the plot shows anyway.

A run that halted (``EpisodeResult.halted``) keeps its seed's pair, scored at its last commit
(``episodes.run_episode``); each arm and frontier width counts its halted runs (``halted``), and the
table says which arms had any.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from esper_core.studies.arms import GROWING_ARMS
from esper_core.studies.episodes import EpisodeResult, count_halted
from esper_core.telemetry.paired import paired_difference
from esper_core.telemetry.plots import figure_png

GOAL_MARGIN_POINTS = 0.3
"""The accuracy goal's margin (``ACCURACY.goal_margin``)."""
PAIRS = {
    "learned_minus_heuristic": ("gnn", "heuristic"),
    "learned_minus_random": ("gnn", "random"),
    "learned_minus_periodic": ("gnn", "periodic"),
    "learned_minus_none": ("gnn", "none"),
    "heuristic_minus_none": ("heuristic", "none"),
}
"""Paired entries between arms: name -> (a, b), reported as a - b."""
GOAL_ARMS = ("gnn", "heuristic", "random")
"""The arms the goals compare (with the static frontier, which always runs)."""


def accuracy_points(run: EpisodeResult) -> float:
    """Test accuracy in percentage points."""
    return 100.0 * run.test_accuracy


def bits_per_target(run: EpisodeResult) -> float:
    """Test cross-entropy in bits per target (a language model's bits per character)."""
    return run.test_loss / math.log(2)


@dataclass(frozen=True, kw_only=True, slots=True)
class Metric:
    """What the benchmark scores a run by.

    Attributes:
        key: Prefix of the summary's keys (``<key>_mean``, ``<key>_std``, per run ``<key>``).
        label: Axis and table label.
        higher_is_better: Accuracy (True) or a loss (False): the paired entries and goals read
            their intervals in that direction.
        goal_margin: How much worse than the static network of the same size a grown one may be.
        value: The run's score.
    """

    key: str
    label: str
    higher_is_better: bool
    goal_margin: float
    value: Callable[[EpisodeResult], float]


ACCURACY = Metric(
    key="test_acc",
    label="test accuracy (%)",
    higher_is_better=True,
    goal_margin=GOAL_MARGIN_POINTS,
    value=accuracy_points,
)
BITS_PER_CHAR = Metric(
    key="test_bits", label="test bits per character", higher_is_better=False, goal_margin=0.02, value=bits_per_target
)


def static_same_params(frontier: Sequence[EpisodeResult], params: int, metric: Metric = ACCURACY) -> tuple[float, bool]:
    """The metric of the static frontier (one seed's runs) at ``params``, and whether it was clamped.

    Linear in log(parameters) between the two nearest frontier points; widths that round to the
    same size are averaged.
    """
    by_size: dict[int, list[float]] = {}
    for run in frontier:
        by_size.setdefault(run.total_params, []).append(metric.value(run))
    sizes = sorted(by_size)
    acc = [statistics.fmean(by_size[s]) for s in sizes]
    outside = params < sizes[0] or params > sizes[-1]
    value = float(np.interp(math.log(params), [math.log(s) for s in sizes], acc))
    return value, outside


def summarise_recipe(
    arms: Mapping[str, list[EpisodeResult]],
    frontier: Mapping[float, list[EpisodeResult]],
    metric: Metric = ACCURACY,
) -> dict:
    """Per-arm means, the frontier and the paired entries of one recipe, scored by ``metric``."""
    seeds = [r.seed for r in arms["none"]]
    for name, runs in (*arms.items(), *((f"width {w:g}", r) for w, r in frontier.items())):
        if [r.seed for r in runs] != seeds:
            raise ValueError(f"arm {name} ran seeds {[r.seed for r in runs]}, expected {seeds}: runs are not paired")
    acc = {arm: [metric.value(r) for r in runs] for arm, runs in arms.items()}
    direction = metric.higher_is_better
    diffs = {
        name: paired_difference(acc[a], acc[b], higher_is_better=direction)
        for name, (a, b) in PAIRS.items()
        if a in arms and b in arms
    }
    per_seed_frontier = [[frontier[w][i] for w in frontier] for i in range(len(seeds))]
    clamped_by: dict[str, int] = {}
    for arm in (a for a in GROWING_ARMS if a in arms):
        statics, clamped = zip(
            *(static_same_params(per_seed_frontier[i], r.total_params, metric) for i, r in enumerate(arms[arm])),
            strict=True,
        )
        name = "learned" if arm == "gnn" else arm
        diffs[f"{name}_minus_static_same_params"] = paired_difference(
            acc[arm], list(statics), higher_is_better=direction
        )
        clamped_by[f"{name}_minus_static_same_params"] = sum(clamped)
    margin = metric.goal_margin
    # The goals are the learned policy's: judged only when every arm they compare ran.
    goals: dict[str, bool] = {}
    if all(a in arms for a in GOAL_ARMS):
        goals = {
            "learned_beats_heuristic": diffs["learned_minus_heuristic"].better(),
            "learned_beats_random": diffs["learned_minus_random"].better(),
            f"learned_within_{margin:g}_of_static_same_params": diffs["learned_minus_static_same_params"].non_inferior(
                margin
            ),
        }
        goals["met"] = all(goals.values())
    paired = {
        name: d.as_dict() | ({"extrapolated": clamped_by[name]} if name in clamped_by else {})
        for name, d in diffs.items()
    }
    return {
        "metric": metric.key,
        "metric_label": metric.label,
        "higher_is_better": metric.higher_is_better,
        "seeds": seeds,
        "arms": {arm: _arm_summary(runs, metric) for arm, runs in arms.items()},
        "frontier": [{"width": w, **_arm_summary(runs, metric)} for w, runs in sorted(frontier.items())],
        "paired": paired,
        "goals": goals,
    }


def _arm_summary(runs: Sequence[EpisodeResult], metric: Metric = ACCURACY) -> dict[str, Any]:
    acc = [metric.value(r) for r in runs]
    key = metric.key
    return {
        f"{key}_mean": statistics.fmean(acc),
        f"{key}_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        "params_mean": statistics.fmean(r.total_params for r in runs),
        "flops_mean": statistics.fmean(r.forward_flops for r in runs),
        # What training cost: a grown network trains small first (EpisodeResult.train_flops).
        "train_flops_mean": statistics.fmean(r.train_flops for r in runs),
        "wall_s_mean": statistics.fmean(r.wall_s for r in runs),
        "halted": count_halted(runs),
        "runs": [
            {
                "seed": r.seed,
                key: metric.value(r),
                "params": r.total_params,
                "flops": r.forward_flops,
                "train_flops": r.train_flops,
                "wall_s": r.wall_s,
                "commands": r.commands,
                "halted": r.halted,
            }
            for r in runs
        ],
    }


def _phases(result: dict[str, Any]) -> str:
    """`` (kernels 5 s, evaluation 745 s on 2 workers)``; empty for results saved before these
    were recorded."""
    if "evaluation_s" not in result:
        return ""
    fan_out = result["fan_out"]
    where = (
        f"on {fan_out['dask_address']}"
        if fan_out["dask_address"]
        else f"on {fan_out['workers']} workers"
        if fan_out["workers"]
        else "in this process"
    )
    return f" (kernels {result['kernel_compile_s']:.0f} s, evaluation {result['evaluation_s']:.0f} s {where})"


def format_table(result: dict[str, Any]) -> str:
    """The human-readable report of ``esper_core.studies.growth.run``'s result."""
    policy = result["policy"]
    learned = (
        "no learned arm"
        if policy is None
        else f"GNN policy v{policy['version']} ({policy['method']}, trained in {policy['training_s']:.0f} s)"
    )
    lines = [
        f"growth on {result['device']}, plan {result['plan']}: {len(result['seeds'])} paired seeds, "
        f"epochs {result['epochs'] or 'recipe default'}, lr schedule {result['lr_schedule']}; "
        f"{learned}; wall {result['wall_s']:.0f} s{_phases(result)}",
    ]
    for recipe, r in result["results"].items():
        key = r.get("metric", ACCURACY.key)
        label = r.get("metric_label", ACCURACY.label)
        lines += [
            "",
            f"## {recipe}",
            "",
            f"| arm | {label} (mean ± std) | params | FLOPs/sample | training FLOPs | wall s |",
        ]
        lines.append("|---|---:|---:|---:|---:|---:|")
        rows = [(arm, s) for arm, s in r["arms"].items()] + [(f"static x{f['width']:g}", f) for f in r["frontier"]]
        for name, s in rows:
            lines.append(
                f"| {name} | {s[f'{key}_mean']:.3f} ± {s[f'{key}_std']:.3f} | {s['params_mean']:.0f} | "
                f"{s['flops_mean']:.0f} | {s.get('train_flops_mean', 0):.3g} | {s['wall_s_mean']:.2f} |"
            )
        # .get: results saved before halted runs were counted have no count (none halted: it raised).
        if halted := [f"{name} {s['halted']}" for name, s in rows if s.get("halted")]:
            lines += ["", f"halted runs (scored at their last commit, kept in their pairs): {', '.join(halted)}"]
        better = "higher" if r.get("higher_is_better", True) else "lower"
        lines += ["", f"| paired difference ({better} is better) | mean | 95 % CI | n |", "|---|---:|---:|---:|"]
        for name, d in r["paired"].items():
            extra = f" ({d['extrapolated']} clamped)" if d.get("extrapolated") else ""
            lines.append(
                f"| {name} | {d['mean']:+.3f} | [{d['ci95_low']:+.3f}, {d['ci95_high']:+.3f}]{extra} | {d['n']} |"
            )
        goals = r["goals"]
        if goals:
            checks = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in goals.items() if k != "met")
            lines += ["", f"goal on {recipe}: {'met' if goals['met'] else 'not met'} ({checks})"]
        else:
            lines += ["", f"goal on {recipe}: not judged (the learned, heuristic and random arms did not all run)"]
    return "\n".join(lines)


_ARM_STYLE = {
    "none": ("black", "s"),
    "heuristic": ("tab:orange", "o"),
    "gnn": ("tab:green", "*"),
    "random": ("tab:red", "v"),
    "periodic": ("tab:purple", "D"),
}


def frontier_png(result: dict[str, Any]) -> bytes:
    """Accuracy against parameters (top row) and FLOPs (bottom row) per recipe: the static
    frontier as a line with its seed spread, every arm as a point with a 95 % interval of its mean."""
    recipes = list(result["results"])
    fig = Figure(figsize=(5.0 * len(recipes), 7.5))
    axes = fig.subplots(2, len(recipes), squeeze=False)
    for col, recipe in enumerate(recipes):
        r = result["results"][recipe]
        score = r.get("metric", ACCURACY.key)
        for row, (key, label) in enumerate((("params_mean", "parameters"), ("flops_mean", "FLOPs per sample"))):
            ax = axes[row][col]
            xs = [f[key] for f in r["frontier"]]
            ys = [f[f"{score}_mean"] for f in r["frontier"]]
            err = [_ci_half(f, score) for f in r["frontier"]]
            ax.errorbar(xs, ys, yerr=err, color="tab:blue", marker=".", capsize=3, label="static frontier")
            for f in r["frontier"]:
                ax.annotate(f"x{f['width']:g}", (f[key], f[f"{score}_mean"]), fontsize=7, xytext=(3, -9),
                            textcoords="offset points")  # fmt: skip
            for arm, s in r["arms"].items():
                color, marker = _ARM_STYLE.get(arm, ("gray", "o"))
                ax.errorbar(
                    [s[key]], [s[f"{score}_mean"]], yerr=[_ci_half(s, score)], color=color, marker=marker,
                    markersize=9, capsize=3, linestyle="none", label=arm,
                )  # fmt: skip
            ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel(r.get("metric_label", ACCURACY.label))
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(f"{recipe} ({len(r['seeds'])} seeds)")
                ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return figure_png(fig)


def _ci_half(summary: Mapping[str, Any], score: str = ACCURACY.key) -> float:
    """Half-width of a normal 95 % interval of the mean (for error bars only; paired CIs are the test)."""
    n = len(summary["runs"])
    return 1.96 * summary[f"{score}_std"] / math.sqrt(n) if n > 1 else 0.0
