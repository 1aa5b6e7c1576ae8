"""The transfer benchmark: a policy that never saw a family, against static networks of its shape.

Issue 35's question: does one controller, trained over the zoo, grow hosts of a family it was
never trained on at least as well as training the static network? For each held-out family
(leave-one-family-out), ``run``:

1. trains a policy by the zoo procedure (``zoo_train.train_zoo_policy``, chosen on the selection
   seeds only) with every member of that family excluded, in a registry of its own;
2. draws ``eval_members`` members of the held-out family from the zoo under another seed
   (``eval_zoo_seed``: hosts the default heuristic's rule was not searched on), and on each of the
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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esper_core._capabilities import one_thread
from esper_core.fanout import FanOut
from esper_core.settings import EsperSettings
from esper_core.studies.growth import in_home
from esper_core.studies.growth_report import Metric
from esper_core.studies.policy_files import save_policy_version
from esper_core.studies.yardstick import (
    GOAL_BITS,
    GOAL_POINTS,
    ArmRunner,
    across_families,
    arms_around,
    arms_png,
    check_evaluation,
    evaluated_members,
    format_arms,
    member_metric,
    pairs_around,
    summarise_arms,
)
from esper_core.studies.zoo_train import ZooTraining, train_zoo_policy
from esper_core.tamiyo.config import TamiyoGNNConfig
from esper_core.tamiyo.heuristic import DEFAULTS_SEARCH_ZOO_SEED
from esper_core.telemetry.baseline import save_result_with_plot
from esper_core.zoo import Family, ZooMember

Progress = Callable[[str, int, int], None]

ARMS = arms_around("heldout")
"""The arms of a (member, seed), in report order (module docstring)."""

PAIRS = pairs_around("heldout")
"""The paired differences reported, ``a - b``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferConfig:
    """One transfer benchmark.

    Attributes:
        families: The families held out, each in turn (a policy is trained without each).
        training: The zoo training procedure of every held-out policy (its ``exclude_families``
            is set per family; its ``seeds.evaluation`` are the seeds evaluated on).
        eval_zoo_seed: The zoo seed the evaluated members are drawn under: neither
            ``training.zoo``'s (the held-out training's other families) nor
            ``DEFAULTS_SEARCH_ZOO_SEED`` (the members the heuristic arm's rule was searched on).
        eval_members: Members of the held-out family evaluated on.
        seeds: How many of ``training.seeds.evaluation`` (the first ones) each member runs.
        weight_decays: The tuned arm's grid (0 among them: the ``static`` arm is its 0).
        workers: Dask worker processes (one thread each) the runs fan out on; 0: here, one thread.
        device: Where runs train.
    """

    families: tuple[Family, ...]
    training: ZooTraining = field(default_factory=ZooTraining)
    eval_zoo_seed: int = 1
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
        if self.eval_zoo_seed == DEFAULTS_SEARCH_ZOO_SEED:
            raise ValueError(
                f"eval_zoo_seed={self.eval_zoo_seed} draws the members the heuristic arm's rule (the default) was "
                "searched on; pick another seed"
            )
        check_evaluation(
            self.training,
            eval_zoo_seed=self.eval_zoo_seed,
            eval_members=self.eval_members,
            seeds=self.seeds,
            weight_decays=self.weight_decays,
            workers=self.workers,
        )

    @property
    def evaluation_seeds(self) -> tuple[int, ...]:
        """The seeds every evaluated member runs."""
        return self.training.seeds.evaluation[: self.seeds]


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
            members = evaluated_members(
                config.training, family, eval_zoo_seed=config.eval_zoo_seed, eval_members=config.eval_members
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
        "eval_zoo_seed": config.eval_zoo_seed,
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
        "across_families": across_families(families, pairs=PAIRS, subject="heldout"),
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


def transfer_png(result: Mapping[str, Any]) -> bytes:
    """Per held-out family, each arm against the tuned static network of the grown shape
    (``yardstick.arms_png``)."""
    return arms_png(result, arms=ARMS, title="{} held out".format)


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


__all__ = [
    "ARMS",
    "PAIRS",
    "TransferConfig",
    "TransferJob",
    "format_table",
    "run",
    "save_baseline",
    "summarise_family",
    "transfer_png",
    "transfer_runs",
]
