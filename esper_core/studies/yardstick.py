"""The yardstick a growing arm is paired with on zoo members: the static network of its grown shape.

Shared by the transfer benchmark (``transfer``: a held-out policy) and the rule search (``rules``:
a fixed rule). For each member of a family drawn under an evaluation zoo seed
(``evaluated_members``) and each evaluation seed, an ``ArmRunner`` runs the arms on the same data,
data order and initial host; ``ArmRunner.shape_matched`` adds the ``static`` arm (the host at the
grown widths, trained from scratch) and the ``tuned`` one (that network with its weight decay
chosen on validation). ``summarise_arms`` reads each family's scores, paired differences with BCa
95 % intervals and the goal against the tuned network; ``arms_png`` and ``format_arms`` show them.

A run that halted (``EpisodeResult.halted``) stays in its pair, scored at its last commit
(``episodes.run_episode``): each arm's summary counts its halted runs (``halted``), each run says
why, and ``format_arms`` prints a line when any arm has one.

Width slots only (``check_evaluation``): the static network of a grown shape is then the host at
other widths; a branch seed's module has no static counterpart defined here.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from matplotlib.figure import Figure
from torch import nn

from esper_core.data import load_dataset
from esper_core.run.config import ModelSpec
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, count_halted, episode_config, run_episode
from esper_core.studies.growth import fresh_run_id
from esper_core.studies.growth_report import ACCURACY, BITS_PER_CHAR, Metric
from esper_core.studies.width_control import at_widths
from esper_core.studies.zoo_train import ZooTraining, zoo_members
from esper_core.tamiyo.config import TamiyoGNNConfig
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.telemetry.paired import paired_difference
from esper_core.telemetry.plots import figure_png
from esper_core.zoo import Family, ZooMember

GOAL_POINTS = 0.5
"""Held-out minus tuned may be this much worse at its interval's lower bound (accuracy points)."""
GOAL_BITS = 0.01
"""The same for a language model, in bits per character (upper bound)."""


def arms_around(subject: str) -> tuple[str, ...]:
    """The arms of an evaluated (member, seed) around the growing arm ``subject``, in report
    order: it, the default heuristic, no growth, and the static network of its grown shape
    untuned and tuned."""
    return (subject, "heuristic", "none", "static", "tuned")


def pairs_around(subject: str) -> tuple[tuple[str, str], ...]:
    """The paired differences ``a - b`` reported around ``subject``: it against every other arm,
    and the heuristic against the tuned static network and no growth."""
    return (
        (subject, "tuned"),
        (subject, "static"),
        (subject, "heuristic"),
        (subject, "none"),
        ("heuristic", "tuned"),
        ("heuristic", "none"),
    )


def check_evaluation(
    training: ZooTraining,
    *,
    eval_zoo_seed: int,
    eval_members: int,
    seeds: int,
    weight_decays: Sequence[float],
    workers: int,
) -> None:
    """Refuse, with the fix, an evaluation against static networks of a grown shape that cannot be
    run honestly: members drawn under the zoo's own seed (the hosts a policy or a rule was chosen
    on), slots other than width (no static counterpart), fewer than two paired seeds or more than
    the training reserves for evaluation, a weight-decay grid without 0."""
    if eval_zoo_seed == training.zoo.seed:
        raise ValueError(
            f"eval_zoo_seed={eval_zoo_seed} is the zoo's own seed: the evaluated hosts would be ones a policy "
            "was trained or a rule searched on; pick another seed"
        )
    kinds = training.zoo.kinds
    if kinds != ("width",):
        raise ValueError(
            f"zoo.kinds={kinds}: the static arm is the host at the grown widths, defined for width "
            "slots only; set ZooSpec(kinds=('width',))"
        )
    if eval_members < 1:
        raise ValueError(f"eval_members must be >= 1, got {eval_members}")
    available = len(training.seeds.evaluation)
    if not 2 <= seeds <= available:
        raise ValueError(
            f"seeds must be 2..{available} (a paired interval needs two; the training reserves "
            f"{available} evaluation seeds), got {seeds}"
        )
    if 0.0 not in weight_decays or any(w < 0 for w in weight_decays) or len(set(weight_decays)) != len(weight_decays):
        raise ValueError(f"weight_decays must be distinct values >= 0 including 0.0, got {tuple(weight_decays)}")
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0: runs here, one thread), got {workers}")


def evaluated_members(
    training: ZooTraining, family: Family, *, eval_zoo_seed: int, eval_members: int
) -> list[ZooMember]:
    """The members of ``family`` an evaluation scores: hosts that no training or search of
    ``training``'s own zoo drew (``check_evaluation`` refuses its seed).

    Args:
        training: The zoo training (or search) whose zoo, but for its seed, the members come from.
        family: The family drawn.
        eval_zoo_seed: The zoo seed the members are drawn under.
        eval_members: How many.

    Returns:
        The first ``eval_members`` members of ``family`` under ``eval_zoo_seed``, in draw order.
    """
    zoo = dataclasses.replace(training.zoo, seed=eval_zoo_seed)
    others = tuple(f for f in zoo.families if f != family)
    return zoo_members(dataclasses.replace(training, zoo=zoo, members=eval_members, exclude_families=others))


def member_metric(member: ZooMember) -> Metric:
    """Bits per character for the language model (``chars``); accuracy for a classifier."""
    return BITS_PER_CHAR if member.language_model else ACCURACY


def static_shape(
    build: Callable[[], nn.Module], widths: Mapping[str, int], sample_shape: tuple[int, ...], input_dtype: torch.dtype
) -> nn.Module:
    """``build()``'s model with each named layer at its width, re-initialised as PyTorch builds
    it (``width_control.at_widths``; its norms too, whose resized entries are zero-padded)."""
    model = at_widths(build, dict(widths), sample_shape, input_dtype=input_dtype)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d | nn.GroupNorm | nn.LayerNorm):
            module.reset_parameters()
    return model


class ArmRunner:
    """Runs one member and seed under any arm's policy, host and weight decay, in one home: the
    arms of a pair share the member, the seed (data, data order, initial host) and the GNN's size."""

    def __init__(
        self,
        member: ZooMember,
        seed: int,
        settings: EsperSettings,
        *,
        label: str,
        device: str,
        gnn: TamiyoGNNConfig | None = None,
    ) -> None:
        self.member, self.seed, self.settings = member, seed, settings
        self.label, self.device, self.gnn = label, device, gnn

    def __call__(
        self,
        policy: str,
        tag: str,
        *,
        version: int | None = None,
        host: ModelSpec | None = None,
        weight_decay: float = 0.0,
        heuristic: HeuristicConfig | None = None,
    ) -> EpisodeResult:
        config = episode_config(
            self.member.recipe(), seed=self.seed, policy=policy, device=self.device, policy_version=version
        )
        if self.gnn is not None:
            config.tamiyo = dataclasses.replace(config.tamiyo, gnn=self.gnn)
        if heuristic is not None:
            config.tamiyo = dataclasses.replace(config.tamiyo, heuristic=heuristic)
        if host is not None:
            config = dataclasses.replace(config, host=host)
        if weight_decay:
            config.trainer = dataclasses.replace(config.trainer, weight_decay=weight_decay)
        run_id = fresh_run_id(self.settings, f"{self.label}-{self.member.name}-{tag}-s{self.seed}")
        return run_episode(config, settings=self.settings, run_id=run_id)

    def shape_matched(self, grown: Mapping[str, int], weight_decays: Sequence[float]) -> dict[str, Any]:
        """The ``static`` and ``tuned`` arms of a run that grew to ``grown`` (layer -> width): the
        host at those widths trained from scratch at each weight decay of the grid; ``tuned`` is
        the grid's best on validation (accuracy; a language model's loss), and its runs are its
        tuning cost. Not early-stopped: on the main job, choosing the stopping epoch on a
        1,000-signal validation split lowered the tuned network's test accuracy by 0.2 points
        (``early_stopped``; docs/growth-results.md), so the yardstick keeps the stronger arm."""
        recipe = self.member.recipe()
        host = recipe.host
        assert isinstance(host, ModelSpec), "a zoo member's host is a ModelSpec"
        shape = load_dataset(recipe.data).feature_shape
        static_host = dataclasses.replace(
            host, build=functools.partial(static_shape, host.build, grown, shape, host.input_dtype)
        )
        grid = {wd: self("none", f"static-wd{wd:g}", host=static_host, weight_decay=wd) for wd in weight_decays}
        best = best_on_validation(grid, language_model=self.member.language_model)
        return {
            "static": grid[0.0],
            "tuned": grid[best],
            "tuned_weight_decay": best,
            "tuning_flops": sum(r.train_flops for r in grid.values()),
            "tuning_wall_s": sum(r.wall_s for r in grid.values()),
            "widths": {"host": host_widths(host, list(grown)), "grown": dict(grown)},
        }


def early_stopped(result: EpisodeResult) -> EpisodeResult:
    """``result`` as early stopping would have left it: validation and test scores at its best
    validation epoch (``EpisodeResult.early_stop``), training FLOPs up to that epoch. Early
    stopping is one way to tune a static network's regularisation on validation
    (``bench/main_job.py`` measures it beside weight decay alone)."""
    e = result.early_stop
    if e is None:
        if result.halted is not None:
            return result  # halted before any epoch ended: scored at its last commit, as it stands
        raise ValueError(f"run {result.run_id} was not run with early_stopping=True: it has no early stop to read")
    return dataclasses.replace(
        result,
        val_accuracy=e.val_accuracy,
        val_loss=e.val_loss,
        test_accuracy=e.test_accuracy,
        test_loss=e.test_loss,
        train_flops=e.train_flops,
    )


def best_on_validation(grid: Mapping[float, EpisodeResult], *, language_model: bool) -> float:
    """The weight decay of ``grid`` (weight decay -> run) whose run did best on the validation
    split alone, the test split being read only after the choice: the highest accuracy, or a
    language model's lowest loss (its accuracy is 0); the first of a tie in the grid's order."""
    order = list(grid)
    return max(
        order, key=lambda wd: (-grid[wd].val_loss if language_model else grid[wd].val_accuracy, -order.index(wd))
    )


def host_widths(host: ModelSpec, layers: Sequence[str]) -> dict[str, int]:
    """Output units of each of ``layers`` in ``host`` as built, before any growth."""
    modules = dict(host.build().named_modules())
    return {name: int(modules[name].weight.shape[0]) for name in layers}


class _MemberSeed(Protocol):
    @property
    def member(self) -> ZooMember: ...
    @property
    def seed(self) -> int: ...


def summarise_arms(
    members: Sequence[ZooMember],
    jobs: Sequence[_MemberSeed],
    outcomes: Sequence[Mapping[str, Any]],
    *,
    metric: Metric,
    arms: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    subject: str,
) -> dict[str, Any]:
    """One family's arms (``outcome["runs"][arm]`` per job), the paired differences ``a - b`` of
    ``pairs``, and whether ``subject`` met the goal against the tuned static network.

    A halted run is paired at its scored value like any other; each arm's ``halted`` counts them."""
    scores: dict[str, list[float]] = {arm: [] for arm in arms}
    runs: list[dict[str, Any]] = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        arm_runs: Mapping[str, EpisodeResult] = outcome["runs"]
        for arm in arms:
            scores[arm].append(metric.value(arm_runs[arm]))
        runs.append(
            {
                "member": job.member.name,
                "seed": job.seed,
                "tuned_weight_decay": outcome["tuned_weight_decay"],
                "tuning_flops": outcome["tuning_flops"],
                "widths": outcome["widths"],
                "arms": {
                    arm: {
                        metric.key: metric.value(r),
                        "val_accuracy": r.val_accuracy,
                        "train_flops": r.train_flops,
                        "total_params": r.total_params,
                        "wall_s": round(r.wall_s, 3),
                        "commands": r.commands,
                        "halted": r.halted,
                    }
                    for arm, r in arm_runs.items()
                },
            }
        )
    summary = {
        arm: {
            f"{metric.key}_mean": statistics.fmean(scores[arm]),
            f"{metric.key}_std": statistics.stdev(scores[arm]) if len(scores[arm]) > 1 else 0.0,
            "train_flops_mean": statistics.fmean(r["arms"][arm]["train_flops"] for r in runs),
            "wall_s_mean": statistics.fmean(r["arms"][arm]["wall_s"] for r in runs),
            "params_mean": statistics.fmean(r["arms"][arm]["total_params"] for r in runs),
            "halted": count_halted(outcome["runs"][arm] for outcome in outcomes),
        }
        for arm in arms
    }
    summary["tuned"]["tuning_flops_mean"] = statistics.fmean(r["tuning_flops"] for r in runs)
    paired = {
        f"{a}_minus_{b}": paired_difference(scores[a], scores[b], higher_is_better=metric.higher_is_better).as_dict()
        for a, b in pairs
    }
    goal = paired[f"{subject}_minus_tuned"]
    if metric.higher_is_better:
        met = goal["mean"] >= 0 and goal["ci95_low"] >= -GOAL_POINTS
    else:
        met = goal["mean"] <= 0 and goal["ci95_high"] <= GOAL_BITS
    flops = [r["arms"][subject]["train_flops"] / r["arms"]["tuned"]["train_flops"] for r in runs]
    return {
        "metric": metric.key,
        "metric_label": metric.label,
        "higher_is_better": metric.higher_is_better,
        "members": [m.name for m in members],
        "pairs": len(runs),
        "arms": summary,
        "paired": paired,
        f"goal_{subject}_vs_tuned_met": met,
        f"{subject}_flops_over_tuned_mean": statistics.fmean(flops),
        "runs": runs,
    }


def across_families(
    families: Mapping[str, Mapping[str, Any]], *, pairs: Sequence[tuple[str, str]], subject: str
) -> dict[str, Any]:
    """The mean over the accuracy families of each family's mean difference (equal weights), and
    how many families met the goal; a language model's bits are not averaged with points."""
    goal = f"goal_{subject}_vs_tuned_met"
    accuracy = {f: r for f, r in families.items() if r["higher_is_better"]}
    out: dict[str, Any] = {
        "families_goal_met": sorted(f for f, r in families.items() if r[goal]),
        "families_goal_missed": sorted(f for f, r in families.items() if not r[goal]),
    }
    if accuracy:
        for a, b in pairs:
            key = f"{a}_minus_{b}"
            out[f"{key}_mean_of_family_means"] = statistics.fmean(r["paired"][key]["mean"] for r in accuracy.values())
        out["accuracy_families"] = sorted(accuracy)
    return out


_STYLE = {
    "heldout": ("tab:green", "*"),
    "rule": ("tab:red", "^"),
    "heuristic": ("tab:orange", "o"),
    "none": ("black", "s"),
    "static": ("tab:blue", "D"),
    "tuned": ("tab:purple", "P"),
}


def arms_png(result: Mapping[str, Any], *, arms: Sequence[str], title: Callable[[str], str]) -> bytes:
    """Per family, each arm against the tuned static network of the grown shape: the mean paired
    difference in score (BCa 95 % interval) against the mean ratio of training FLOPs.

    Paired, because the members of a family differ far more from each other than the arms do on
    one member: unpaired means with their intervals would hide every difference the table shows.
    Up and to the left is better for accuracy (down and to the left for bits per character)."""
    families = list(result["results"])
    fig = Figure(figsize=(4.5 * len(families), 4.0))
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, family in zip(axes, families, strict=True):
        r = result["results"][family]
        key, runs = r["metric"], r["runs"]
        tuned = [e["arms"]["tuned"] for e in runs]
        for arm in arms:
            color, marker = _STYLE[arm]
            ratio = statistics.fmean(
                e["arms"][arm]["train_flops"] / t["train_flops"] for e, t in zip(runs, tuned, strict=True)
            )
            if arm == "tuned":
                ax.plot([ratio], [0.0], color=color, marker=marker, markersize=9, linestyle="none", label=arm)
                continue
            d = paired_difference([e["arms"][arm][key] for e in runs], [t[key] for t in tuned])
            ax.errorbar(
                [ratio], [d.mean], yerr=[[d.mean - d.ci95_low], [d.ci95_high - d.mean]], color=color,
                marker=marker, markersize=9, capsize=3, linestyle="none", label=arm,
            )  # fmt: skip
        ax.axhline(0.0, color="gray", linewidth=0.8)
        ax.set_xlabel("training FLOPs / tuned static's (mean over pairs)")
        ax.set_ylabel(f"{r['metric_label']} minus tuned static")
        ax.set_title(f"{title(family)} ({len(runs)} pairs, BCa 95 %)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def format_arms(r: Mapping[str, Any], *, subject: str, label: str) -> list[str]:
    """A family's lines (``summarise_arms``' result ``r``): each arm's score, FLOPs and wall, the
    halted runs when there are any, the paired differences, and whether ``subject`` (called
    ``label``) met the goal."""
    key = r["metric"]
    lines = [
        f"  {arm:<10} {s[f'{key}_mean']:8.3f}  train FLOPs {s['train_flops_mean']:.3g}  wall {s['wall_s_mean']:.2f} s"
        for arm, s in r["arms"].items()
    ]
    # .get: results saved before halted runs were counted have no count (none halted: it raised).
    if halted := {arm: n for arm, s in r["arms"].items() if (n := s.get("halted", 0))}:
        counts = ", ".join(f"{arm} {n}" for arm, n in halted.items())
        lines.append(f"  halted runs (scored at their last commit): {counts} of {r['pairs']} pairs")
    lines += [
        f"  {name:<24} {d['mean']:+.3f} [{d['ci95_low']:+.3f}, {d['ci95_high']:+.3f}]"
        for name, d in r["paired"].items()
    ]
    lines.append(f"  goal ({label} vs tuned): {'met' if r[f'goal_{subject}_vs_tuned_met'] else 'missed'}")
    return lines


__all__ = [
    "GOAL_BITS",
    "GOAL_POINTS",
    "ArmRunner",
    "across_families",
    "arms_around",
    "arms_png",
    "best_on_validation",
    "check_evaluation",
    "evaluated_members",
    "format_arms",
    "host_widths",
    "member_metric",
    "pairs_around",
    "static_shape",
    "summarise_arms",
]
