"""The best single fixed rule over the zoo: the heuristic's thresholds searched on selection seeds,
then scored against static networks of its own grown shape on hosts the search never drew.

Issue 35 asks that the heuristic, the controller's fallback, become "the best single fixed rule
found over the zoo, so that the fallback is not worse than static either", and that the learned
policies be compared with that rule. ``run`` does it in two steps that share no seed and no host:

1. **Search** (``ZooTraining``'s members and *selection* seeds, the ones a zoo policy is chosen
   on): every rule of ``rules`` plays every member on every selection seed, with no growth as
   the yardstick, and is scored as a policy version is (``zoo_train.score_episodes``: validation
   accuracy, or a language model's validation bits, less ``flops_penalty`` per extra multiple of
   the no-growth run's training FLOPs).
   The best score is chosen (the first of a tie in grid order, so the default holds a tie).
2. **Evaluation** (the first ``seeds`` *evaluation* seeds, on ``eval_members`` members of each
   family drawn from the zoo under another seed, ``eval_zoo_seed``): per (member, seed), paired,
   the arms

   =============  ===========================================================================
   ``rule``       the chosen rule
   ``heuristic``  the rule the chosen one is set against (``compare_with``: the heuristic's
                  defaults before this search chose new ones)
   ``none``       no growth
   ``static``     the host in the ``rule`` run's final shape, trained from scratch
   ``tuned``      that static network with its weight decay chosen on validation
   =============  ===========================================================================

   with the paired differences' BCa intervals and the issue's goal per family (rule minus tuned:
   mean >= 0, lower bound >= -0.5 points; bits per character: mean <= 0, upper bound <= +0.01).

A rule is a ``HeuristicConfig`` on the member's own: when the first seed germinates
(``probe_epoch``), how flat validation loss must be for the next (``plateau_rel_tol``), and how
much a widening adds (``prefer``: one entry of Karn's width menu). Width slots only, as in the
transfer benchmark (the static network of a grown shape is the host at other widths).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esper_core._capabilities import one_thread
from esper_core.fanout import FanOut, Pool
from esper_core.karn.width import WIDTH_MENU
from esper_core.run.config import RunConfig
from esper_core.settings import EsperSettings
from esper_core.simic.record_types import BITS_WORTH
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.growth import in_home
from esper_core.studies.simic_train import episode_jobs, run_episodes
from esper_core.studies.yardstick import (
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
from esper_core.studies.zoo_train import ZooTraining, score_episodes, zoo_members
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.telemetry.baseline import save_result_with_plot
from esper_core.zoo import Family, ZooMember

Progress = Callable[[str, int, int], None]

ARMS = arms_around("rule")
"""The arms of an evaluated (member, seed), in report order (module docstring)."""

PAIRS = pairs_around("rule")
"""The paired differences reported, ``a - b``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One fixed growth rule: the heuristic with these thresholds.

    Attributes:
        name: Its name in reports.
        probe_epoch: The epoch the first seed germinates at without a plateau.
        plateau_rel_tol: A relative improvement of validation loss over two epochs below this
            germinates the next seed (0.5 germinates nearly whenever a slot is free).
        width_step: The width-menu entry each widening germinates (``width-25`` adds a quarter
            of the layer's units: the lowest-risk entry, which the heuristic took before it
            preferred ``width-100``).

    The defaults are ``HeuristicConfig``'s (the rule this search chose on 2026-11-28).
    """

    name: str
    probe_epoch: int = 0
    plateau_rel_tol: float = 0.01
    width_step: str = "width-100"

    def __post_init__(self) -> None:
        if self.width_step not in WIDTH_MENU:
            raise ValueError(
                f"width_step {self.width_step!r} is not on the width menu; choose one of {list(WIDTH_MENU)}"
            )
        # The heuristic's own checks, with its messages, before any episode runs.
        self.heuristic(HeuristicConfig())

    def heuristic(self, base: HeuristicConfig) -> HeuristicConfig:
        """``base`` (a member's heuristic) with this rule's thresholds."""
        return dataclasses.replace(
            base, probe_epoch=self.probe_epoch, plateau_rel_tol=self.plateau_rel_tol, prefer=(self.width_step,)
        )


DEFAULT_RULE = Rule(name="p0-t0.01-width-100")
"""The zoo members' own heuristic: ``HeuristicConfig``'s defaults (probe at epoch 0, 1 % plateau,
doubling), which this search chose on 2026-11-28 (its JSON calls the rule then default
``default``: ``PREVIOUS_RULE``)."""

PREVIOUS_RULE = Rule(name="p1-t0.01-width-25", probe_epoch=1, width_step="width-25")
"""The heuristic's defaults before 2026-11-28 (probe at epoch 1, 1 % plateau, the lowest-risk
25 % widening): the rule the search's choice is set against."""


def rule_grid() -> tuple[Rule, ...]:
    """The default rule first, then every other combination of a probe at epoch 0 or 1, a plateau
    tolerance of 1, 10 or 50 %, and widening by 25, 50 or 100 % (18 rules)."""
    grid = [DEFAULT_RULE]
    default = (DEFAULT_RULE.probe_epoch, DEFAULT_RULE.plateau_rel_tol, DEFAULT_RULE.width_step)
    for probe, tol, step in itertools.product((0, 1), (0.01, 0.1, 0.5), WIDTH_MENU):
        if (probe, tol, step) != default:
            grid.append(Rule(name=f"p{probe}-t{tol:g}-{step}", probe_epoch=probe, plateau_rel_tol=tol, width_step=step))
    return tuple(grid)


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleSearchConfig:
    """One rule search and its evaluation.

    Attributes:
        training: The zoo, its members and seeds, as a zoo policy's training has them: the search
            plays its members on ``seeds.selection``, the evaluation runs ``seeds.evaluation``,
            and ``plan.simic.flops_penalty`` is the score's price of compute.
        rules: The rules searched (distinct names; the first holds a tie).
        compare_with: The ``heuristic`` arm's rule, pinned so that a rerun compares the same two
            rules whatever the defaults are then.
        families: The families evaluated.
        eval_zoo_seed: The zoo seed the evaluated members are drawn under; another than the
            search's, so that no evaluated host was searched on.
        eval_members: Members of each family evaluated.
        seeds: How many of ``training.seeds.evaluation`` (the first ones) each member runs.
        weight_decays: The tuned arm's grid (0 among them: the ``static`` arm is its 0).
        workers: Dask worker processes (one thread each); 0: here, one thread.
        device: Where runs train.
    """

    training: ZooTraining = field(default_factory=ZooTraining)
    rules: tuple[Rule, ...] = field(default_factory=rule_grid)
    compare_with: Rule = PREVIOUS_RULE
    families: tuple[Family, ...] | None = None
    eval_zoo_seed: int = 1
    eval_members: int = 2
    seeds: int = 5
    weight_decays: tuple[float, ...] = (0.0, 1e-4, 1e-3)
    workers: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        zoo = self.training.zoo
        if not self.rules:
            raise ValueError("rules is empty: search at least one rule (rule_grid() is the default)")
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names repeat: {names}; name each rule once")
        families = self.evaluated_families
        if missing := [f for f in families if f not in zoo.families]:
            raise ValueError(f"families {missing} are not in the zoo's families {zoo.families}: evaluate those")
        if self.training.exclude_families:
            raise ValueError(
                f"training.exclude_families={self.training.exclude_families}: leave it empty, one rule is "
                "searched over the whole zoo"
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
    def evaluated_families(self) -> tuple[Family, ...]:
        """``families``, or every family of the zoo."""
        return self.training.zoo.families if self.families is None else self.families

    @property
    def evaluation_seeds(self) -> tuple[int, ...]:
        """The seeds every evaluated member runs."""
        return self.training.seeds.evaluation[: self.seeds]

    def evaluated_members(self, family: Family) -> list[ZooMember]:
        """The first ``eval_members`` members of ``family`` under ``eval_zoo_seed``."""
        return evaluated_members(
            self.training, family, eval_zoo_seed=self.eval_zoo_seed, eval_members=self.eval_members
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleJob:
    """Every arm of one evaluated member and seed (a unit of fan-out)."""

    member: ZooMember
    seed: int
    home: str
    rule: Rule
    compare_with: Rule
    weight_decays: tuple[float, ...]
    device: str


def rule_runs(job: RuleJob) -> dict[str, Any]:
    """Run ``job``'s arms on one torch thread: ``{arm: EpisodeResult}`` and the tuned arm's grid."""
    with one_thread():
        run = ArmRunner(job.member, job.seed, EsperSettings(home=Path(job.home)), label="rules", device=job.device)
        base = job.member.recipe().tamiyo.heuristic
        runs = {
            "rule": run("heuristic", f"rule-{job.rule.name}", heuristic=job.rule.heuristic(base)),
            "heuristic": run(
                "heuristic", f"compared-{job.compare_with.name}", heuristic=job.compare_with.heuristic(base)
            ),
            "none": run("none", "none"),
        }
        matched = run.shape_matched(runs["rule"].widths, job.weight_decays)
        runs["static"], runs["tuned"] = matched.pop("static"), matched.pop("tuned")
        return {"runs": runs, **matched}


def _with_rule(recipe: RunConfig, rule: Rule) -> RunConfig:
    tamiyo = dataclasses.replace(recipe.tamiyo, heuristic=rule.heuristic(recipe.tamiyo.heuristic))
    return dataclasses.replace(recipe, tamiyo=tamiyo)


def search(settings: EsperSettings, config: RuleSearchConfig, *, pool: Pool, progress: Progress) -> dict[str, Any]:
    """Play every rule (and no growth) on every member's selection seeds; score and choose."""
    training = config.training
    members = zoo_members(training)
    family = {m.name: m.family for m in members}
    by_name = {m.name: m for m in members}
    seeds = training.seeds.selection
    penalty = training.plan.simic.flops_penalty

    def play(policy: str, label: str, rule: Rule | None = None) -> list[EpisodeResult]:
        batches = [
            episode_jobs(
                settings,
                recipe=m.recipe() if rule is None else _with_rule(m.recipe(), rule),
                seeds=seeds,
                policy=policy,
                plan=training.plan,
                device=config.device,
                label=label,
            )
            for m in members
        ]
        return [r for batch in run_episodes(batches, pool=pool) for r in batch]

    progress("search: no growth", 0, len(config.rules))
    static = {(r.recipe, r.seed): r for r in play("none", "rules-none")}
    none = score_episodes("none", list(static.values()), static, penalty, by_name)
    scores = []
    for done, rule in enumerate(config.rules):
        progress(f"search: {rule.name}", done, len(config.rules))
        episodes = play("heuristic", f"rules-{rule.name}", rule)
        scores.append(
            {
                "rule": dataclasses.asdict(rule),
                **dataclasses.asdict(score_episodes(rule.name, episodes, static, penalty, by_name)),
                "germinations_mean": sum(_germinations(r) for r in episodes) / len(episodes),
            }
        )
    # max() keeps the first of equal scores: the grid's order breaks a tie.
    chosen = max(range(len(config.rules)), key=lambda i: scores[i]["score"])
    return {
        "members": family,
        "seeds": list(seeds),
        "flops_penalty": penalty,
        "none": dataclasses.asdict(none),
        "scores": scores,
        "chosen": config.rules[chosen].name,
    }


def _germinations(result: EpisodeResult) -> int:
    return result.commands.get("germinate", 0)


def evaluate(
    config: RuleSearchConfig, rule: Rule, *, pool: Pool, home: Path, progress: Progress
) -> dict[str, dict[str, Any]]:
    """Step 2 alone: ``rule`` against ``compare_with``, no growth and the static networks of its
    grown shape, on each evaluated family's members and the evaluation seeds; per family the
    summary of ``yardstick.summarise_arms`` (subject ``rule``) and its wall seconds."""
    results: dict[str, dict[str, Any]] = {}
    families = config.evaluated_families
    for done, family in enumerate(families):
        progress(f"evaluating {rule.name} on {family}", done, len(families))
        members = config.evaluated_members(family)
        jobs = [
            RuleJob(
                member=m,
                seed=seed,
                home=str(home),
                rule=rule,
                compare_with=config.compare_with,
                weight_decays=config.weight_decays,
                device=config.device,
            )
            for m in members
            for seed in config.evaluation_seeds
        ]
        evaluated_at = time.perf_counter()
        outcomes = pool.map(rule_runs, jobs)
        results[family] = {
            **summarise_arms(
                members, jobs, outcomes, metric=member_metric(members[0]), arms=ARMS, pairs=PAIRS, subject="rule"
            ),
            "evaluation_s": round(time.perf_counter() - evaluated_at, 2),
        }
    return results


def run(config: RuleSearchConfig, *, progress: Progress | None = None) -> dict[str, Any]:
    """Search the rules, then evaluate the chosen one on every family (module docstring).

    Returns:
        The JSON-able result: the search's scores and choice, per family every run, each arm's
        summary, the paired differences and the goal.
    """
    report = progress or (lambda _what, _done, _total: None)
    start = time.perf_counter()
    families = config.evaluated_families
    with FanOut(workers=config.workers).open() as pool, in_home(None, prefix="esper-rules-") as home:
        settings = EsperSettings(home=home)
        searched_at = time.perf_counter()
        selection = search(settings, config, pool=pool, progress=report)
        selection["search_s"] = round(time.perf_counter() - searched_at, 2)
        rule = next(r for r in config.rules if r.name == selection["chosen"])
        results = evaluate(config, rule, pool=pool, home=home, progress=report)
    report("done", len(families), len(families))
    return {
        "bench": "rules",
        "rule": dataclasses.asdict(rule),
        "compared_with": dataclasses.asdict(config.compare_with),
        "selection": selection,
        "families": list(families),
        "evaluation_seeds": list(config.evaluation_seeds),
        "eval_zoo_seed": config.eval_zoo_seed,
        "eval_members": config.eval_members,
        "weight_decays": list(config.weight_decays),
        "zoo": dataclasses.asdict(config.training.zoo),
        "workers": config.workers,
        "device": config.device,
        "wall_s": round(time.perf_counter() - start, 2),
        "results": results,
        "across_families": across_families(results, pairs=PAIRS, subject="rule"),
    }


def save_baseline(result: Mapping[str, Any], directory: Path) -> tuple[Path, Path]:
    """Write ``rules.json`` and ``rules_flops.png`` into ``directory``; returns both paths."""
    png = arms_png(result, arms=ARMS, title=f"{result['rule']['name']} on {{}}".format)
    return save_result_with_plot(result, directory, json_name="rules.json", png_name="rules_flops.png", png=png)


def format_table(result: Mapping[str, Any], *, top: int = 8) -> str:
    """The search's best ``top`` rules (and the grid's first, the default, and no growth), then per
    family each arm's score, FLOPs and wall, and the paired differences."""
    selection = result["selection"]
    ranked = sorted(selection["scores"], key=lambda s: -s["score"])
    shown = ranked[:top] + [s for s in ranked[top:] if s["label"] == result["selection"]["scores"][0]["label"]]
    lines = [
        f"search: {len(ranked)} rules on {len(selection['members'])} members x seeds {selection['seeds']} "
        f"(score = val accuracy, or -{BITS_WORTH:g} x a language model's val bits, "
        f"- {selection['flops_penalty']:g} x (FLOPs / no growth's - 1))"
    ]
    for s in [*shown, {**selection["none"], "germinations_mean": 0.0}]:
        lines.append(
            f"  {s['label']:<22} score {s['score']:.4f}  val acc {s['val_accuracy']:.4f}  "
            f"FLOPs x{s['flops_ratio']:.2f}  germinations {s['germinations_mean']:.2f}"
            + (f"  halted {s['halted']}" if s.get("halted") else "")
        )
    lines.append(f"chosen: {selection['chosen']}")
    for family, r in result["results"].items():
        lines.append(f"\n{family} ({r['pairs']} pairs, {r['metric_label']})")
        lines += format_arms(r, subject="rule", label="rule")
    return "\n".join(lines)


__all__ = [
    "ARMS",
    "DEFAULT_RULE",
    "PAIRS",
    "PREVIOUS_RULE",
    "Rule",
    "RuleJob",
    "RuleSearchConfig",
    "evaluate",
    "format_table",
    "rule_grid",
    "rule_runs",
    "run",
    "save_baseline",
    "search",
]
