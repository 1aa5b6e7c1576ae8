"""The transfer benchmark: a policy that never saw a family, against static networks of its shape.

Issue 35's question: does one controller, trained over the zoo, grow hosts of a family it was
never trained on at least as well as training the static network? For each held-out family
(leave-one-family-out), ``run``:

1. trains a policy by the zoo procedure (``zoo_train.train_zoo_policy``, chosen on the selection
   seeds only) with every member of that family excluded, in a registry of its own;
2. draws ``eval_members`` members of the held-out family from the same zoo, and on each of the
   first ``seeds`` of the training's *evaluation* seeds (disjoint from its training and selection
   seeds by ``ZooSeeds``; nothing is chosen on them) runs, paired (same member, seed, data and
   initialisation):

   ============  =================================================================================
   ``heldout``   the held-out policy (the GNN, greedy)
   ``heuristic`` Tamiyo's rules, today's default
   ``none``      no growth: the member's host as drawn
   ``static``    a static network **in the held-out run's own final shape** (every widened layer
                 at its final width, trained from scratch with the default initialisation)
   ``tuned``     that static network with its weight decay chosen on the validation split alone,
                 per seed, from ``weight_decays`` (its other runs are its tuning cost)
   ============  =================================================================================

and reports each arm's score (test accuracy in points, or bits per character for a language
model), training FLOPs and wall seconds, the paired differences with BCa 95 % intervals
(``esper_core.telemetry.paired``) and the issue's goal per family: held-out minus tuned has mean
>= 0 and a lower bound >= -0.5 points (bits per character: upper bound <= +0.01).

Width slots only (``ZooSpec(kinds=("width",))``): the static network of a grown shape is then
the host at other widths; a branch seed's module has no static counterpart defined here.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from matplotlib.figure import Figure
from torch import nn

from esper_core._capabilities import one_thread
from esper_core.data import load_dataset
from esper_core.fanout import FanOut
from esper_core.run.config import ModelSpec
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.studies.growth import fresh_run_id, in_home
from esper_core.studies.growth_report import ACCURACY, BITS_PER_CHAR, Metric
from esper_core.studies.policy_files import save_policy_version
from esper_core.studies.width_control import at_widths
from esper_core.studies.zoo_train import ZooTraining, train_zoo_policy, zoo_members
from esper_core.tamiyo.config import TamiyoGNNConfig
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.telemetry.baseline import save_result_with_plot
from esper_core.telemetry.paired import paired_difference
from esper_core.telemetry.plots import figure_png
from esper_core.zoo import Family, ZooMember

Progress = Callable[[str, int, int], None]

ARMS = ("heldout", "heuristic", "none", "static", "tuned")
"""The arms of a (member, seed), in report order (module docstring)."""

PAIRS = (
    ("heldout", "tuned"),
    ("heldout", "static"),
    ("heldout", "heuristic"),
    ("heldout", "none"),
    ("heuristic", "tuned"),
    ("heuristic", "none"),
)
"""The paired differences reported, ``a - b``."""

GOAL_POINTS = 0.5
"""Held-out minus tuned may be this much worse at its interval's lower bound (accuracy points)."""
GOAL_BITS = 0.01
"""The same for a language model, in bits per character (upper bound)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferConfig:
    """One transfer benchmark.

    Attributes:
        families: The families held out, each in turn (a policy is trained without each).
        training: The zoo training procedure of every held-out policy (its ``exclude_families``
            is set per family; its ``seeds.evaluation`` are the seeds evaluated on).
        eval_members: Members of the held-out family evaluated on, drawn from ``training.zoo``.
        seeds: How many of ``training.seeds.evaluation`` (the first ones) each member runs.
        weight_decays: The tuned arm's grid (0 among them: the ``static`` arm is its 0).
        workers: Dask worker processes (one thread each) the runs fan out on; 0: here, one thread.
        device: Where runs train.
    """

    families: tuple[Family, ...]
    training: ZooTraining = field(default_factory=ZooTraining)
    eval_members: int = 2
    seeds: int = 5
    weight_decays: tuple[float, ...] = (0.0, 1e-4, 1e-3)
    workers: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        zoo = self.training.zoo
        if not self.families or len(set(self.families)) != len(self.families):
            raise ValueError(f"families must name distinct families to hold out, got {self.families}")
        if missing := [f for f in self.families if f not in zoo.families]:
            raise ValueError(f"families {missing} are not in the zoo's families {zoo.families}: hold out one of those")
        if len(zoo.families) < 2:
            raise ValueError(f"the zoo has one family ({zoo.families}): holding it out leaves nothing to train on")
        if self.training.exclude_families:
            raise ValueError(
                f"training.exclude_families={self.training.exclude_families}: leave it empty, the benchmark "
                "excludes each held-out family in turn"
            )
        check_evaluation(
            self.training,
            eval_members=self.eval_members,
            seeds=self.seeds,
            weight_decays=self.weight_decays,
            workers=self.workers,
        )

    @property
    def evaluation_seeds(self) -> tuple[int, ...]:
        """The seeds every evaluated member runs."""
        return self.training.seeds.evaluation[: self.seeds]


def check_evaluation(
    training: ZooTraining, *, eval_members: int, seeds: int, weight_decays: Sequence[float], workers: int
) -> None:
    """Refuse, with the fix, an evaluation against static networks of a grown shape that cannot be
    run honestly: slots other than width (no static counterpart), fewer than two paired seeds or
    more than the training reserves for evaluation, a weight-decay grid without 0."""
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


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferJob:
    """Every arm of one member and seed (a unit of fan-out: the static arms' shape is the
    held-out run's of the same seed)."""

    member: ZooMember
    seed: int
    home: str
    version: int
    gnn: TamiyoGNNConfig
    weight_decays: tuple[float, ...]
    device: str


def member_metric(member: ZooMember) -> Metric:
    """Bits per character for the language model (``chars``); accuracy for a classifier."""
    return BITS_PER_CHAR if member.task.name == "chars" else ACCURACY


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
        the grid's best on validation, and its runs are its tuning cost."""
        recipe = self.member.recipe()
        host = recipe.host
        assert isinstance(host, ModelSpec), "a zoo member's host is a ModelSpec"
        shape = load_dataset(recipe.data).feature_shape
        static_host = dataclasses.replace(
            host, build=functools.partial(static_shape, host.build, grown, shape, host.input_dtype)
        )
        grid = {wd: self("none", f"static-wd{wd:g}", host=static_host, weight_decay=wd) for wd in weight_decays}
        # Chosen on validation accuracy alone (the first of a tie, in grid order): the test split
        # is read only after the choice.
        best = max(weight_decays, key=lambda wd: (grid[wd].val_accuracy, -list(weight_decays).index(wd)))
        return {
            "static": grid[0.0],
            "tuned": grid[best],
            "tuned_weight_decay": best,
            "tuning_flops": sum(r.train_flops for r in grid.values()),
            "tuning_wall_s": sum(r.wall_s for r in grid.values()),
            "widths": {"host": host_widths(host, list(grown)), "grown": dict(grown)},
        }


def transfer_runs(job: TransferJob) -> dict[str, Any]:
    """Run ``job``'s arms on one torch thread: ``{arm: EpisodeResult}`` and the tuned arm's grid."""
    with one_thread():
        settings = EsperSettings(home=Path(job.home))
        run = ArmRunner(job.member, job.seed, settings, label="transfer", device=job.device, gnn=job.gnn)
        runs = {
            "heldout": run("gnn", "heldout", version=job.version),
            "heuristic": run("heuristic", "heuristic"),
            "none": run("none", "none"),
        }
        matched = run.shape_matched(runs["heldout"].widths, job.weight_decays)
        runs["static"], runs["tuned"] = matched.pop("static"), matched.pop("tuned")
        return {"runs": runs, **matched}


def host_widths(host: ModelSpec, layers: Sequence[str]) -> dict[str, int]:
    """Output units of each of ``layers`` in ``host`` as built, before any growth."""
    modules = dict(host.build().named_modules())
    return {name: int(modules[name].weight.shape[0]) for name in layers}


def run(
    config: TransferConfig, *, policies_dir: Path | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Train each held-out policy, run every arm, and summarise (module docstring).

    Args:
        config: Families, training procedure, members, seeds and grid.
        policies_dir: Where to save each held-out policy (``<family>/weights.pt`` and
            ``policy.json``); None keeps none.
        progress: ``progress(what, done, total)`` before each training and after each family.

    Returns:
        The JSON-able result: per family, the held-out training's selection scores, every run,
        each arm's summary, the paired differences and the goal.
    """
    report = progress or (lambda _what, _done, _total: None)
    start = time.perf_counter()
    families: dict[str, Any] = {}
    with FanOut(workers=config.workers).open() as pool:
        for done, family in enumerate(config.families):
            report(f"training without {family}", done, len(config.families))
            training = dataclasses.replace(config.training, exclude_families=(family,))
            members = zoo_members(
                dataclasses.replace(
                    config.training,
                    members=config.eval_members,
                    exclude_families=tuple(f for f in config.training.zoo.families if f != family),
                )
            )
            with in_home(None, prefix=f"esper-transfer-{family}-") as home:
                settings = EsperSettings(home=home)
                trained_at = time.perf_counter()
                trained = train_zoo_policy(settings, training, device=config.device, pool=pool)
                training_s = time.perf_counter() - trained_at
                if policies_dir is not None:
                    save_policy_version(
                        settings,
                        trained.chosen,
                        policies_dir / family,
                        extra={"held_out": family, "selection": [dataclasses.asdict(s) for s in trained.scores]},
                    )
                jobs = [
                    TransferJob(
                        member=m,
                        seed=seed,
                        home=str(home),
                        version=trained.chosen,
                        gnn=training.plan.gnn,
                        weight_decays=config.weight_decays,
                        device=config.device,
                    )
                    for m in members
                    for seed in config.evaluation_seeds
                ]
                evaluated_at = time.perf_counter()
                outcomes = pool.map(transfer_runs, jobs)
                evaluation_s = time.perf_counter() - evaluated_at
            families[family] = summarise_family(
                members,
                jobs,
                outcomes,
                metric=member_metric(members[0]),
                training={
                    "members": trained.members,
                    "chosen": trained.chosen,
                    "selection": [dataclasses.asdict(s) for s in trained.scores],
                    "training_s": round(training_s, 2),
                    "evaluation_s": round(evaluation_s, 2),
                },
            )
    report("done", len(config.families), len(config.families))
    return {
        "bench": "transfer",
        "families": list(config.families),
        "evaluation_seeds": list(config.evaluation_seeds),
        "eval_members": config.eval_members,
        "weight_decays": list(config.weight_decays),
        "training": {
            "zoo": dataclasses.asdict(config.training.zoo),
            "members": config.training.members,
            "seeds": dataclasses.asdict(config.training.seeds),
            "plan": {
                "demonstrations": config.training.plan.demonstrations,
                "iterations": config.training.plan.iterations,
                "rollouts": config.training.plan.rollouts,
                "flops_penalty": config.training.plan.simic.flops_penalty,
                "gnn": dataclasses.asdict(config.training.plan.gnn),
            },
        },
        "goal": {"points": GOAL_POINTS, "bits_per_char": GOAL_BITS},
        "workers": config.workers,
        "device": config.device,
        "wall_s": round(time.perf_counter() - start, 2),
        "results": families,
        "across_families": across_families(families),
    }


def summarise_family(
    members: Sequence[ZooMember],
    jobs: Sequence[TransferJob],
    outcomes: Sequence[Mapping[str, Any]],
    *,
    metric: Metric,
    training: dict[str, Any],
) -> dict[str, Any]:
    """One held-out family's arms, paired differences and goal, from its (member, seed) runs."""
    summary = summarise_arms(members, jobs, outcomes, metric=metric, arms=ARMS, pairs=PAIRS, subject="heldout")
    return {**summary, "held_out_training": training}


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
    ``pairs``, and whether ``subject`` met the goal against the tuned static network."""
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
    families: Mapping[str, Mapping[str, Any]],
    *,
    pairs: Sequence[tuple[str, str]] = PAIRS,
    subject: str = "heldout",
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


def transfer_png(
    result: Mapping[str, Any], *, arms: Sequence[str] = ARMS, title: Callable[[str], str] = "{} held out".format
) -> bytes:
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


def save_baseline(result: Mapping[str, Any], directory: Path) -> tuple[Path, Path]:
    """Write ``transfer.json`` and ``transfer_flops.png`` into ``directory``; returns both paths."""
    return save_result_with_plot(
        result, directory, json_name="transfer.json", png_name="transfer_flops.png", png=transfer_png(result)
    )


def format_table(result: Mapping[str, Any]) -> str:
    """One block per held-out family: each arm's score, FLOPs and wall, then the paired differences."""
    lines = [f"transfer: {len(result['results'])} held-out families, seeds {result['evaluation_seeds']}"]
    for family, r in result["results"].items():
        chosen = r["held_out_training"]["chosen"]
        lines.append(f"\n{family} held out ({r['pairs']} pairs, policy v{chosen}, {r['metric_label']})")
        lines += format_arms(r, subject="heldout", label="held-out")
    return "\n".join(lines)


def format_arms(r: Mapping[str, Any], *, subject: str, label: str) -> list[str]:
    """A family's lines (``summarise_arms``' result ``r``): each arm's score, FLOPs and wall, the
    paired differences, and whether ``subject`` (called ``label``) met the goal."""
    key = r["metric"]
    lines = [
        f"  {arm:<10} {s[f'{key}_mean']:8.3f}  train FLOPs {s['train_flops_mean']:.3g}  wall {s['wall_s_mean']:.2f} s"
        for arm, s in r["arms"].items()
    ]
    lines += [
        f"  {name:<24} {d['mean']:+.3f} [{d['ci95_low']:+.3f}, {d['ci95_high']:+.3f}]"
        for name, d in r["paired"].items()
    ]
    lines.append(f"  goal ({label} vs tuned): {'met' if r[f'goal_{subject}_vs_tuned_met'] else 'missed'}")
    return lines


__all__ = [
    "ARMS",
    "PAIRS",
    "ArmRunner",
    "TransferConfig",
    "TransferJob",
    "across_families",
    "check_evaluation",
    "format_arms",
    "format_table",
    "member_metric",
    "run",
    "save_baseline",
    "static_shape",
    "summarise_arms",
    "summarise_family",
    "transfer_png",
    "transfer_runs",
]
