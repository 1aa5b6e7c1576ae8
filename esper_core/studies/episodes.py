"""Run whole training runs in-process to produce Simic's data (and the growth benchmark's arms).

An episode is a real ``Run`` (Tolaria trains, Tamiyo decides, Kasmina applies, every
step committed), so its decisions and field reports reach the registry exactly as a production
run's do. Episodes share one ``TamiyoService`` when given one (one policy load and, if
compiled, one compile for all of them).

A run that halts (``TrainingHalted``: Tolaria's safety gave up after repeated failed epochs) is an
outcome, not an error: ``run_episode`` puts the network back at the run's last commit (the state
every failed attempt was rolled back to) and scores it as a finished run is scored, with the
reason in ``EpisodeResult.halted``. Dropping it instead would bias every paired comparison toward
the arms that halt. A damaged commit (``CommitLost``) is not a training outcome and still raises.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from esper_core.contracts import new_id
from esper_core.data import DataConfig
from esper_core.kasmina.graft import GrowableModel
from esper_core.run.commits import epoch_tag
from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe, with_overrides
from esper_core.run.session import CommitLost, Run
from esper_core.run.task import EpisodeTask
from esper_core.settings import EsperSettings
from esper_core.studies.counterfactual import CounterfactualConfig, CounterfactualForks
from esper_core.tamiyo.config import PolicyCompileConfig, ScheduledGermination
from esper_core.tamiyo.service import TamiyoService
from esper_core.tolaria.flops import forward_flops
from esper_core.tolaria.loop import count_parameters
from esper_core.tolaria.safety import TrainingHalted

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeResult:
    """What one run achieved.

    Attributes:
        run_id: The run.
        recipe: Its recipe.
        policy: Who decided (``TamiyoConfig.policy``).
        seed: Its seed.
        test_accuracy: Accuracy on the test split after the last epoch (of a halted run: of the
            network at its last commit, as are the other scores).
        test_loss: Mean loss on the test split after the last epoch (a language model's score:
            nats per character).
        val_accuracy: Validation accuracy after the last epoch.
        val_loss: Mean loss on the validation split after the last epoch (what a learning rate
            is chosen on).
        host_params: Parameters of the host alone.
        total_params: Host plus every seed still attached.
        forward_flops: Floating-point operations of one sample's forward pass through the final
            network, seeds included (``torch.utils.flop_counter``).
        train_flops: Floating-point operations the whole run trained with: per epoch, 3 x the
            forward FLOPs of the network it trained (seeds included; a backward costs about two
            forwards) x the training samples. A grown network trains small first, so it costs
            less than the static network of its final size.
        wall_s: Wall time of the run (training, decisions, commits).
        commands: Action name -> how many were issued.
        policy_version: GNN weights served at the end, if any.
        forks: Decisions forked for a counterfactual reward (``run_episode``'s ``counterfactual``).
        fork_ms: Wall time those forks took (included in ``wall_s``).
        task: The varied task the run trained on (``RunConfig.task``), None for the recipe's own.
        widths: Output units of each layer the recipe lets Tamiyo widen (``ModelSpec.widen``)
            in the final network, units of width seeds still attached included: the shape of
            the static network it is compared with (``esper_core.studies.transfer``).
        curve: After each epoch, ``(train_flops so far, validation loss)``: loss against
            training compute, for comparing a grown network's path with a static one's. A halted
            run's ends with its ``train_flops`` and ``val_loss`` (the network it is scored as).
        early_stop: Where early stopping would have ended it (``run_episode``'s
            ``early_stopping``; None without).
        halted: Why the run halted (``TrainingHalted``'s message), None for a run that trained
            all its epochs. A halted run's ``train_flops`` are those of the epochs it started,
            the one it halted in included (each epoch counted once, as in every run).
    """

    run_id: str
    recipe: str
    policy: str
    seed: int
    test_accuracy: float
    val_accuracy: float
    host_params: int
    total_params: int
    forward_flops: int
    wall_s: float
    commands: dict[str, int]
    policy_version: str | None
    test_loss: float = math.nan
    val_loss: float = math.nan
    train_flops: int = 0
    forks: int = 0
    fork_ms: float = 0.0
    task: EpisodeTask | None = None
    widths: dict[str, int] = field(default_factory=dict)
    curve: tuple[tuple[int, float], ...] = ()
    halted: str | None = None
    early_stop: EarlyStop | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class EarlyStop:
    """Where early stopping would have ended a run (``run_episode(early_stopping=True)``): the
    epoch of its best validation score so far (accuracy; a language model's loss), with the test
    split read at that epoch. The epoch is chosen on validation alone; the test scores are only
    reported (``bench/main_job.py``'s ``tuned_early`` arm, through ``yardstick.early_stopped``).

    Attributes:
        epoch: The 0-based epoch whose end scored best on validation (the first of a tie).
        val_accuracy: Validation accuracy there.
        val_loss: Validation loss there.
        test_accuracy: Test accuracy there.
        test_loss: Test loss there.
        train_flops: Training FLOPs up to the end of that epoch.
    """

    epoch: int
    val_accuracy: float
    val_loss: float
    test_accuracy: float
    test_loss: float
    train_flops: int


def count_halted(results: Iterable[EpisodeResult]) -> int:
    """How many of ``results`` halted (``EpisodeResult.halted``): every summary that pairs arms
    shows it, since a halted run is scored at its last commit, not dropped."""
    return sum(r.halted is not None for r in results)


def episode_config(
    recipe: str | RunConfig,
    *,
    seed: int,
    policy: str,
    epochs: int | None = None,
    device: str = "cpu",
    explore: bool = False,
    policy_version: int | None = None,
    lr_schedule: str | None = None,
    split_seed: int | None = None,
    schedule: Sequence[ScheduledGermination] = (),
    task: EpisodeTask | None = None,
) -> RunConfig:
    """The recipe's configuration with the deciding policy set, for an episode.

    ``recipe`` is a recipe's name, or a configuration made in code (a zoo member's
    ``recipe()``), which is copied, not changed.

    ``lr_schedule`` (None: the recipe's) overrides ``TrainerConfig.lr_schedule``; ``split_seed``
    fixes the split of a bundled data set whatever the seed (a user's ``DataSpec`` splits itself);
    ``schedule`` is policy ``scheduled``'s list of germinations; ``task`` (a Simic training
    episode's, ``TaskVariation.draw``) scales the host by its width here and varies the training
    split when the run loads its data (None: the recipe's own task).

    The training step is kept eager (``trainer.step.compile="off"``): episodes are short and many,
    and a step compile (10-40 s on 2 CPU cores, decided per workload) would dominate their wall
    time without changing what Tamiyo decides. The policy is not compiled either: ten decisions
    of ~1 ms each do not repay a compile.
    """
    if isinstance(recipe, str):
        config = get_recipe(recipe, epochs=epochs, device=device, seed=seed)
    else:
        config = with_overrides(recipe, epochs=epochs, device=device, seed=seed)
    config.trainer = dataclasses.replace(config.trainer, step=dataclasses.replace(config.trainer.step, compile="off"))
    if lr_schedule is not None:
        config.trainer = dataclasses.replace(config.trainer, lr_schedule=lr_schedule)
    if split_seed is not None and isinstance(config.data, DataConfig):
        config.data = dataclasses.replace(config.data, split_seed=split_seed)
    tamiyo = dataclasses.replace(
        config.tamiyo,
        policy=policy,
        explore=explore,
        policy_version=policy_version,
        schedule=tuple(schedule),
        compile=PolicyCompileConfig(enabled=False),
    )
    host = config.host if task is None or task.width == 1.0 else config.host.scaled(task.width)
    # Replaced, not assigned: RunConfig checks the schedule against its slots and blueprints.
    return dataclasses.replace(config, tamiyo=tamiyo, host=host, task=task)


def run_episode(
    config: RunConfig,
    *,
    settings: EsperSettings,
    run_id: str | None = None,
    tamiyo: TamiyoService | None = None,
    counterfactual: CounterfactualConfig | None = None,
    early_stopping: bool = False,
) -> EpisodeResult:
    """Train ``config`` for all its epochs with Tamiyo deciding after each, then test it.

    Args:
        config: The run (see ``episode_config``).
        settings: Where the registry and run folders live.
        run_id: The run's id; default ``<recipe>-<policy>-s<seed>-<random>``.
        tamiyo: A running Tamiyo to share; its breaker is reset first. Its configuration must
            be ``config.tamiyo``'s.
        counterfactual: Fork some decisions (where a choice existed) and store each one's
            counterfactual outcome with it (``esper_core.studies.counterfactual``); the run itself
            trains exactly as without.
        early_stopping: Read the test split at every epoch whose validation score is the best
            so far, for ``EpisodeResult.early_stop`` (evaluation only: the run trains exactly
            as without).

    Returns:
        The episode's result; a run that halted (``TrainingHalted``) is scored at its last commit
        and says why in ``halted`` (module docstring).

    Raises:
        CommitLost: A checkpoint the run stood on was damaged (not a training outcome).
    """
    run_id = run_id or f"{config.recipe}-{config.tamiyo.policy}-s{config.seed}-{new_id()[:6]}"
    (settings.runs_dir / run_id).mkdir(parents=True, exist_ok=False)
    if tamiyo is not None:
        tamiyo.breaker.reset()
    start = time.perf_counter()
    session = Run.start(config, settings=settings, run_id=run_id, tamiyo=tamiyo)
    forks = None if counterfactual is None else CounterfactualForks(counterfactual, run_id=run_id)
    fork_ms = 0.0
    sample = session.trainer.data.test.head(1)[0].to(session.trainer.device)
    samples = len(session.trainer.data.train)
    train_flops, flops_of = 0, {}
    curve: list[tuple[int, float]] = []
    halted: str | None = None
    early: EarlyStop | None = None
    try:
        try:
            for epoch in range(config.epochs):
                # The forward this epoch trains: a seed germinated by the last decision is promoted
                # to TRAINING when the epoch starts, and counted only from then (measured at
                # GERMINATED, its first epoch of training went uncounted). The trainer's own
                # start_epoch below finds nothing left to promote.
                session.manager.start_epoch()
                # Measured once per architecture (a germination, a merge or a cull changes it).
                structure = session.manager.structure_signature()
                if structure not in flops_of:
                    flops_of[structure] = forward_flops(session.trainer.model, sample)
                train_flops += 3 * flops_of[structure] * samples
                session.train_epoch()
                curve.append((train_flops, session.history[-1].val_loss))
                if early_stopping:
                    early = _early_stop(session, epoch, train_flops, early)
                session.commit(epoch_tag(epoch, "trained"))
                command = session.decide()
                if forks is not None and (outcome := forks.maybe_fork(session, command)) is not None:
                    fork_ms += outcome.fork_ms
                session.apply(command)
                session.commit(epoch_tag(epoch, "applied"))
        except CommitLost:
            raise  # a damaged checkpoint: the disk failed, not the training
        except TrainingHalted as e:
            halted = str(e)
            # The failed attempt's weights are still live (a halt does not roll back): back to
            # the last commit, the good state every earlier attempt was rolled back to.
            assert session.committed_tag is not None, "run_episode commits before it trains"
            session.ensure_at(session.committed_tag)
            log.warning("episode %s halted; scored at its last commit %s: %s", run_id, session.committed_tag, e)
        test = session.trainer.evaluate(session.trainer.data.test)
        if halted is None:
            last = session.history[-1]
            val_accuracy, val_loss, host_params = last.val_accuracy, last.val_loss, last.host_params
        else:
            # Validated as it stands now: its last packet (if any) predates the commit's decision.
            val = session.trainer.evaluate(session.trainer.data.val)
            val_accuracy, val_loss = val.accuracy, val.loss
            host_params = sum(p.numel() for p in session.trainer.model.host_parameters())
            curve.append((train_flops, val_loss))
        return EpisodeResult(
            run_id=run_id,
            recipe=config.recipe,
            policy=config.tamiyo.policy,
            seed=config.seed,
            test_accuracy=test.accuracy,
            test_loss=test.loss,
            val_accuracy=val_accuracy,
            val_loss=val_loss,
            host_params=host_params,
            total_params=count_parameters(session.trainer.model),
            forward_flops=forward_flops(session.trainer.model, sample),
            train_flops=train_flops,
            wall_s=time.perf_counter() - start,
            commands=dict(Counter(c.action for c in session.commands)),
            policy_version=session.tamiyo.policy_version,
            forks=0 if forks is None else forks.forks,
            fork_ms=fork_ms,
            task=config.task,
            widths=model.grown_widths if isinstance(model := session.trainer.model, GrowableModel) else {},
            curve=tuple(curve),
            halted=halted,
            early_stop=early,
        )
    finally:
        if tamiyo is None:
            session.tamiyo.close()
        session.close()


def _early_stop(session: Run, epoch: int, train_flops: int, best: EarlyStop | None) -> EarlyStop | None:
    """``best``, or this epoch if it scored better on validation (then the test split is read)."""
    last = session.history[-1]

    def score(accuracy: float, loss: float) -> float:
        return accuracy if last.classifies else -loss

    if best is not None and score(last.val_accuracy, last.val_loss) <= score(best.val_accuracy, best.val_loss):
        return best
    # Evaluation under inference mode, in order, no random draw: the training goes on as without.
    test = session.trainer.evaluate(session.trainer.data.test)
    return EarlyStop(
        epoch=epoch,
        val_accuracy=last.val_accuracy,
        val_loss=last.val_loss,
        test_accuracy=test.accuracy,
        test_loss=test.loss,
        train_flops=train_flops,
    )
