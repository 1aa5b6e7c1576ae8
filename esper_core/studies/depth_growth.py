"""The depth-growth benchmark: validation loss against cumulative training FLOPs, static or stacked.

Does growing a transformer by depth reach the static network's loss with less compute (issue 36)?
For each evaluation seed, whole runs of one language-model recipe (by default ``chars-gpt-growth``,
4 blocks, and its ``-start`` variant, 2 blocks), every run on the recipe's schedule family (a
constant rate with the shared cooldown) and its training tokens, fixed before any arm runs:

- ``static-final``: the final-size network, never grown (the yardstick);
- ``static-start``: the start-size network, never grown;
- ``stack-A-B``: the start network deepened by two stacked depth seeds (copies of the last trained
  block, Adam moments copied: ``depth-stack``) germinated by policy ``scheduled`` after epochs A
  and B (0-based). One such seed inserts one block after the stack's last one, and the stack's one
  depth slot holds one seed at a time, so 2 -> 4 blocks takes two insertions, the second once the
  first has merged (``DepthGrowthConfig.lifecycle_epochs`` apart);
- ``stack-all-A``: the start network doubled by one seed germinated after epoch A that copies the
  whole trained stack, in order, with its Adam moments (``depth-stack-all``: G_stack's operator,
  ``b0 b1`` -> ``b0 b1 b0 b1``);
- ``controller``: Tamiyo's heuristic on the start network, free to deepen it when and as often as
  its rules say;
- ``static-narrow``: the final network at half its width (``narrow_recipe``), never grown;
- ``widen-A``: that narrow network's width doubled in place after epoch A (a stream seed,
  ``stream-2x``: function-preserving, kept at once), which gives it exactly the final network's
  shape;
- ``widen-controller``: Tamiyo's heuristic on the narrow network, free to double its width when
  its rules say (with the recipe's caps the risk engine vetoes a second doubling);
- ``widen-plateau`` (``-wN`` for a window of N epochs): the heuristic with no probe epoch,
  doubling the narrow network's width on the first epoch whose validation loss improved on the
  one ``DepthPlan.widen_plateau_window`` epochs before by less than ``DepthPlan.widen_plateau``
  (a plateau): when to grow read off the run, not fixed; ``-fromP`` when it also waits until P %
  of the run is done (``DepthPlan.widen_plateau_from``: the heuristic's ``grow_from``).

After every epoch a run records its cumulative training FLOPs (the growth benchmark's counter:
3 x the forward FLOPs of the network it trained, seeds in isolation and culled seeds included,
x the training samples) and its validation loss (``EpisodeResult.curve``).
``esper_core.studies.depth_growth_report`` turns the runs into, paired by seed, the training FLOPs
each arm needed to reach the ``static-final`` network's final validation loss and its loss at
equal FLOPs, with bootstrap 95 % intervals; the table and the plot. A run that halted keeps its
pair, its curve ending at its last commit's validation loss (``episodes.run_episode``).

Evaluation seeds are 0 .. seeds - 1; the recipe's learning rate was chosen on selection seeds
from 1000 (``bench/chars_lr.py``), which this benchmark refuses.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import TensorDataset

from esper_core._capabilities import one_thread
from esper_core.data import DataSpec, DataSplits
from esper_core.fanout import FanOut
from esper_core.kasmina.depth import DEPTH_SLOT_SUFFIX
from esper_core.kasmina.stream import STREAM_SLOT
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.studies.depth_growth_report import summarise
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.studies.growth import SPLIT_SEED, fresh_run_id, in_home
from esper_core.tamiyo.config import ScheduledGermination

Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: called after every run."""

FIRST_SELECTION_SEED = 1000
"""Seeds from here chose the recipe's learning rate (``bench/chars_lr.py``); never evaluated on."""
STACK_BLUEPRINT = "depth-stack"
"""A copy of the stack's last trained block, its Adam moments copied."""
STACK_ALL_BLUEPRINT = "depth-stack-all"
"""A copy of the whole trained stack, in order, its Adam moments copied (G_stack)."""
WIDEN_BLUEPRINT = "stream-2x"
"""The network's width doubled in place, its function kept (HyperCloning-style)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DepthPlan:
    """How big a depth-growth benchmark is.

    Attributes:
        seeds: Paired evaluation seeds.
        epochs: Epochs per run (None: the recipe's).
        growth_points: The ``stack-*`` arms: per arm, the epochs (0-based) after which a
            one-block depth seed is germinated; each arm's insertions must together reach the
            final depth.
        stack_all_points: The ``stack-all-*`` arms: per arm, the epoch (0-based) after which the
            whole stack is copied once (the start depth doubled must be the final depth).
        static_budgets: The ``static-final-<E>ep`` arms: the final-size network trained for E
            epochs on the recipe's schedule, its cooldown in its own last epochs, so the static
            network has a point at each smaller budget (its frontier of loss against FLOPs).
        growing: Run the start network's arms (``static-start``, the stacked ones, ``controller``);
            False runs the final-size network alone (``static-final`` and its budgets).
        controls: With ``growing``, run ``static-start`` and ``controller`` beside the stacked arms; False runs
            ``static-final`` and the stacked arms alone, for merging (``--merge-with``) with an
            earlier result of the same epochs that has them.
        train_windows: Training windows kept of the recipe's data, and a quarter as many
            validation and test windows (None: the recipe's whole data). Only the smoke plan cuts
            the data, so CI runs every arm in seconds.
        widen_points: The ``widen-*`` arms: per arm, the epoch (0-based) after which the narrow
            network's width doubles; with any, ``static-narrow`` and ``widen-controller`` run too.
        widen_controls: With ``widen_points``, run ``static-narrow`` and ``widen-controller``
            beside the widened arms; False runs ``static-final`` and the widened arms alone, for
            merging with an earlier result of the same epochs that has them.
        widen_plateau: Run ``widen-plateau``: the heuristic's plateau threshold (a relative
            improvement of validation loss over ``widen_plateau_window`` epochs, 0.029 = 2.9 %)
            at which it doubles the narrow network; None: no such arm.
        widen_plateau_window: The epochs that improvement is measured over; the arm is named
            ``widen-plateau-w<N>`` for more than one.
        widen_plateau_from: The share of the run before which the plateau arm doubles nothing
            (``HeuristicConfig.grow_from``); the arm's name ends ``-from<P>`` (P in %) when it
            is not 0.
        first_fresh_seed: The lowest evaluation seed the plan may score: a plan whose rule was
            shaped by seeds below it refuses them (``--first-seed``).
    """

    seeds: int
    epochs: int | None
    growth_points: tuple[tuple[int, ...], ...]
    stack_all_points: tuple[int, ...] = ()
    static_budgets: tuple[int, ...] = ()
    growing: bool = True
    controls: bool = True
    train_windows: int | None = None
    widen_points: tuple[int, ...] = ()
    widen_controls: bool = True
    widen_plateau: float | None = None
    widen_plateau_window: int = 1
    widen_plateau_from: float = 0.0
    first_fresh_seed: int = 0


PLANS: dict[str, DepthPlan] = {
    # The recipe's 8 epochs. Two one-block insertions 4 epochs apart (a stacked seed's lifecycle
    # with 1-epoch blending) fit after epochs 0 and 4, both merged by the end (measured on 2 seeds
    # before the whole-stack operator existed, with 1 and 5 as well: docs/growth-benchmark.md).
    # The whole stack copied once, early (after epoch 1) or at G_stack's usual point, about
    # half-way (after epoch 3: isolated in 4, blended in 5, judged in 6, merged for epoch 7).
    "default": DepthPlan(seeds=3, epochs=None, growth_points=((0, 4),), stack_all_points=(1, 3)),
    # The static network's frontier: the final-size network at smaller budgets, each with its own
    # cooldown, to compare a grown network with the static one trained on the same FLOPs (the
    # grown arms' totals lie between 5 and 7 epochs of the final network).
    "budgets": DepthPlan(seeds=3, epochs=None, growth_points=(), static_budgets=(4, 6), growing=False),
    # Where depth starts to pay for a static network: the start and final networks and the
    # heuristic at twice the recipe's epochs (28.5 characters per final parameter), no stacking.
    "crossover": DepthPlan(seeds=3, epochs=16, growth_points=()),
    # The static frontier at those 16 epochs: the final network alone at 8 and 12 epochs, each with
    # its own cooldown (the grown arms trained 5.4-6.8e12 FLOPs, 11-14 epochs of the final network).
    "crossover-budgets": DepthPlan(seeds=3, epochs=16, growth_points=(), static_budgets=(8, 12), growing=False),
    # Stacking at those 16 epochs, to merge with "crossover" (its static-final runs are rerun,
    # and the merge checks they agree): one block after epochs 0 and 4 (the best stacked arm at 8
    # epochs), and the whole stack copied once at a quarter (after epoch 4) or half-way (after
    # epoch 8, G_stack's usual point; the primary arm, chosen before any of these ran).
    "crossover-stacked": DepthPlan(
        seeds=3, epochs=16, growth_points=((0, 4),), stack_all_points=(4, 8), controls=False
    ),
    # Width instead of depth: the final network grown from half its width by doubling it in
    # place after epoch 1 or 2, or when the heuristic says, against the final and the narrow
    # networks trained static. The primary arm, widen-1, was chosen on selection seed 1000
    # (baselines/growth/chars-gpt-growth-width/selection-s1000: neither reached static-final's
    # loss there; widen-1 ended lower) before any evaluation seed ran.
    "widen": DepthPlan(seeds=3, epochs=None, growth_points=(), widen_points=(1, 2), controls=False),
    # The same at 16 epochs, where the final network is no worse than the start ones: doubled
    # after a quarter of the run (epoch 3: the share widen-1 trained narrow at 8 epochs, fixed
    # from that selection, not re-chosen), and the heuristic; to merge with "crossover"'s result.
    "widen-crossover": DepthPlan(seeds=3, epochs=16, growth_points=(), widen_points=(3,), controls=False),
    # Choosing the doubling point at 16 epochs, on a selection seed (--first-seed 1000): after
    # epoch 1, 3 or 5.
    "widen-points": DepthPlan(seeds=1, epochs=16, growth_points=(), widen_points=(1, 3, 5), controls=False),
    # The doubling point widen-points chose on selection seed 1000 (after epoch 5: 31.2 % fewer
    # FLOPs to static-final's loss there), evaluated at 16 epochs; to merge with "crossover"'s
    # and "widen-crossover"'s results (their static-final runs are rerun, and the merge checks
    # they agree). Beside it, the heuristic doubling on a one-epoch plateau, its threshold fixed
    # on the same seed before any of these ran: the narrow network's relative improvements there
    # were 8.3, 4.7, 3.9, 3.9 and then 1.8 % (epochs 1-5), so any threshold in (1.82 %, 3.92 %]
    # doubles after epoch 5, as chosen; 2.9 % is that interval's middle.
    "widen-late": DepthPlan(
        seeds=3,
        epochs=16,
        growth_points=(),
        widen_points=(5,),
        controls=False,
        widen_controls=False,
        widen_plateau=0.029,
    ),
    # The plateau rule smoothed over two epochs, after widen-late's one-epoch rule doubled seed 3
    # after a noisy epoch and missed the target. Its threshold fixed on selection seed 1000 as
    # before: the narrow network's two-epoch improvements there were 12.6, 8.5, 7.7 and then 5.7 %
    # (epochs 2-5), so any threshold in (5.67 %, 7.68 %] doubles after epoch 5; 6.7 % is the middle.
    "widen-smooth": DepthPlan(
        seeds=6,
        epochs=16,
        growth_points=(),
        controls=False,
        widen_controls=False,
        widen_plateau=0.067,
        widen_plateau_window=2,
    ),
    # A rule that reads how much of the run is left: widen-late's plateau rule (one epoch, 2.9 %),
    # doubling nothing before 5/16 of the run, the share at which widen-points chose to double on
    # selection seed 1000 (after epoch 5 of 16). Its form answers widen-late's seed 3, which
    # doubled after a noisy epoch 3 and never reached the target: an evaluation seed shaped the
    # rule, so it is scored on seeds 6-11 (--first-seed 6), which no choice has seen, beside
    # widen-5 and static-final on the same seeds.
    "widen-budget": DepthPlan(
        seeds=6,
        epochs=16,
        growth_points=(),
        widen_points=(5,),
        controls=False,
        widen_controls=False,
        widen_plateau=0.029,
        widen_plateau_from=5 / 16,
        first_fresh_seed=6,
    ),
    # What CI runs: one seed, every arm, six short epochs on a cut of the data.
    "smoke": DepthPlan(
        seeds=1,
        epochs=6,
        growth_points=((0, 4),),
        stack_all_points=(1,),
        static_budgets=(3,),
        train_windows=64,
        widen_points=(1,),
        widen_plateau=0.029,
        widen_plateau_from=0.5,
    ),
}


@dataclass(kw_only=True, slots=True)
class DepthGrowthConfig:
    """One depth-growth benchmark.

    Attributes:
        recipe: The final-size network's recipe; its model must be a ``ModelSpec`` whose stack
            ``stack`` holds the final depth.
        start_recipe: The same model at the start depth, same data and trainer.
        narrow_recipe: The same model at half the width (the ``widen-*`` arms' start), same data
            and trainer.
        stack: The stack of identical blocks the depth seeds deepen (``ModelSpec.deepen``).
        plan: ``PLANS`` entry; ``seeds`` and ``epochs`` override its own.
        seeds: How many paired seeds: ``first_seed`` .. ``first_seed + seeds - 1``.
        first_seed: The first of them. Evaluation seeds stay below ``FIRST_SELECTION_SEED``; from
            it on, the run is a selection run (``"selection": true`` in its result), to choose an
            arm or a schedule on seeds the evaluation never uses. A run on further evaluation
            seeds extends an earlier result of the same plan (``extend_seeds``).
        epochs: Epochs per run.
        blend_epochs: The lifecycle's alpha ramp for every growing arm (Tamiyo's heuristic
            rules drive the lifecycle of scheduled seeds too); 1 lets two stacked insertions
            fit the recipe's 8 epochs.
        blend_lr_warmup_epochs: The growing arms' ``KasminaConfig.blend_lr_warmup_epochs`` (the
            copied blocks' learning rate ramped up over their first blending epochs). Above 0 the
            growing arms are named with ``-w<N>`` (``controller-w2``), so that a result merges
            with the same plan's without warm-up (``--merge-with``) into one table.
        home: ESPER_HOME to use (None: a temporary one).
        workers: Local worker processes (0: runs one after another in this process).
    """

    recipe: str = "chars-gpt-growth"
    start_recipe: str = "chars-gpt-growth-start"
    narrow_recipe: str = "chars-gpt-growth-narrow"
    stack: str = "blocks"
    plan: str = "default"
    seeds: int | None = None
    first_seed: int = 0
    epochs: int | None = None
    blend_epochs: int = 1
    blend_lr_warmup_epochs: int = 0
    home: Path | None = None
    workers: int = 0

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ValueError(f"unknown depth-growth plan {self.plan!r}; choose one of {sorted(PLANS)}")
        if self.seeds is not None and self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if self.first_seed < 0:
            raise ValueError(
                f"first_seed must be >= 0 (seeds are 0 .. 999, selection seeds from 1000), got {self.first_seed}"
            )
        last = self.first_seed + self.depth_plan.seeds - 1
        if self.first_seed < FIRST_SELECTION_SEED <= last:
            raise ValueError(
                f"seeds {self.first_seed} .. {last} mix evaluation seeds (below {FIRST_SELECTION_SEED}) and "
                f"selection seeds (from {FIRST_SELECTION_SEED}, which choose and are never evaluated on): "
                f"set --first-seed and --seeds to stay on one side"
            )
        if self.epochs is not None and self.epochs < 2:
            raise ValueError(f"epochs must be >= 2 (a run that grows trains before and after), got {self.epochs}")
        if self.blend_epochs < 1:
            raise ValueError(f"blend_epochs must be >= 1, got {self.blend_epochs}")
        if not 0 <= self.blend_lr_warmup_epochs <= self.blend_epochs:
            raise ValueError(
                f"blend_lr_warmup_epochs must lie in 0 .. blend_epochs={self.blend_epochs} (the ramp runs over "
                f"blending epochs; 0: no warm-up), got {self.blend_lr_warmup_epochs}"
            )
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0: runs one after another here), got {self.workers}")
        final, start = get_recipe(self.recipe), get_recipe(self.start_recipe)
        starts = [(self.start_recipe, start)]
        if self.depth_plan.widen_points or self.depth_plan.widen_plateau is not None:
            starts.append((self.narrow_recipe, get_recipe(self.narrow_recipe)))
        for name, config in ((self.recipe, final), *starts):
            if not isinstance(config.host, ModelSpec):
                raise ValueError(f"recipe {name!r} has a built-in host: depth growth needs a ModelSpec with a stack")
        epochs = self.depth_plan.epochs or final.epochs
        for name, config in starts:
            if config.epochs != final.epochs or config.trainer != final.trainer:
                raise ValueError(
                    f"{name!r} and {self.recipe!r} must share epochs and trainer (one schedule family and one "
                    "token budget for every arm): make it the final recipe at a smaller depth or width"
                )
        gap = self.lifecycle_epochs
        cooldown = final.trainer.lr_cooldown_epochs if final.trainer.lr_schedule == "cooldown" else 0
        for budget in self.depth_plan.static_budgets:
            if not cooldown < budget < epochs:
                raise ValueError(
                    f"static budget {budget} epochs must lie between the cooldown ({cooldown} epochs) and the "
                    f"run's {epochs} epochs, exclusive: it is a smaller static run with its own cooldown"
                )
        plateau = self.depth_plan.widen_plateau
        if self.depth_plan.widen_plateau_window < 1:
            raise ValueError(f"widen_plateau_window must be >= 1 epoch, got {self.depth_plan.widen_plateau_window}")
        if not self.selection and self.first_seed < self.depth_plan.first_fresh_seed:
            raise ValueError(
                f"plan {self.plan!r} is scored on seeds nothing chose on, from {self.depth_plan.first_fresh_seed}: "
                f"pass --first-seed {self.depth_plan.first_fresh_seed} (or later)"
            )
        if self.depth_plan.widen_plateau_from and plateau is None:
            raise ValueError("widen_plateau_from opens the plateau arm, and this plan has none: set widen_plateau too")
        if not 0.0 <= self.depth_plan.widen_plateau_from < 1.0:
            raise ValueError(
                f"widen_plateau_from must lie in [0, 1), got {self.depth_plan.widen_plateau_from}: a share of the "
                "run's epochs, e.g. 0.3125 for 5 of 16"
            )
        if plateau is not None and not 0.0 < plateau < 1.0:
            raise ValueError(
                f"widen_plateau must lie in (0, 1), got {plateau}: a relative improvement of validation loss "
                "over one epoch, e.g. 0.029 for 2.9 %"
            )
        for point in (*self.depth_plan.stack_all_points, *self.depth_plan.widen_points):
            if not 0 <= point <= epochs - 2:
                raise ValueError(
                    f"growth point {point} must be an epoch from 0 to {epochs - 2} "
                    "(a seed germinated after the last epoch never trains)"
                )
        for points in self.depth_plan.growth_points:
            if list(points) != sorted(set(points)) or points[-1] > epochs - 2 or points[0] < 0:
                raise ValueError(
                    f"growth points {points} must be distinct, ascending epochs from 0 to {epochs - 2} "
                    "(a seed germinated after the last epoch never trains)"
                )
            if any(b - a < gap for a, b in zip(points, points[1:], strict=False)):
                raise ValueError(
                    f"growth points {points} are closer than a stacked seed's lifecycle ({gap} epochs with "
                    f"blend_epochs={self.blend_epochs}): the stack's depth slot holds one seed at a time"
                )

    @property
    def depth_plan(self) -> DepthPlan:
        """The named plan with this config's overrides."""
        plan = PLANS[self.plan]
        return dataclasses.replace(
            plan,
            seeds=self.seeds if self.seeds is not None else plan.seeds,
            epochs=self.epochs if self.epochs is not None else plan.epochs,
        )

    @property
    def seed_list(self) -> list[int]:
        """The paired seeds this run trains every arm on."""
        return list(range(self.first_seed, self.first_seed + self.depth_plan.seeds))

    @property
    def selection(self) -> bool:
        """True for a run on selection seeds (reported apart, never as an evaluation)."""
        return self.first_seed >= FIRST_SELECTION_SEED

    @property
    def lifecycle_epochs(self) -> int:
        """Epochs from one stacked seed's germination to the next one's, measured: germinated
        after epoch e, it waits out its TRAINING epoch unapplied (e+1; depth seeds do not train in
        isolation), blends (``blend_epochs``), is judged and merged after e + blend_epochs + 2,
        and the slot takes the next seed one epoch later."""
        return self.blend_epochs + 3

    @property
    def slot(self) -> str:
        """The stack's depth slot."""
        return f"{self.stack}{DEPTH_SLOT_SUFFIX}"

    @property
    def arm_suffix(self) -> str:
        """What the growing arms' names end with: ``-w<N>`` with a learning-rate warm-up, else nothing."""
        return f"-w{self.blend_lr_warmup_epochs}" if self.blend_lr_warmup_epochs else ""

    @property
    def plateau_arm(self) -> str | None:
        """The plateau rule's arm, ``widen-plateau`` (``-w<N>`` over N > 1 epochs, ``-from<P>``
        from P % of the run), or None."""
        plan = self.depth_plan
        if plan.widen_plateau is None:
            return None
        window, share = plan.widen_plateau_window, plan.widen_plateau_from
        return "widen-plateau" + (f"-w{window}" if window > 1 else "") + (f"-from{round(share * 100)}" if share else "")

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm of a seed, in run order."""
        plan = self.depth_plan
        budgets = tuple(f"static-final-{e}ep" for e in plan.static_budgets)
        if not plan.growing:
            return ("static-final", *budgets)
        stacked = tuple("stack-" + "-".join(map(str, p)) + self.arm_suffix for p in plan.growth_points)
        doubled = tuple(f"stack-all-{p}{self.arm_suffix}" for p in plan.stack_all_points)
        # Widening has no blending, so no learning-rate warm-up to name.
        widened = tuple(f"widen-{p}" for p in plan.widen_points)
        if widened and plan.widen_controls:
            widened = ("static-narrow", *widened, "widen-controller")
        if self.plateau_arm is not None:
            widened = (*widened, self.plateau_arm)
        if not plan.controls:
            return ("static-final", *budgets, *stacked, *doubled, *widened)
        controls = ("static-start",)
        return ("static-final", *controls, *budgets, *stacked, *doubled, *widened, "controller" + self.arm_suffix)


def run(config: DepthGrowthConfig, *, progress: Progress | None = None) -> dict[str, Any]:
    """Run every arm on every seed; returns the runs' curves and ``summarise``'s headlines."""
    report = progress or (lambda _what, _done, _total: None)
    plan = config.depth_plan
    start = time.perf_counter()
    with in_home(config.home, prefix="esper-depth-growth-") as home:
        jobs = [
            ArmJob(arm=arm, seed=seed, home=str(home), config=config)
            for seed in config.seed_list
            for arm in config.arms
        ]
        report("training runs", 0, len(jobs))
        results = FanOut(workers=config.workers).map(
            arm_run, jobs, progress=lambda done: report("training runs", done, len(jobs))
        )
    runs: dict[str, list[EpisodeResult]] = {arm: [] for arm in config.arms}
    for job, result in zip(jobs, results, strict=True):
        runs[job.arm].append(result)
    final = get_recipe(config.recipe)
    return {
        "bench": "depth-growth",
        "plan": config.plan,
        "recipe": config.recipe,
        "start_recipe": config.start_recipe,
        "seeds": config.seed_list,
        "selection": config.selection,
        "epochs": plan.epochs or final.epochs,
        "growth_points": [list(p) for p in plan.growth_points],
        "stack_all_points": list(plan.stack_all_points),
        "static_budgets": list(plan.static_budgets),
        **(
            {"narrow_recipe": config.narrow_recipe, "widen_points": list(plan.widen_points)}
            if plan.widen_points
            else {}
        ),
        # Per plateau arm, its rule: a merged result may hold several.
        **(
            {
                "widen_plateau": {
                    config.plateau_arm: {
                        "threshold": plan.widen_plateau,
                        "window": plan.widen_plateau_window,
                        "grow_from": plan.widen_plateau_from,
                    }
                }
            }
            if config.plateau_arm is not None
            else {}
        ),
        "blend_epochs": config.blend_epochs,
        "blend_lr_warmup_epochs": config.blend_lr_warmup_epochs,
        "lr": final.trainer.lr,
        "lr_schedule": final.trainer.lr_schedule,
        # None: the recipe's whole training data.
        "train_windows": plan.train_windows,
        "split_seed": SPLIT_SEED,
        # The corpus is this Python's own standard library: another minor version, other text.
        "python": "{}.{}".format(*sys.version_info[:2]),
        "workers": config.workers,
        "wall_s": time.perf_counter() - start,
        **summarise(runs),
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class ArmJob:
    """One run: an arm on a seed (a unit of fan-out)."""

    arm: str
    seed: int
    home: str
    config: DepthGrowthConfig


def arm_run(job: ArmJob) -> EpisodeResult:
    """Train ``job``'s arm on one torch thread (the same numbers here or on a worker)."""
    with one_thread():
        settings = EsperSettings(home=Path(job.home))
        run_id = fresh_run_id(settings, f"depth-{job.arm}-s{job.seed}")
        return run_episode(arm_config(job.config, arm=job.arm, seed=job.seed), settings=settings, run_id=run_id)


def arm_config(config: DepthGrowthConfig, *, arm: str, seed: int) -> RunConfig:
    """The run of ``arm`` on ``seed``."""
    plan = config.depth_plan
    if arm not in config.arms:
        raise ValueError(f"unknown arm {arm!r}; this benchmark runs {config.arms}")
    if not arm.startswith("static") and config.arm_suffix:
        arm = arm.removesuffix(config.arm_suffix)
    recipe = config.recipe if arm.startswith("static-final") else config.start_recipe
    if arm == "static-narrow" or arm.startswith("widen-"):
        recipe = config.narrow_recipe
    policy = "none" if arm.startswith("static") else "scheduled"
    plateau_arm = arm.startswith("widen-plateau")
    if arm in ("controller", "widen-controller") or plateau_arm:
        policy = "heuristic"
    epochs = int(arm.removeprefix("static-final-").removesuffix("ep")) if arm.endswith("ep") else plan.epochs
    schedule: tuple[ScheduledGermination, ...] = ()
    if arm.startswith("stack-all-"):
        point = int(arm.removeprefix("stack-all-"))
        schedule = (ScheduledGermination(epoch=point, slot=config.slot, blueprint=STACK_ALL_BLUEPRINT),)
    elif arm.startswith("stack-"):
        points = next(p for p in plan.growth_points if arm == "stack-" + "-".join(map(str, p)))
        schedule = tuple(ScheduledGermination(epoch=e, slot=config.slot, blueprint=STACK_BLUEPRINT) for e in points)
    elif arm.startswith("widen-") and arm != "widen-controller" and not plateau_arm:
        point = int(arm.removeprefix("widen-"))
        schedule = (ScheduledGermination(epoch=point, slot=STREAM_SLOT, blueprint=WIDEN_BLUEPRINT),)
    run_config = episode_config(recipe, seed=seed, policy="none", epochs=epochs, split_seed=SPLIT_SEED)
    if plan.train_windows is not None:
        assert isinstance(run_config.data, DataSpec)  # checked for the recipe's host in the config
        run_config.data = dataclasses.replace(
            run_config.data, load=functools.partial(first_windows, run_config.data.load, plan.train_windows)
        )
    host = run_config.host
    assert isinstance(host, ModelSpec)
    if arm.startswith("widen-"):
        # Width only: the stream slot alone.
        host = dataclasses.replace(host, slots=(), widen_stream=True)
    elif policy != "none":
        # Depth only: the arms compare ways of deepening, and branch seeds would need compiled
        # kernels (on chars-gpt they changed nothing: issue 36).
        host = dataclasses.replace(host, slots=(), deepen=(config.stack,))
    heuristic = dataclasses.replace(run_config.tamiyo.heuristic, blend_epochs=config.blend_epochs)
    if plateau_arm:
        assert plan.widen_plateau is not None  # the arm exists only with it
        heuristic = dataclasses.replace(
            heuristic,
            plateau_window=plan.widen_plateau_window,
            plateau_rel_tol=plan.widen_plateau,
            probe_epoch=None,
            grow_from=plan.widen_plateau_from,
        )
    tamiyo = dataclasses.replace(run_config.tamiyo, policy=policy, schedule=schedule, heuristic=heuristic)
    kasmina = dataclasses.replace(run_config.kasmina, blend_lr_warmup_epochs=config.blend_lr_warmup_epochs)
    # Replaced, not assigned: RunConfig checks the schedule against the host's slots.
    return dataclasses.replace(run_config, host=host, tamiyo=tamiyo, kasmina=kasmina)


def first_windows(load: Callable[[], DataSplits], windows: int) -> DataSplits:
    """``load()``'s first ``windows`` training windows and a quarter as many validation and test ones."""
    data = load()
    held = max(1, windows // 4)

    def cut(split: Any, n: int) -> TensorDataset:
        if not isinstance(split, TensorDataset):
            raise ValueError(f"train_windows cuts tensor data sets; the recipe's split is a {type(split).__name__}")
        return TensorDataset(*(t[:n] for t in split.tensors))

    return DataSplits(train=cut(data.train, windows), val=cut(data.val, held), test=cut(data.test, held))


def read_result(path: Path, config: DepthGrowthConfig) -> dict[str, Any]:
    """An earlier result to combine with a run of ``config`` (``combine``), checked before that
    run starts: of the same recipes, on the same seeds (other arms: ``merge_results``) or on
    seeds disjoint from them on the same side of ``FIRST_SELECTION_SEED`` (more seeds of the same
    arms: ``extend_seeds``).

    Raises:
        ValueError: the file is missing or not a depth-growth result, or is of another recipe,
            start recipe or seeds than ``config`` could be combined with.
    """
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path} as a depth-growth result ({error}); pass a depth_growth.json") from None
    if (
        not isinstance(result, dict)
        or result.get("bench") != "depth-growth"
        or "static-final" not in result.get("arms", {})
    ):
        raise ValueError(f"{path} is not a depth-growth result (depth_growth.json of esper bench depth-growth)")
    for key, value in {"recipe": config.recipe, "start_recipe": config.start_recipe}.items():
        if result.get(key) != value:
            raise ValueError(
                f"{path} has {key} {result.get(key)!r} and this run would have {value!r}: combine results of one "
                "recipe (set --recipe / --start-recipe to match)"
            )
    seeds, theirs = config.seed_list, result.get("seeds", [])
    if theirs != seeds:
        if set(theirs) & set(seeds) or bool(result.get("selection")) != config.selection:
            raise ValueError(
                f"{path} has seeds {theirs} and this run would have {seeds}: combine results on the same seeds "
                "(other arms) or on disjoint seeds of the same kind (more seeds: --first-seed past theirs)"
            )
        if result.get("plan") != config.plan:
            raise ValueError(
                f"{path} is of plan {result.get('plan')!r} and this run on other seeds of {config.plan!r}: more "
                "seeds extend the same plan"
            )
        if list(result["arms"]) != list(config.arms):
            raise ValueError(
                f"{path} has arms {list(result['arms'])} and this run on other seeds would have {list(config.arms)}: "
                "more seeds extend the same arms (run the same --plan)"
            )
    epochs = config.depth_plan.epochs or get_recipe(config.recipe).epochs
    if result.get("epochs") != epochs:
        raise ValueError(
            f"{path} ran {result.get('epochs')} epochs and this run would run {epochs}: combine results of one "
            "schedule (set --epochs or --plan to match)"
        )
    return result


__all__ = [
    "PLANS",
    "ArmJob",
    "DepthGrowthConfig",
    "DepthPlan",
    "arm_config",
    "arm_run",
    "read_result",
    "run",
]
