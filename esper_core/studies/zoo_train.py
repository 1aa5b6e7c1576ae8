"""Simic over the zoo: one policy trained on episodes of many hosts, chosen on selection seeds.

The procedure is ``simic_train``'s (the heuristic's demonstrations, imitation, PPO on the GNN's
own rollouts, each stage a published version), with the recipe replaced by zoo members: every
phase runs one batch of episodes per member (``episode_jobs`` takes a member's ``RunConfig``),
all members' batches in one map over the pool.

Three disjoint seed sets (``ZooSeeds``) keep the choice honest (issue 35: no choice of any kind
is made on evaluation seeds):

- **train**: demonstrations and rollouts, the only episodes Simic learns from;
- **selection**: after each version is published, every member plays its selection seeds with
  that version deciding (greedy), and the version with the best selection score is the result;
  the heuristic and no growth play them once, as the yardsticks the score is read against;
- **evaluation**: named here so that overlap is refused, never run by this procedure.

A version's selection score is the mean over (member, selection seed) of

    quality - flops_penalty * (train_flops / static_train_flops - 1)

where ``static_train_flops`` is the same member and seed trained without growth: the reward's
trade-off (``esper_core.simic.dataset``) read on whole runs, so ``flops_penalty = 0.01`` costs
one accuracy point for a run that doubles its training compute. ``quality`` is the validation
accuracy (a fraction) of a classifier; a language model's accuracy is 0 (``classifies``), so its
quality is ``-simic.record_types.BITS_WORTH`` (0.5) x its validation loss in bits per character: 0.01 bits is worth half a
point, the exchange rate of the transfer goal (``yardstick.GOAL_BITS`` against ``GOAL_POINTS``).
Before 2026-11-28 a language model was scored (and rewarded) by its FLOPs alone.

An episode that halted (``EpisodeResult.halted``: its training failed past Tolaria's budget) counts
as what it is: its scores are those of its network at its last commit (``episodes.run_episode``),
so it is scored, and its recorded decisions rewarded, from that (``simic.dataset``'s returns
telescope to the quality it reached); ``VersionScore.halted`` counts such episodes.

``exclude_families`` leaves a family out (leave-one-family-out): members are drawn from the
zoo by index, skipping the excluded families' (and those of a family that has its share), so
a held-out training runs the same procedure on the other families.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from esper_core.fanout import LOCAL, Pool
from esper_core.run.kernels import publish_missing_kernels
from esper_core.settings import EsperSettings
from esper_core.simic.learn import SimicConfig
from esper_core.simic.record_types import validation_quality as record_quality
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import EpisodeResult, count_halted
from esper_core.studies.simic_train import TrainingPlan, episode_jobs, run_episodes, train_imitation, train_ppo
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.zoo import FAMILIES, Family, ZooMember, ZooSpec, draw_member

log = logging.getLogger(__name__)

# Members drawn per member kept, at most, before a family exclusion is called unsatisfiable.
_MAX_DRAWS_PER_MEMBER = 50


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooSeeds:
    """The run seeds of a zoo training, in three disjoint sets.

    Attributes:
        train: Seeds of the episodes Simic learns from: the first ``demonstrations`` are the
            heuristic's, then ``rollouts`` per PPO iteration (every member plays each).
        selection: Seeds every published version plays (greedy) to be chosen on.
        evaluation: Seeds reserved for the evaluation of the result; never run here.
    """

    train: tuple[int, ...] = tuple(range(1000, 1010))
    selection: tuple[int, ...] = (2000, 2001)
    evaluation: tuple[int, ...] = tuple(range(40))

    def __post_init__(self) -> None:
        if not self.train or not self.selection:
            raise ValueError(
                f"need training and selection seeds (got {len(self.train)} and {len(self.selection)}): "
                "a policy is trained on the one and chosen on the other"
            )
        sets = {"train": self.train, "selection": self.selection, "evaluation": self.evaluation}
        for name, seeds in sets.items():
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"{name} seeds repeat a seed: {seeds}; list each seed once")
        names = list(sets)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if shared := sorted(set(sets[a]) & set(sets[b])):
                    raise ValueError(
                        f"{a} and {b} seeds overlap on {shared}: a choice made on a seed cannot be scored on it; "
                        f"move those seeds out of one of the sets"
                    )


def _zoo_plan() -> TrainingPlan:
    # Small: a zoo training's cost is members x episodes, so each member gets few episodes; the
    # FLOPs term is on (one accuracy point per doubling of training compute).
    return TrainingPlan(
        demonstrations=2,
        iterations=3,
        rollouts=2,
        gnn=TamiyoGNNConfig(),
        simic=SimicConfig(flops_penalty=0.01, imitation_epochs=20),
    )


@dataclass(kw_only=True, slots=True)
class ZooTraining:
    """One Simic training over the zoo.

    Attributes:
        zoo: What members are drawn from; with ``branch`` among its ``kinds``, the kernels of
            every member's branch slots are compiled and published before any episode runs.
        members: Members trained on, drawn by index, skipping excluded families.
        exclude_families: Families no member is drawn from (leave-one-family-out).
        seeds: Training, selection and evaluation seeds (disjoint).
        plan: Episodes per member per phase (``demonstrations``, ``iterations``, ``rollouts``),
            the GNN's size and Simic's hyperparameters, ``SimicConfig.flops_penalty`` included.
            ``first_seed`` is unused: ``seeds.train`` names the seeds.
    """

    zoo: ZooSpec = field(default_factory=ZooSpec)
    members: int = 14
    exclude_families: tuple[Family, ...] = ()
    seeds: ZooSeeds = field(default_factory=ZooSeeds)
    plan: TrainingPlan = field(default_factory=_zoo_plan)

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ValueError(f"members must be >= 1, got {self.members}")
        unknown = [f for f in self.exclude_families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"exclude_families names unknown families {unknown}; choose from {FAMILIES}")
        if not set(self.zoo.families) - set(self.exclude_families):
            raise ValueError(
                f"exclude_families={self.exclude_families} leaves no family of zoo.families={self.zoo.families}: "
                "exclude fewer"
            )
        if self.plan.variation.varies or self.plan.search is not None or self.plan.reward != "delta":
            raise ValueError(
                "zoo training varies hosts by drawing members and learns from delta rewards: use a TrainingPlan "
                "without variation or search, with reward='delta'"
            )
        needed = self.plan.demonstrations + self.plan.iterations * self.plan.rollouts
        if len(self.seeds.train) < needed:
            raise ValueError(
                f"the plan needs {needed} training seeds (demonstrations + iterations x rollouts), "
                f"got {len(self.seeds.train)}: add training seeds or shrink the plan"
            )

    def train_seeds(self, phase: str, iteration: int = 0) -> tuple[int, ...]:
        """Training seeds of ``phase`` (``demonstrations``, or ``rollouts`` of ``iteration``)."""
        d, r = self.plan.demonstrations, self.plan.rollouts
        if phase == "demonstrations":
            return self.seeds.train[:d]
        return self.seeds.train[d + iteration * r : d + (iteration + 1) * r]


def zoo_members(config: ZooTraining) -> list[ZooMember]:
    """The members ``config`` trains on, as evenly spread over the families as ``members`` allows.

    Members are drawn by index from the zoo; one of an excluded family is skipped, and so is one
    of a family that already has its share (``members`` over the families left, rounded up), so
    that a small training still sees every family it may.

    Raises:
        ValueError: The zoo draws too few members outside the excluded families.
    """
    families = [f for f in config.zoo.families if f not in config.exclude_families]
    share = math.ceil(config.members / len(families))
    members: list[ZooMember] = []
    taken: Counter[str] = Counter()
    for index in range(config.members * _MAX_DRAWS_PER_MEMBER):
        if len(members) == config.members:
            break
        member = draw_member(config.zoo, index)
        if member.family in families and taken[member.family] < share:
            members.append(member)
            taken[member.family] += 1
    if len(members) < config.members:
        raise ValueError(
            f"drew only {len(members)} members outside {sorted(config.exclude_families)}: exclude fewer families"
        )
    return members


@dataclass(frozen=True, kw_only=True, slots=True)
class VersionScore:
    """A version's (or a yardstick's) results on the selection seeds.

    Attributes:
        label: ``v<version>``, ``heuristic`` or ``none``.
        score: Mean selection score (module docstring).
        val_accuracy: Mean validation accuracy.
        flops_ratio: Mean training FLOPs over the static run's.
        by_family: Family -> mean selection score.
        halted: Episodes that halted, scored at their last commit (module docstring).
    """

    label: str
    score: float
    val_accuracy: float
    flops_ratio: float
    by_family: dict[str, float]
    halted: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooTrainingResult:
    """What a zoo training did.

    Attributes:
        members: Member name -> family, of the members trained on.
        versions: Published versions, in order (imitation first).
        chosen: The version with the best selection score.
        scores: Selection results of every version and of the yardsticks (``heuristic``, ``none``).
        episodes: Every episode run, by phase: ``demonstrations``, ``rollouts`` (training seeds),
            ``yardsticks`` (no growth and the heuristic) and ``scoring`` (the versions), both on
            the selection seeds.
        update_s: Wall seconds of each policy update (imitation, then each PPO iteration).
        phase_s: Wall seconds of each phase, episodes included.
    """

    members: dict[str, Family]
    versions: list[int]
    chosen: int
    scores: list[VersionScore]
    episodes: dict[str, list[EpisodeResult]]
    update_s: list[float]
    phase_s: dict[str, float]


def train_zoo_policy(
    settings: EsperSettings, config: ZooTraining, *, device: str = "cpu", pool: Pool = LOCAL
) -> ZooTrainingResult:
    """Train one policy over the zoo and choose among its versions on the selection seeds.

    Args:
        settings: Registry and run folders (the versions are published there).
        config: Members, seeds and plan.
        device: Where episodes train.
        pool: Where episodes run (``esper_core.fanout``).

    Returns:
        The versions, the chosen one and every episode's result.
    """
    members = zoo_members(config)
    family = {m.name: m.family for m in members}
    by_name = {m.name: m for m in members}
    publish_zoo_kernels(settings, members, device=device)
    plan = config.plan
    episodes: dict[str, list[EpisodeResult]] = defaultdict(list)
    phase_s: dict[str, float] = defaultdict(float)

    def play(
        phase: str,
        seeds: Sequence[int],
        policy: str,
        *,
        label: str,
        explore: bool = False,
        policy_version: int | None = None,
    ) -> list[EpisodeResult]:
        start = time.perf_counter()
        batches = [
            episode_jobs(
                settings,
                recipe=m.recipe(),
                seeds=seeds,
                policy=policy,
                plan=plan,
                explore=explore,
                policy_version=policy_version,
                device=device,
                label=label,
            )
            for m in members
        ]
        results = [r for batch in run_episodes(batches, pool=pool) for r in batch]
        if halted := [r.run_id for r in results if r.halted is not None]:
            # Said here as well as by each run: on a Dask worker the run's own warning stays there.
            log.warning(
                "zoo %s (%s): %d of %d episodes halted, scored at their last commit: %s",
                phase,
                label,
                len(halted),
                len(results),
                ", ".join(halted),
            )
        episodes[phase].extend(results)
        phase_s[phase] += time.perf_counter() - start
        return results

    demos = play("demonstrations", config.train_seeds("demonstrations"), "heuristic", label="zoo-demo")
    demo_ids = [r.run_id for r in demos]
    static = {(r.recipe, r.seed): r for r in play("yardsticks", config.seeds.selection, "none", label="zoo-sel")}
    scores = [
        score_episodes("none", list(static.values()), static, plan.simic.flops_penalty, by_name),
        score_episodes(
            "heuristic",
            play("yardsticks", config.seeds.selection, "heuristic", label="zoo-sel"),
            static,
            plan.simic.flops_penalty,
            by_name,
        ),
    ]
    # What a version was trained on and chosen by, in its provenance (never the evaluation
    # results: the training runs none).
    context: dict[str, object] = {
        "zoo": dataclasses.asdict(config.zoo),
        "members": family,
        "exclude_families": list(config.exclude_families),
        "seeds": dataclasses.asdict(config.seeds),
    }
    store = SimicStore.open(settings.home, settings.registry_db_url)
    update_s: list[float] = []
    versions: list[int] = []
    try:
        start = time.perf_counter()
        version = train_imitation(store, demo_ids, plan, context=context).version
        update_s.append(time.perf_counter() - start)
        versions.append(version)
        for iteration in range(plan.iterations + 1):
            chosen_by = play(
                "scoring", config.seeds.selection, "gnn", label=f"zoo-sel-v{version}", policy_version=version
            )
            scores.append(score_episodes(f"v{version}", chosen_by, static, plan.simic.flops_penalty, by_name))
            if iteration == plan.iterations:
                break
            rollouts = play(
                "rollouts",
                config.train_seeds("rollouts", iteration),
                "gnn",
                label=f"zoo-roll-v{version}",
                explore=True,
                policy_version=version,
            )
            start = time.perf_counter()
            version = train_ppo(
                store,
                version=version,
                rollout_run_ids=[r.run_id for r in rollouts],
                demonstration_run_ids=demo_ids,
                plan=plan,
                context=context,
            ).version
            update_s.append(time.perf_counter() - start)
            versions.append(version)
    finally:
        store.close()
    best = max((s for s in scores if s.label.startswith("v")), key=lambda s: s.score)
    return ZooTrainingResult(
        members=family,
        versions=versions,
        chosen=int(best.label[1:]),
        scores=scores,
        episodes=dict(episodes),
        update_s=update_s,
        phase_s=dict(phase_s),
    )


def publish_zoo_kernels(settings: EsperSettings, members: Sequence[ZooMember], *, device: str) -> None:
    """Compile and publish the kernels of every blueprint ``members``' branch slots may grow.

    Once per zoo and registry: members of one shape share kernels, and a kernel already
    published for the device is not compiled again (``publish_missing_kernels``). Without them no
    blueprint is a candidate at a branch slot, and an episode could only ever widen. About 1 s a
    kernel on one core (45 kernels for the default zoo's first 14 members); a kernel Tezzeret
    cannot export is published as its eager fallback, which trains the same and runs slower.
    """
    publish_missing_kernels(settings, [m.recipe() for m in members if m.slots], device=device)


def episode_quality(result: EpisodeResult, *, language_model: bool) -> float:
    """What a selection score reads of a run's validation split (``simic.record_types.
    validation_quality``, which Simic's rewards read too): its accuracy for a classifier, minus
    half its loss in bits per character for a language model."""
    return record_quality(accuracy=result.val_accuracy, loss=result.val_loss, classifies=not language_model)


def selection_score(
    result: EpisodeResult, static: EpisodeResult, *, flops_penalty: float, language_model: bool
) -> float:
    """``quality - flops_penalty * (train_flops / static_train_flops - 1)`` of one episode against
    the same member and seed trained without growth (module docstring; ``episode_quality``)."""
    quality = episode_quality(result, language_model=language_model)
    return quality - flops_penalty * (_flops_ratio(result, static) - 1.0)


def _flops_ratio(result: EpisodeResult, static: EpisodeResult) -> float:
    return result.train_flops / static.train_flops if static.train_flops else 1.0


def score_episodes(
    label: str,
    results: Sequence[EpisodeResult],
    static: Mapping[tuple[str, int], EpisodeResult],
    flops_penalty: float,
    members: Mapping[str, ZooMember],
) -> VersionScore:
    """``label``'s selection score (module docstring) over ``results``, each read against the
    no-growth episode of its member and seed in ``static`` (keyed ``(recipe, seed)``), and per
    family (``members``: member name -> member)."""
    per = [(r, static[(r.recipe, r.seed)]) for r in results]
    scores = [
        selection_score(r, s, flops_penalty=flops_penalty, language_model=members[r.recipe].language_model)
        for r, s in per
    ]
    by_family: dict[str, list[float]] = defaultdict(list)
    for (r, _), score in zip(per, scores, strict=True):
        by_family[members[r.recipe].family].append(score)
    return VersionScore(
        label=label,
        score=statistics.fmean(scores),
        val_accuracy=statistics.fmean(r.val_accuracy for r, _ in per),
        flops_ratio=statistics.fmean(_flops_ratio(r, s) for r, s in per),
        by_family={f: statistics.fmean(v) for f, v in sorted(by_family.items())},
        halted=count_halted(results),
    )


__all__ = [
    "VersionScore",
    "episode_quality",
    "ZooSeeds",
    "ZooTraining",
    "ZooTrainingResult",
    "publish_zoo_kernels",
    "score_episodes",
    "selection_score",
    "train_zoo_policy",
    "zoo_members",
]
