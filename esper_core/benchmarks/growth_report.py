"""The growth benchmark's statistics, table and plot, from the runs ``esper_core.benchmarks.growth`` made.

Every comparison is paired by seed (the arms of one seed share initialisation, data order and
test set): differences in accuracy points with a paired-bootstrap 95 % interval
(``esper_core.telemetry.paired``). A grown network is scored against the static frontier at its
own parameter count: the frontier's accuracy of the same seed, interpolated linearly in
log(parameters) between the two frontier widths around it (clamped at the ends, and counted as
``extrapolated``). Interpolation rather than a static host trained at each grown size: grown sizes
differ per seed and arm, so matching each would cost a run per (seed, arm), while the frontier is
trained once per seed and is what the plot shows anyway.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from esper_core.run.episodes import EpisodeResult
from esper_core.telemetry.paired import paired_difference
from esper_core.telemetry.plots import figure_png

GOAL_MARGIN_POINTS = 0.3
GROWING_ARMS = ("heuristic", "gnn", "random", "periodic")
ARMS = ("none", *GROWING_ARMS)
PAIRS = {
    "learned_minus_heuristic": ("gnn", "heuristic"),
    "learned_minus_random": ("gnn", "random"),
    "learned_minus_periodic": ("gnn", "periodic"),
    "learned_minus_none": ("gnn", "none"),
    "heuristic_minus_none": ("heuristic", "none"),
}
"""Paired entries between arms: name -> (a, b), reported as a - b."""


def accuracy_points(run: EpisodeResult) -> float:
    """Test accuracy in percentage points."""
    return 100.0 * run.test_accuracy


def static_same_params(frontier: Sequence[EpisodeResult], params: int) -> tuple[float, bool]:
    """Accuracy of the static frontier (one seed's runs) at ``params``, and whether it was clamped.

    Linear in log(parameters) between the two nearest frontier points; widths that round to the
    same size are averaged.
    """
    by_size: dict[int, list[float]] = {}
    for run in frontier:
        by_size.setdefault(run.total_params, []).append(accuracy_points(run))
    sizes = sorted(by_size)
    acc = [statistics.fmean(by_size[s]) for s in sizes]
    outside = params < sizes[0] or params > sizes[-1]
    value = float(np.interp(math.log(params), [math.log(s) for s in sizes], acc))
    return value, outside


def summarise_recipe(arms: Mapping[str, list[EpisodeResult]], frontier: Mapping[float, list[EpisodeResult]]) -> dict:
    """Per-arm means, the frontier and the paired entries of one recipe."""
    seeds = [r.seed for r in arms["none"]]
    for name, runs in (*arms.items(), *((f"width {w:g}", r) for w, r in frontier.items())):
        if [r.seed for r in runs] != seeds:
            raise ValueError(f"arm {name} ran seeds {[r.seed for r in runs]}, expected {seeds}: runs are not paired")
    acc = {arm: [accuracy_points(r) for r in runs] for arm, runs in arms.items()}
    paired = {name: paired_difference(acc[a], acc[b]).as_dict() for name, (a, b) in PAIRS.items()}
    per_seed_frontier = [[frontier[w][i] for w in frontier] for i in range(len(seeds))]
    for arm in GROWING_ARMS:
        statics, clamped = zip(
            *(static_same_params(per_seed_frontier[i], r.total_params) for i, r in enumerate(arms[arm])), strict=True
        )
        name = "learned" if arm == "gnn" else arm
        entry = paired_difference(acc[arm], list(statics)).as_dict()
        entry["extrapolated"] = sum(clamped)
        paired[f"{name}_minus_static_same_params"] = entry
    learned_static = paired["learned_minus_static_same_params"]
    goals = {
        "learned_beats_heuristic": paired["learned_minus_heuristic"]["ci95_low"] > 0,
        "learned_beats_random": paired["learned_minus_random"]["ci95_low"] > 0,
        f"learned_within_{GOAL_MARGIN_POINTS}_of_static_same_params": learned_static["ci95_low"] > -GOAL_MARGIN_POINTS,
    }
    goals["met"] = all(goals.values())
    return {
        "seeds": seeds,
        "arms": {arm: _arm_summary(runs) for arm, runs in arms.items()},
        "frontier": [{"width": w, **_arm_summary(runs)} for w, runs in sorted(frontier.items())],
        "paired": paired,
        "goals": goals,
    }


def _arm_summary(runs: Sequence[EpisodeResult]) -> dict[str, Any]:
    acc = [accuracy_points(r) for r in runs]
    return {
        "test_acc_mean": statistics.fmean(acc),
        "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        "params_mean": statistics.fmean(r.total_params for r in runs),
        "flops_mean": statistics.fmean(r.forward_flops for r in runs),
        "wall_s_mean": statistics.fmean(r.wall_s for r in runs),
        "runs": [
            {
                "seed": r.seed,
                "test_acc": accuracy_points(r),
                "params": r.total_params,
                "flops": r.forward_flops,
                "wall_s": r.wall_s,
                "commands": r.commands,
            }
            for r in runs
        ],
    }


def format_table(result: dict[str, Any]) -> str:
    """The human-readable report of ``esper_core.benchmarks.growth.run``'s result."""
    policy = result["policy"]
    lines = [
        f"growth on {result['device']}, plan {result['plan']}: {len(result['seeds'])} paired seeds, "
        f"epochs {result['epochs'] or 'recipe default'}, lr schedule {result['lr_schedule']}; "
        f"GNN policy v{policy['version']} ({policy['method']}, trained in {policy['training_s']:.0f} s); "
        f"wall {result['wall_s']:.0f} s",
    ]
    for recipe, r in result["results"].items():
        lines += ["", f"## {recipe}", "", "| arm | test acc % (mean ± std) | params | FLOPs/sample | wall s |"]
        lines.append("|---|---:|---:|---:|---:|")
        rows = [(arm, s) for arm, s in r["arms"].items()] + [(f"static x{f['width']:g}", f) for f in r["frontier"]]
        for name, s in rows:
            lines.append(
                f"| {name} | {s['test_acc_mean']:.2f} ± {s['test_acc_std']:.2f} | {s['params_mean']:.0f} | "
                f"{s['flops_mean']:.0f} | {s['wall_s_mean']:.2f} |"
            )
        lines += ["", "| paired difference (points) | mean | 95 % CI | n |", "|---|---:|---:|---:|"]
        for name, d in r["paired"].items():
            extra = f" ({d['extrapolated']} clamped)" if d.get("extrapolated") else ""
            lines.append(
                f"| {name} | {d['mean']:+.2f} | [{d['ci95_low']:+.2f}, {d['ci95_high']:+.2f}]{extra} | {d['n']} |"
            )
        goals = r["goals"]
        checks = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in goals.items() if k != "met")
        lines += ["", f"goal on {recipe}: {'met' if goals['met'] else 'not met'} ({checks})"]
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
        for row, (key, label) in enumerate((("params_mean", "parameters"), ("flops_mean", "FLOPs per sample"))):
            ax = axes[row][col]
            xs = [f[key] for f in r["frontier"]]
            ys = [f["test_acc_mean"] for f in r["frontier"]]
            err = [_ci_half(f) for f in r["frontier"]]
            ax.errorbar(xs, ys, yerr=err, color="tab:blue", marker=".", capsize=3, label="static frontier")
            for f in r["frontier"]:
                ax.annotate(f"x{f['width']:g}", (f[key], f["test_acc_mean"]), fontsize=7, xytext=(3, -9),
                            textcoords="offset points")  # fmt: skip
            for arm, s in r["arms"].items():
                color, marker = _ARM_STYLE.get(arm, ("gray", "o"))
                ax.errorbar(
                    [s[key]], [s["test_acc_mean"]], yerr=[_ci_half(s)], color=color, marker=marker,
                    markersize=9, capsize=3, linestyle="none", label=arm,
                )  # fmt: skip
            ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("test accuracy (%)")
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(f"{recipe} ({len(r['seeds'])} seeds)")
                ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return figure_png(fig)


def _ci_half(summary: Mapping[str, Any]) -> float:
    """Half-width of a normal 95 % interval of the mean (for error bars only; paired CIs are the test)."""
    n = len(summary["runs"])
    return 1.96 * summary["test_acc_std"] / math.sqrt(n) if n > 1 else 0.0
