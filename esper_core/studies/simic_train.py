"""Simic's training procedure: demonstrations, imitation, then PPO iterations, each a new version.

``TrainingPlan`` names how much data each phase gets; ``PLANS`` holds the named plans the
``train_policy`` flow accepts. Every phase reads its data back from the registry (what the
episodes recorded), trains, and publishes a policy version with its provenance: the runs and
record counts it learned from, the configuration, and the metrics it reached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from esper_core._capabilities import one_thread
from esper_core.contracts import new_id
from esper_core.data import load_dataset
from esper_core.fanout import LOCAL, Pool
from esper_core.karn.entries import default_catalog
from esper_core.run.config import RunConfig
from esper_core.run.kernels import publish_missing_kernels
from esper_core.run.plan import plan_run
from esper_core.run.recipes import get_recipe
from esper_core.run.scores import token_targets
from esper_core.settings import EsperSettings
from esper_core.simic.dataset import REWARDS, RewardKind, build_samples
from esper_core.simic.learn import SimicConfig, imitate, ppo_update
from esper_core.simic.records import DecisionRecord, PolicyVersion, SimicStore
from esper_core.studies.counterfactual import CounterfactualConfig
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.studies.schedule_search import (
    HalvingSearch,
    Schedule,
    ScheduleSearch,
    SearchOutcome,
    candidate_schedules,
    schedule_name,
    search_all,
)
from esper_core.studies.variation import TaskVariation
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.service import TamiyoService


@dataclass(kw_only=True, slots=True)
class TrainingPlan:
    """How much experience each phase of Simic's training collects.

    Attributes:
        demonstrations: Episodes per recipe to imitate: the heuristic's, or, with ``search``,
            the seeds the schedule search runs its rounds on.
        iterations: PPO iterations after imitation.
        rollouts: Sampled GNN episodes per recipe per iteration.
        epochs: Epochs per episode (None: the recipe's).
        lr_schedule: Learning-rate schedule of every episode (None: the recipe's); train the
            policy under the schedule it will be evaluated under.
        first_seed: Seed of the first training episode; later ones count up. Keep it clear of
            evaluation seeds (the growth benchmark evaluates seeds 0, 1, 2, ...).
        gnn: Size of the policy network.
        simic: Learning hyperparameters.
        reward: What PPO learns from: ``delta`` (every decision, the per-epoch change of
            validation accuracy) or ``counterfactual`` (the GNN rollouts fork some decisions where
            a choice existed, and PPO learns only from those, each a one-step return; see
            ``esper_core.simic.dataset``). Imitation clones every demonstration either way.
        counterfactual: Where and how far rollouts fork (used with ``reward="counterfactual"``).
        variation: What each episode's task is drawn from (host width, share of the training
            data, label noise; ``esper_core.studies.variation``); the default varies nothing.
        search: Imitate the best fixed schedule this search finds on the demonstration seeds
            (``esper_core.studies.schedule_search``, ranked by validation accuracy, or a language
            model's validation loss) instead of the heuristic; None: the heuristic is the
            demonstrator.
    """

    demonstrations: int = 4
    iterations: int = 3
    rollouts: int = 4
    epochs: int | None = None
    lr_schedule: str | None = None
    first_seed: int = 1000
    gnn: TamiyoGNNConfig = field(default_factory=TamiyoGNNConfig)
    simic: SimicConfig = field(default_factory=SimicConfig)
    reward: RewardKind = "delta"
    counterfactual: CounterfactualConfig = field(default_factory=CounterfactualConfig)
    variation: TaskVariation = field(default_factory=TaskVariation)
    search: ScheduleSearch | None = None

    @property
    def forks(self) -> CounterfactualConfig | None:
        """The rollouts' fork configuration, None when PPO learns from ``delta`` rewards."""
        return self.counterfactual if self.reward == "counterfactual" else None

    def seeds(self, phase: str, iteration: int = 0) -> list[int]:
        """Episode seeds of ``phase`` (``demonstrations`` or ``rollouts`` of ``iteration``): disjoint."""
        if phase == "demonstrations":
            return [self.first_seed + k for k in range(self.demonstrations)]
        start = self.first_seed + self.demonstrations + iteration * self.rollouts
        return [start + k for k in range(self.rollouts)]

    def __post_init__(self) -> None:
        if self.demonstrations < 1:
            raise ValueError(f"demonstrations must be >= 1 (imitation needs data), got {self.demonstrations}")
        if self.iterations < 0 or self.rollouts < 1:
            raise ValueError(f"need iterations >= 0 and rollouts >= 1, got {self.iterations}, {self.rollouts}")
        if self.epochs is not None and self.epochs < 2:
            raise ValueError(f"episodes need >= 2 epochs for a reward, got {self.epochs}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
        if self.reward == "counterfactual" and self.simic.flops_penalty:
            raise ValueError(
                "a counterfactual plan cannot charge FLOPs (forks do not measure their branches' FLOPs): "
                "set reward='delta' or SimicConfig.flops_penalty=0"
            )


PlanName = Literal["default", "smoke", "counterfactual", "varied", "counterfactual-varied", "search", "search-smoke"]
"""The named training plans, for the ``train_policy`` flow's ``plan`` parameter (a test keeps it
equal to ``PLANS``)."""

_VARIED = TaskVariation(widths=(0.5, 0.75, 1.0), train_fractions=(0.5, 1.0), label_noise=(0.0, 0.1))

PLANS: dict[str, TrainingPlan] = {
    "default": TrainingPlan(),
    # Seconds, not minutes: what the flow test runs.
    "smoke": TrainingPlan(
        demonstrations=1,
        iterations=1,
        rollouts=1,
        epochs=3,
        gnn=TamiyoGNNConfig(hidden_dim=16, num_layers=2),
        simic=SimicConfig(imitation_epochs=2, ppo_epochs=1, batch_size=8),
    ),
    # PPO on counterfactual rewards. Each rollout forks up to 4 decisions, each branch played
    # until G4 judges a seed germinated at the fork (MNIST-1D: 1 + 3 + 1 epochs, so 4 x 10 extra
    # epochs per 60-epoch episode). A choice exists at most epochs, so a low draw spreads the forks
    # over the run instead of spending them all on the first few decisions.
    "counterfactual": TrainingPlan(
        reward="counterfactual", counterfactual=CounterfactualConfig(max_forks=4, fork_probability=0.1)
    ),
    # The default plan on a different task each episode: narrower hosts, half the training data,
    # 10 % of the training labels wrong, so the policy must read the run instead of a schedule.
    "varied": TrainingPlan(variation=_VARIED),
    # Both: forked rewards on varied tasks.
    "counterfactual-varied": TrainingPlan(
        reward="counterfactual",
        counterfactual=CounterfactualConfig(max_forks=4, fork_probability=0.1),
        variation=_VARIED,
    ),
    # Expert iteration: the demonstrations are the best fixed schedule a search finds on the
    # demonstration seeds (27 schedules on MNIST-1D, successive halving over 4 seeds: 40
    # episodes), so imitation starts the GNN from a schedule that beat the heuristic instead of
    # from the heuristic; counterfactual PPO then refines it, its imitation term anchored to the
    # winner's decisions.
    "search": TrainingPlan(
        search=ScheduleSearch(),
        reward="counterfactual",
        counterfactual=CounterfactualConfig(max_forks=4, fork_probability=0.1),
    ),
    # The search plan in seconds: what the flow test runs.
    "search-smoke": TrainingPlan(
        demonstrations=2,
        iterations=0,
        epochs=3,
        gnn=TamiyoGNNConfig(hidden_dim=16, num_layers=2),
        simic=SimicConfig(imitation_epochs=2, ppo_epochs=1, batch_size=8),
        search=ScheduleSearch(at=(0.0,)),
    ),
}


def get_plan(name: str) -> TrainingPlan:
    """The named plan.

    Raises:
        ValueError: Unknown name (the message lists the known ones).
    """
    if name not in PLANS:
        raise ValueError(f"unknown training plan {name!r}; choose one of {sorted(PLANS)}")
    return PLANS[name]


def collect_episodes(
    settings: EsperSettings,
    *,
    recipe: str | RunConfig,
    seeds: Sequence[int],
    policy: str,
    plan: TrainingPlan,
    explore: bool = False,
    policy_version: int | None = None,
    device: str = "cpu",
    label: str = "simic",
    schedule: Schedule = (),
    pool: Pool = LOCAL,
) -> list[EpisodeResult]:
    """Run one episode per seed with ``policy`` deciding (their records land in the registry):
    ``episode_jobs`` then ``run_episodes``.

    Args:
        settings: Registry and run folders.
        recipe: Recipe of every episode: a name, or a configuration made in code (a zoo
            member's ``recipe()``), which each episode copies.
        seeds: One episode per seed.
        policy: ``heuristic``, ``gnn``, ``random`` or ``none``.
        plan: Epochs per episode and the GNN's size; GNN episodes fork decisions for
            counterfactual rewards when the plan learns from them (``TrainingPlan.forks``); each
            episode runs the task its seed draws from ``plan.variation`` (kernels for the slot
            shapes of hosts at other widths are compiled and published first, where missing).
        explore: Sample the GNN's actions (on-policy rollouts).
        policy_version: GNN version to serve (None: the newest).
        device: Where to train.
        label: Prefix of the run ids.
        schedule: The germinations policy ``scheduled`` follows.
        pool: Where the episodes run (``esper_core.fanout``): here in order, or spread over
            Dask workers, with the same results.

    Returns:
        The episodes' results, in the seeds' order.

    Raises:
        ValueError: A variation the recipe cannot take (``TaskVariation.check``), before any episode.
    """
    jobs = episode_jobs(
        settings,
        recipe=recipe,
        seeds=seeds,
        policy=policy,
        plan=plan,
        explore=explore,
        policy_version=policy_version,
        device=device,
        label=label,
        schedule=schedule,
    )
    (results,) = run_episodes([jobs], pool=pool)
    return results


def episode_jobs(
    settings: EsperSettings,
    *,
    recipe: str | RunConfig,
    seeds: Sequence[int],
    policy: str,
    plan: TrainingPlan,
    explore: bool = False,
    policy_version: int | None = None,
    device: str = "cpu",
    label: str = "simic",
    schedule: Schedule = (),
) -> list[EpisodeJob]:
    """The episodes ``collect_episodes`` runs (its arguments, less the pool), ready to run.

    Kernels the episodes need for hosts at other widths are published here, before any runs.
    """
    variation = plan.variation if plan.variation.varies else None
    if variation is not None:
        variation.check(get_recipe(recipe) if isinstance(recipe, str) else recipe)
    configs = [
        episode_config(
            recipe,
            seed=seed,
            policy=policy,
            epochs=plan.epochs,
            device=device,
            explore=explore,
            policy_version=policy_version,
            lr_schedule=plan.lr_schedule,
            task=None if variation is None else variation.draw(seed),
            schedule=schedule,
        )
        for seed in seeds
    ]
    if not configs:
        return []
    # A host at another width has slots of other shapes: without kernels for them no blueprint
    # would be a candidate and the episode could never grow.
    publish_missing_kernels(settings, [c for c in configs if c.task is not None and c.task.width != 1.0], device=device)
    tamiyo_config = dataclasses.replace(configs[0].tamiyo, gnn=plan.gnn)
    for config in configs:
        config.tamiyo = tamiyo_config
    # Only the GNN's rollouts are forked: they are what PPO learns from.
    forks = plan.forks if policy == "gnn" else None
    return [EpisodeJob(config=c, settings=settings, run_id=_run_id(settings, label, c), forks=forks) for c in configs]


def run_episodes(batches: Sequence[Sequence[EpisodeJob]], *, pool: Pool = LOCAL) -> list[list[EpisodeResult]]:
    """Run batches of ``episode_jobs``; each batch's results in its order, the same wherever they ran.

    Spread over a pool, every batch goes out in one map, so the batches of several recipes (one
    PPO iteration's rollouts, say) keep every worker busy instead of waiting for each other.
    """
    if pool.local:
        return [_run_here(jobs) for jobs in batches]
    ran = pool.map(_run_episode_job, [job for jobs in batches for job in jobs])
    out, start = [], 0
    for jobs in batches:
        out.append(ran[start : start + len(jobs)])
        start += len(jobs)
    return out


def _run_here(jobs: Sequence[EpisodeJob]) -> list[EpisodeResult]:
    if not jobs:
        return []
    # One Tamiyo for the batch here (its episodes share one configuration): its network is
    # built once, not per episode.
    service = _tamiyo(jobs[0].config.tamiyo)
    try:
        # One torch thread, as on a worker: an episode's numbers do not depend on where it ran.
        with one_thread():
            return [job.run(service) for job in jobs]
    finally:
        service.close()


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeJob:
    """One episode of ``episode_jobs``, as it travels to a worker."""

    config: RunConfig
    settings: EsperSettings
    run_id: str
    forks: CounterfactualConfig | None

    def run(self, service: TamiyoService) -> EpisodeResult:
        return run_episode(
            self.config, settings=self.settings, tamiyo=service, run_id=self.run_id, counterfactual=self.forks
        )


def _run_episode_job(job: EpisodeJob) -> EpisodeResult:
    """A worker's episode, with a Tamiyo of its own (a service holds threads: it does not travel)."""
    service = _tamiyo(job.config.tamiyo)
    try:
        return job.run(service)
    finally:
        service.close()


def _tamiyo(config: TamiyoConfig) -> TamiyoService:
    """A Tamiyo for episodes. Its network starts from fixed random weights: a policy version
    replaces them when the GNN decides, but the other policies' records keep what the untrained
    network said (its value estimate), which must not depend on where the episode ran."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = TamiyoGNN(config.gnn)
    return TamiyoService(config, model=model)


def collect_demonstrations(
    settings: EsperSettings, *, recipe: str, plan: TrainingPlan, device: str = "cpu", pool: Pool = LOCAL
) -> list[EpisodeResult]:
    """The episodes imitation learns from, on ``plan.seeds("demonstrations")``.

    The heuristic's episodes, or, when the plan searches (``TrainingPlan.search``), the episodes
    of the best fixed schedule its search finds on those seeds (every candidate's episodes stay in
    the registry; only the winner's are returned). ``pool`` spreads the episodes (a search's
    candidates of one round) over workers.
    """
    (demonstrations,) = collect_all_demonstrations(settings, recipes=[recipe], plan=plan, device=device, pool=pool)
    return demonstrations


def collect_all_demonstrations(
    settings: EsperSettings, *, recipes: Sequence[str], plan: TrainingPlan, device: str = "cpu", pool: Pool = LOCAL
) -> list[list[EpisodeResult]]:
    """``collect_demonstrations`` of several recipes at once, in ``recipes``' order.

    Their episodes go out together: the recipes' searches run round by round side by side
    (``search_all``), so a recipe's last, small rounds do not leave workers idle. Each recipe gets
    the same demonstrations as on its own.
    """
    if plan.search is None:
        seeds = plan.seeds("demonstrations")
        batches = [
            episode_jobs(settings, recipe=recipe, seeds=seeds, policy="heuristic", plan=plan, device=device)
            for recipe in recipes
        ]
        return run_episodes(batches, pool=pool)
    searches = [demonstration_search(settings, recipe=recipe, plan=plan, device=device) for recipe in recipes]
    return [outcome.best_episodes for outcome in search_all(searches, pool=pool)]


def search_demonstrations(
    settings: EsperSettings, *, recipe: str, plan: TrainingPlan, device: str = "cpu", pool: Pool = LOCAL
) -> SearchOutcome:
    """Search ``recipe``'s fixed schedules on the demonstration seeds (``plan.search`` must be set).

    Raises:
        ValueError: The plan has no search, or the recipe's blueprints fit none of its slots.
    """
    (outcome,) = search_all([demonstration_search(settings, recipe=recipe, plan=plan, device=device)], pool=pool)
    return outcome


def demonstration_search(settings: EsperSettings, *, recipe: str, plan: TrainingPlan, device: str) -> HalvingSearch:
    """The schedule search ``search_demonstrations`` runs for ``recipe``.

    Raises:
        ValueError: The plan has no search, or the recipe's blueprints fit none of its slots.
    """
    if plan.search is None:
        raise ValueError(
            "this training plan does not search: set TrainingPlan.search or use the heuristic's demonstrations"
        )
    config = get_recipe(recipe, epochs=plan.epochs)
    data = load_dataset(config.data)
    candidates = candidate_schedules(config, plan_run(config, catalog=default_catalog(), data=data), plan.search.at)

    def run(schedule: Schedule, seed: int) -> EpisodeResult:
        (result,) = collect_episodes(
            settings,
            recipe=recipe,
            seeds=[seed],
            policy="scheduled",
            plan=plan,
            device=device,
            label=f"search-{schedule_name(schedule)}",
            schedule=schedule,
        )
        return result

    return HalvingSearch(
        candidates=candidates,
        seeds=plan.seeds("demonstrations"),
        run=run,
        eta=plan.search.eta,
        language_model=token_targets(data),
    )


def train_imitation(
    store: SimicStore, run_ids: Sequence[str], plan: TrainingPlan, *, context: Mapping[str, object] | None = None
) -> PolicyVersion:
    """Imitate the decisions of ``run_ids`` from scratch and publish the result.

    ``context`` joins the version's provenance (a zoo training's members and seed sets).

    Returns:
        The new version (method ``imitation``).
    """
    records, reports = store.decisions(run_ids), store.field_reports(run_ids)
    samples, skipped = build_samples(
        records, reports, param_penalty=plan.simic.param_penalty, flops_penalty=plan.simic.flops_penalty
    )
    torch.manual_seed(plan.simic.seed)
    model = TamiyoGNN(plan.gnn)
    metrics = imitate(model, samples, plan.simic)
    return store.publish_policy(
        model.state_dict(),
        gnn=plan.gnn,
        method="imitation",
        provenance=_provenance(run_ids, records, len(reports), skipped, plan, metrics) | dict(context or {}),
    )


def train_ppo(
    store: SimicStore,
    *,
    version: int,
    rollout_run_ids: Sequence[str],
    demonstration_run_ids: Sequence[str],
    plan: TrainingPlan,
    context: Mapping[str, object] | None = None,
) -> PolicyVersion:
    """One PPO update of ``version`` on its own rollouts; publishes the next version.

    ``context`` joins the version's provenance, as in ``train_imitation``.

    Returns:
        The new version (method ``ppo``, parent ``version``).

    Raises:
        IncompatiblePolicyError: ``version`` was trained on other graph inputs (retrain from
            imitation with the ``train_policy`` flow).
        ValueError: A counterfactual plan found no forked decision among the rollouts.
    """
    parent = store.get_policy(version)
    parent.require_current_inputs()  # before any rollout is read: fine-tuning stale weights is wrong too
    model = TamiyoGNN(parent.gnn)
    model.load_state_dict(store.load_weights(parent))
    records, reports = store.decisions(rollout_run_ids), store.field_reports(rollout_run_ids)
    rollouts, skipped = build_samples(
        records,
        reports,
        param_penalty=plan.simic.param_penalty,
        flops_penalty=plan.simic.flops_penalty,
        reward=plan.reward,
    )
    if plan.reward == "counterfactual" and not rollouts:
        raise ValueError(
            f"no forked decisions in rollouts {list(rollout_run_ids)}: counterfactual PPO learns only from "
            "decisions forked where a choice existed; collect the rollouts with this plan (collect_episodes "
            "forks GNN episodes), raise TrainingPlan.counterfactual.fork_probability or max_forks, or run more rollouts"
        )
    demos, _ = build_samples(
        store.decisions(demonstration_run_ids),
        store.field_reports(demonstration_run_ids),
        param_penalty=plan.simic.param_penalty,
        flops_penalty=plan.simic.flops_penalty,
    )
    metrics = ppo_update(model, rollouts, plan.simic, demonstrations=demos)
    return store.publish_policy(
        model.state_dict(),
        gnn=parent.gnn,
        method="ppo",
        parent_version=version,
        provenance=_provenance(rollout_run_ids, records, len(reports), skipped, plan, metrics)
        | {"demonstration_runs": list(demonstration_run_ids)}
        | dict(context or {}),
    )


def _run_id(settings: EsperSettings, label: str, config: RunConfig) -> str:
    """Deterministic in a fresh registry (the GNN's sampling is seeded by run id); a suffix keeps
    a rerun against the same registry from colliding with an earlier episode."""
    run_id = f"{label}-{config.recipe}-{config.tamiyo.policy}-s{config.seed}"
    if (settings.runs_dir / run_id).exists():
        run_id = f"{run_id}-{new_id()[:6]}"
    return run_id


def _provenance(
    run_ids: Sequence[str],
    records: Sequence[DecisionRecord],
    reports: int,
    skipped: int,
    plan: TrainingPlan,
    metrics: dict[str, float],
) -> dict[str, object]:
    provenance: dict[str, object] = {
        "runs": list(run_ids),
        "decisions": len(records),
        "field_reports": reports,
        "skipped_decisions": skipped,
        "simic": dataclasses.asdict(plan.simic),
        "metrics": metrics,
        "torch": torch.__version__,
    }
    # What each run trained on, as its decisions recorded it: a varied plan's policy says which
    # widths, data shares and noise rates it saw (the recipe's own task records nothing).
    tasks = {r.state.current.run_id: r.state.task for r in records if r.state.task is not None}
    if tasks:
        provenance["variation"] = dataclasses.asdict(plan.variation)
        provenance["tasks"] = tasks
    return provenance
