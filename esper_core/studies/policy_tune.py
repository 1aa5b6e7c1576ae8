"""Fine-tune the shipped policy on one recipe, from scaled-down proxies of it (``esper policy tune``).

The shipped policy was trained over the host zoo, never on the user's own model, and a Simic
training on the user's full recipe would take hours of its episodes. Tuning buys most of that
cheaply: PPO continues from the shipped weights on exploring episodes of a *proxy* of the recipe
(the host at a smaller width where the recipe can scale it, a share of the training split:
``TaskVariation`` draws it; as many epochs as the recipe by default, because whether growth pays
depends on how long the grown network trains), and the published
versions are chosen among (the shipped one included) on the proxy's selection seeds, scored as a
zoo training scores them (validation quality less ``flops_penalty`` per doubling of training
FLOPs over the no-growth run). Only then does the chosen version meet the shipped one on the full
recipe, on held-out evaluation seeds (0, 1, ...) that nothing was chosen on: paired test accuracy
(a language model's test bits) with a BCa interval, and the verdict that follows from it.

Three disjoint seed sets, as in a zoo training: proxy rollouts from 1000, selection from 2000,
evaluation from 0. Every version is published to this installation's registry, so a run can pin
the chosen one (``esper run --policy gnn:<N>``).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from esper_core.data import load_dataset
from esper_core.fanout import LOCAL, Pool
from esper_core.hosts import HostConfig
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.kernels import publish_missing_kernels
from esper_core.run.recipes import get_recipe
from esper_core.run.scores import bits, token_targets
from esper_core.settings import EsperSettings
from esper_core.simic.learn import SimicConfig
from esper_core.simic.records import SimicStore
from esper_core.simic.shipping import publish_shipped, require_current_inputs
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.simic_train import TrainingPlan, episode_jobs, run_episodes, train_ppo
from esper_core.studies.variation import TaskVariation
from esper_core.studies.zoo_train import selection_score
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.tamiyo.shipped import DEFAULT_SHIPPED, SHIPPED, read_shipped
from esper_core.telemetry.paired import PairedDifference, paired_difference

log = logging.getLogger(__name__)

FIRST_ROLLOUT_SEED = 1000
FIRST_SELECTION_SEED = 2000

Progress = Callable[[str, int, int], None]


@dataclass(kw_only=True, slots=True)
class TuneConfig:
    """One tuning of a shipped policy on a recipe.

    Attributes:
        recipe: A built-in recipe or ``package.module:function`` (a user's model).
        episodes: Exploring proxy episodes PPO learns from, spread evenly over ``iterations``.
        iterations: PPO updates, each publishing a version.
        shipped: The shipped policy tuned from (``esper policy list``).
        proxy_width: Host width factor of the proxy episodes; None: 0.5 where the recipe's host
            can be scaled (a built-in host with hidden layers, a ``ModelSpec`` with
            ``build_scaled``), else 1.0.
        proxy_data: Share of the training split each proxy episode keeps (validation untouched).
        proxy_epochs: Epochs of a proxy episode; None: the evaluation's (``epochs``, else the
            recipe's). Shorter proxies are cheaper but can teach the wrong lesson: where growth
            pays only over a long run, a short proxy rewards not growing (measured in docs/zoo.md,
            "Tuning the shipped policy to one recipe").
        selection_seeds: Proxy seeds (from 2000) every version plays greedily to be chosen on.
        eval_seeds: Held-out seeds (0, 1, ...) of the full recipe on which the chosen version
            meets the shipped one.
        epochs: Epochs of the evaluation runs; None: the recipe's.
        flops_penalty: What the reward and the selection charge per doubling of training FLOPs,
            in validation-accuracy units (the zoo training's 0.01: one point).
        ppo_lr: PPO's learning rate, ten times a zoo training's (``SimicConfig.ppo_lr``): at the
            zoo's rate a tuning's few updates barely move the shipped policy's greedy choices.
        ppo_epochs: Passes over each update's rollouts.
        device: Where episodes train.
    """

    recipe: str
    episodes: int = 48
    iterations: int = 4
    shipped: str = DEFAULT_SHIPPED
    proxy_width: float | None = None
    proxy_data: float = 0.5
    proxy_epochs: int | None = None
    selection_seeds: int = 2
    eval_seeds: int = 8
    epochs: int | None = None
    flops_penalty: float = 0.01
    ppo_lr: float = 3e-3
    ppo_epochs: int = 8
    device: str = "cpu"
    _config: RunConfig | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1 (each is one PPO update), got {self.iterations}")
        if self.episodes < self.iterations or self.episodes % self.iterations:
            raise ValueError(
                f"episodes ({self.episodes}) must be a positive multiple of iterations ({self.iterations}): "
                f"each PPO update learns from episodes / iterations rollouts, e.g. --episodes {2 * self.iterations}"
            )
        if self.shipped not in SHIPPED:
            raise ValueError(f"unknown shipped policy {self.shipped!r}; `esper policy list` shows {sorted(SHIPPED)}")
        if self.proxy_width is not None and not self.proxy_width > 0:
            raise ValueError(f"proxy_width must be a width factor > 0 (0.5: half as wide), got {self.proxy_width}")
        if not 0.0 < self.proxy_data <= 1.0:
            raise ValueError(f"proxy_data must be a share of the training split in (0, 1], got {self.proxy_data}")
        if self.proxy_epochs is not None and self.proxy_epochs < 2:
            raise ValueError(f"proxy_epochs must be >= 2 (a reward needs two epochs), got {self.proxy_epochs}")
        if self.selection_seeds < 1:
            raise ValueError(f"selection_seeds must be >= 1, got {self.selection_seeds}")
        if self.eval_seeds < 2:
            raise ValueError(f"eval_seeds must be >= 2 (a paired interval needs two seeds), got {self.eval_seeds}")
        # Three disjoint seed sets: nothing is chosen on a seed it is then scored on.
        if self.episodes > FIRST_SELECTION_SEED - FIRST_ROLLOUT_SEED:
            raise ValueError(
                f"episodes ({self.episodes}) would run into the selection seeds from {FIRST_SELECTION_SEED}: "
                f"use at most {FIRST_SELECTION_SEED - FIRST_ROLLOUT_SEED}"
            )
        if self.eval_seeds > FIRST_ROLLOUT_SEED or self.selection_seeds > FIRST_ROLLOUT_SEED:
            raise ValueError(
                f"eval_seeds and selection_seeds must be at most {FIRST_ROLLOUT_SEED}, got {self.eval_seeds} and "
                f"{self.selection_seeds}: more would reuse the seeds the policy is tuned on"
            )
        if self.epochs is not None and self.epochs < 2:
            raise ValueError(f"epochs must be >= 2, got {self.epochs}")
        if self.ppo_lr <= 0 or self.ppo_epochs < 1:
            raise ValueError(f"need ppo_lr > 0 and ppo_epochs >= 1, got {self.ppo_lr} and {self.ppo_epochs}")
        if self.flops_penalty < 0:
            raise ValueError(f"flops_penalty must be >= 0 (0: FLOPs are free), got {self.flops_penalty}")
        # The recipe last: an unknown name or a bad import path fails here, with get_recipe's fix.
        self._config = get_recipe(self.recipe, epochs=self.epochs, device=self.device)
        if self.proxy_width not in (None, 1.0) and not scalable(self._config):
            raise ValueError(
                f"recipe {self.recipe!r}'s host cannot be built at another width (a built-in host without hidden "
                "layers, or a ModelSpec without build_scaled): tune at its own width with proxy_width=1.0 "
                "(esper policy tune --proxy-width 1), or give its ModelSpec build_scaled"
            )

    @property
    def config(self) -> RunConfig:
        """The recipe with the evaluation's epochs and device."""
        assert self._config is not None  # set in __post_init__
        return self._config

    @property
    def width(self) -> float:
        """The proxy's width factor, resolved."""
        if self.proxy_width is not None:
            return self.proxy_width
        return 0.5 if scalable(self.config) else 1.0

    @property
    def proxy(self) -> TaskVariation:
        return TaskVariation(widths=(self.width,), train_fractions=(self.proxy_data,))

    @property
    def rollouts(self) -> int:
        return self.episodes // self.iterations

    def plan(self, gnn: TamiyoGNNConfig) -> TrainingPlan:
        """The proxy episodes' plan: its epochs, task and PPO's settings (the shipped network's size)."""
        epochs = self.proxy_epochs or self.config.epochs
        return TrainingPlan(
            demonstrations=1,  # unused: PPO starts from the shipped weights, not from imitation
            iterations=self.iterations,
            rollouts=self.rollouts,
            epochs=epochs,
            gnn=gnn,
            simic=SimicConfig(flops_penalty=self.flops_penalty, ppo_lr=self.ppo_lr, ppo_epochs=self.ppo_epochs),
            variation=self.proxy,
        )


def scalable(config: RunConfig) -> bool:
    """Whether ``config``'s host can be built at another width (so a proxy can be narrower)."""
    host = config.host
    if isinstance(host, ModelSpec):
        return host.build_scaled is not None
    return isinstance(host, HostConfig) and host.scaled(0.5) != host


@dataclass(kw_only=True, slots=True)
class TuneResult:
    """What a tuning did and found (``as_dict`` for JSON).

    Attributes:
        shipped_version: The registry version the shipped policy is served as.
        versions: The versions tuning published, in order.
        chosen: The version chosen on the proxy's selection seeds (may be the shipped one).
        selection: Per version label (``none``, ``shipped``, ``v<N>``), its mean selection score.
        shipped_runs: The shipped policy's evaluation runs, one per evaluation seed.
        tuned_runs: The chosen version's (empty when the shipped one was chosen).
        language_model: Whether the recipe's score is bits per token (lower is better).
        proxy: The proxy's width, data share and epochs.
        settings: The tuning's other settings (episodes, iterations, PPO's, the seed counts).
        wall_s: Seconds by phase.
    """

    recipe: str
    shipped: str
    shipped_version: int
    versions: list[int]
    chosen: int
    selection: dict[str, float]
    shipped_runs: list[EpisodeResult]
    tuned_runs: list[EpisodeResult]
    language_model: bool
    proxy: dict[str, Any]
    settings: dict[str, Any]
    wall_s: dict[str, float]

    def _test(self, runs: Sequence[EpisodeResult]) -> list[float]:
        # Points of accuracy, or bits per token: the units a user reads.
        return [bits(r.test_loss) if self.language_model else 100 * r.test_accuracy for r in runs]

    @property
    def difference(self) -> PairedDifference | None:
        """Tuned minus shipped on the evaluation seeds' test split; None when the shipped was chosen."""
        if not self.tuned_runs:
            return None
        return paired_difference(
            self._test(self.tuned_runs), self._test(self.shipped_runs), higher_is_better=not self.language_model
        )

    @property
    def verdict(self) -> str:
        """One line: did tuning beat the shipped policy, and what to run next."""
        n = len(self.shipped_runs)
        if self.chosen == self.shipped_version:
            return (
                "no tuned version beat the shipped policy on the proxy's selection seeds: keep serving it "
                f"(esper run --recipe {self.recipe} --policy {self.shipped})"
            )
        diff = self.difference
        assert diff is not None
        serve = f"esper run --recipe {self.recipe} --policy gnn:{self.chosen}"
        unit, digits = ("bits", 4) if self.language_model else ("points", 2)
        said = (
            f"{diff.mean:+.{digits}f} {unit} [{diff.ci95_low:+.{digits}f}, {diff.ci95_high:+.{digits}f}] "
            f"on {n} held-out seeds"
        )
        if diff.ci95_low == diff.ci95_high == 0.0:
            return (
                f"tuned v{self.chosen} scored the same as the shipped policy on all {n} held-out seeds: keep serving it"
            )
        if diff.better():
            return f"tuned v{self.chosen} beat the shipped policy: {said}; serve it with `{serve}`"
        # Worse beyond the interval: it excludes 0 on the worse side.
        if (diff.ci95_high < 0) if diff.higher_is_better else (diff.ci95_low > 0):
            return f"tuned v{self.chosen} is worse than the shipped policy: {said}; keep serving the shipped one"
        return (
            f"not resolved: tuned v{self.chosen} - shipped = {said}, an interval across 0; "
            f"run more seeds (--eval-seeds) before serving it (`{serve}`)"
        )

    def as_dict(self) -> dict[str, Any]:
        diff = self.difference
        return {
            "recipe": self.recipe,
            "shipped": self.shipped,
            "shipped_version": self.shipped_version,
            "versions": self.versions,
            "chosen": self.chosen,
            "selection": self.selection,
            "proxy": self.proxy,
            "settings": self.settings,
            "metric": "test bits per token" if self.language_model else "test accuracy, points",
            "eval_seeds": [r.seed for r in self.shipped_runs],
            "shipped_test": self._test(self.shipped_runs),
            "tuned_test": self._test(self.tuned_runs),
            "tuned_minus_shipped": None if diff is None else diff.as_dict(),
            "train_flops_ratio": (
                statistics.fmean(
                    t.train_flops / s.train_flops for t, s in zip(self.tuned_runs, self.shipped_runs, strict=True)
                )
                if self.tuned_runs
                else None
            ),
            "verdict": self.verdict,
            "wall_s": self.wall_s,
        }


def tune_policy(
    settings: EsperSettings, config: TuneConfig, *, pool: Pool = LOCAL, progress: Progress | None = None
) -> TuneResult:
    """Tune ``config.shipped`` on ``config.recipe`` (module docstring); versions land in ``settings``' registry.

    Raises:
        ShippedPolicyError: The shipped policy's bytes are not the released ones.
        IncompatiblePolicyError: It was trained on other graph inputs than this Esper builds.
        ValueError: A proxy the recipe cannot take.
        Each before any episode runs.
    """
    report = progress or (lambda _what, _done, _total: None)
    shipped = read_shipped(config.shipped)
    require_current_inputs(shipped)
    gnn = TamiyoGNNConfig(**shipped.gnn)
    plan = config.plan(gnn)
    recipe = config.recipe
    language_model = token_targets(load_dataset(config.config.data))
    wall: dict[str, float] = {}
    start = time.perf_counter()
    publish_missing_kernels(settings, [config.config], device=config.device)
    store = SimicStore.open(settings.home, settings.registry_db_url)
    try:
        # The version of the bytes this Esper ships (published on first use, found after): never an
        # older release's weights that an earlier Esper published under the same name.
        base = publish_shipped(store, config.shipped)
        # Run ids seed the GNN's exploration, so they must follow from the registry's state alone:
        # "tune" for the first tuning in a registry, "tune<N>" after version N exists (no uuid
        # suffix from a clash with an earlier tuning's runs).
        newest = max(p.version for p in store.policies())
        tag = "tune" if newest == base.version else f"tune{newest}"
    finally:
        store.close()
    wall["setup"] = time.perf_counter() - start

    def play(seeds: Sequence[int], policy: str, *, label: str, proxy: bool, **kwargs: Any) -> list[EpisodeResult]:
        jobs = episode_jobs(
            settings,
            recipe=recipe,
            seeds=seeds,
            policy=policy,
            plan=plan if proxy else dataclasses.replace(plan, epochs=config.epochs, variation=TaskVariation()),
            device=config.device,
            label=label,
            **kwargs,
        )
        (results,) = run_episodes([jobs], pool=pool)
        return results

    # Tuning: rollouts of the newest version, one PPO update each.
    start = time.perf_counter()
    versions: list[int] = []
    version = base.version
    proxy: dict[str, Any] = {"width": config.width, "train_fraction": config.proxy_data, "epochs": plan.epochs}
    context = {"tuned_from": config.shipped, "tuned_from_sha256": shipped.sha256, "recipe": recipe, "proxy": proxy}
    for iteration in range(config.iterations):
        report("tuning", iteration, config.iterations)
        seeds = [FIRST_ROLLOUT_SEED + iteration * config.rollouts + k for k in range(config.rollouts)]
        rollouts = play(seeds, "gnn", label=f"{tag}-roll-v{version}", proxy=True, explore=True, policy_version=version)
        store = SimicStore.open(settings.home, settings.registry_db_url)
        try:
            version = train_ppo(
                store,
                version=version,
                rollout_run_ids=[r.run_id for r in rollouts],
                demonstration_run_ids=(),
                plan=plan,
                context=context,
            ).version
        finally:
            store.close()
        versions.append(version)
    wall["tuning"] = time.perf_counter() - start

    # Selection on the proxy: every version and the shipped one, greedy, against no growth.
    start = time.perf_counter()
    selection_seeds = [FIRST_SELECTION_SEED + k for k in range(config.selection_seeds)]
    static = play(selection_seeds, "none", label=f"{tag}-sel", proxy=True)
    scores: dict[str, float] = {"none": _score(static, static, config.flops_penalty, language_model)}
    for k, candidate in enumerate([base.version, *versions]):
        report("selection", k, len(versions) + 1)
        played = play(selection_seeds, "gnn", label=f"{tag}-sel-v{candidate}", proxy=True, policy_version=candidate)
        label = "shipped" if candidate == base.version else f"v{candidate}"
        scores[label] = _score(played, static, config.flops_penalty, language_model)
    best = max((label for label in scores if label != "none"), key=lambda label: scores[label])
    chosen = base.version if best == "shipped" else int(best[1:])
    wall["selection"] = time.perf_counter() - start

    # Evaluation on the full recipe, held-out seeds: the shipped policy and the chosen version.
    start = time.perf_counter()
    eval_seeds = list(range(config.eval_seeds))
    report("evaluation", 0, 2)
    shipped_runs = play(eval_seeds, "gnn", label=f"{tag}-eval-shipped", proxy=False, policy_version=base.version)
    tuned_runs: list[EpisodeResult] = []
    if chosen != base.version:
        report("evaluation", 1, 2)
        tuned_runs = play(eval_seeds, "gnn", label=f"{tag}-eval-v{chosen}", proxy=False, policy_version=chosen)
    wall["evaluation"] = time.perf_counter() - start
    report("evaluation", 2, 2)
    return TuneResult(
        recipe=recipe,
        shipped=config.shipped,
        shipped_version=base.version,
        versions=versions,
        chosen=chosen,
        selection=scores,
        shipped_runs=shipped_runs,
        tuned_runs=tuned_runs,
        language_model=language_model,
        proxy=proxy,
        settings={
            "episodes": config.episodes,
            "iterations": config.iterations,
            "ppo_lr": config.ppo_lr,
            "ppo_epochs": config.ppo_epochs,
            "flops_penalty": config.flops_penalty,
            "selection_seeds": selection_seeds,
            "device": config.device,
        },
        wall_s=wall,
    )


def _score(
    runs: Sequence[EpisodeResult], static: Sequence[EpisodeResult], penalty: float, language_model: bool
) -> float:
    return statistics.fmean(
        selection_score(r, s, flops_penalty=penalty, language_model=language_model)
        for r, s in zip(runs, static, strict=True)
    )


def format_result(result: TuneResult) -> str:
    """The tuning as a person reads it."""
    d = result.as_dict()
    proxy = d["proxy"]
    lines = [
        f"tuned {result.shipped} (registry v{result.shipped_version}) on {result.recipe}: "
        f"{len(result.versions)} PPO update(s) -> v{', v'.join(map(str, result.versions))}",
        f"proxy: width x{proxy['width']:g}, {proxy['train_fraction']:.0%} of the training split, {proxy['epochs']} epochs",
        "selection (proxy, greedy): "
        + ", ".join(f"{label} {score:.4f}" for label, score in result.selection.items())
        + f"; chosen: {'shipped' if result.chosen == result.shipped_version else f'v{result.chosen}'}",
        f"evaluation ({d['metric']}, seeds {d['eval_seeds']}): shipped "
        + " ".join(f"{v:.4g}" for v in d["shipped_test"])
        + (
            f"; tuned {' '.join(f'{v:.4g}' for v in d['tuned_test'])} "
            f"(training FLOPs x{d['train_flops_ratio']:.2f} the shipped policy's)"
            if d["tuned_test"]
            else ""
        ),
        result.verdict,
    ]
    if result.selection["none"] > max(v for k, v in result.selection.items() if k != "none"):
        lines.append(
            "note: on the proxy, no growth scored above every version: growth may not pay on this recipe at "
            "this budget (esper run --policy none trains it static)"
        )
    return "\n".join(lines)


__all__ = ["TuneConfig", "TuneResult", "format_result", "scalable", "tune_policy"]
