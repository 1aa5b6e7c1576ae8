"""Tolaria's epoch loop: train, validate under ``inference_mode``, gate seeds, report.

The step is one closure (``_train_step``, or ``_full_precision_step`` without autocast) that the
step engine (``tolaria.step``) runs eagerly, compiles or captures from outside the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from esper_core.contracts import (
    KernelArtifact,
    MetricPoint,
    SystemStatePacket,
    TelemetryEvent,
)
from esper_core.data import AnySplit, Dataset, Split
from esper_core.determinism import capture_rng, restore_rng
from esper_core.hosts import Host
from esper_core.kasmina.loader import LoadedKernel
from esper_core.kasmina.manager import EpochObservation, SeedManager
from esper_core.kasmina.signals import SiteSignals, site_signals
from esper_core.tolaria.aggregation import AggregationStats, aggregate_microbatches
from esper_core.tolaria.buffers import GradientBufferPool
from esper_core.tolaria.collective import Collective, Solo
from esper_core.tolaria.config import TrainerConfig
from esper_core.tolaria.flops import forward_flops
from esper_core.tolaria.gradnorms import GradNormAccumulator
from esper_core.tolaria.layers import LayerStats
from esper_core.tolaria.modes import eval_mode
from esper_core.tolaria.precision import Precision
from esper_core.tolaria.safety import EpochFailed, epoch_failure
from esper_core.tolaria.slotgrads import (
    ACTING_STAGES,
    GROWTH_SIGNALS,
    classifies,
    sample_accuracy,
    slot_activation_grad_norms,
)
from esper_core.tolaria.staging import BatchSource
from esper_core.tolaria.step import DecisionCache, StepEngine


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalResult:
    """Loss and accuracy of the model on one split; ``classified``: whether the accuracy means
    anything (class targets; a language model's token targets read 0)."""

    loss: float
    accuracy: float
    classified: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochResult:
    """What one epoch produced: the state packet for Tamiyo plus telemetry."""

    packet: SystemStatePacket
    metrics: tuple[MetricPoint, ...]
    events: tuple[TelemetryEvent, ...]
    train_ms: float
    total_ms: float


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

GRAD_NORM_SAMPLES = 8
"""Steps per epoch whose gradient norms are measured (evenly spaced; every step of a shorter
epoch): the norms are an RMS over steps, read by gates (finite, non-zero) and by the policy (which
layer gets the larger gradient), and 8 of them keep the heuristic's decisions on the reference
recipes while sparing the other steps the norm kernels."""


def grad_norm_steps(steps: int, samples: int = GRAD_NORM_SAMPLES) -> frozenset[int]:
    """The steps of an epoch whose gradient norms are sampled: the first step of each of
    ``samples`` equal stretches of the epoch (every step of a shorter one).

    An epoch whose steps are a multiple of ``samples`` gets every ``steps // samples``-th step, as
    a plain stride would; other lengths get exactly ``samples`` too, where a stride of
    ``steps // samples`` took up to twice as many (9 of the digits MLP's 17 steps, 15 of 15). On
    the smallest hosts a sample costs as much as a tenth of a step, in the kernels and after them.

    Args:
        steps: Steps in the epoch.
        samples: Steps to sample at most.

    Returns:
        The sampled steps' indices (0-based), ``min(steps, samples)`` of them.
    """
    if steps <= samples:
        return frozenset(range(steps))
    return frozenset(-(-k * steps // samples) for k in range(samples))


class Trainer:
    """Trains one host model with its seed manager on a data set (in memory or a user's Dataset)."""

    def __init__(
        self,
        *,
        model: Host,
        manager: SeedManager,
        data: Dataset,
        config: TrainerConfig,
        loss_fn: LossFn,
        batch_size: int,
        data_seed: int,
        device: torch.device,
        run_id: str,
        workload: str = "",
        decision_cache: DecisionCache | None = None,
        total_epochs: int | None = None,
        signals: frozenset[str] = frozenset(GROWTH_SIGNALS),
        collective: Collective | None = None,
    ) -> None:
        """``signals``: the ``slotgrads.GROWTH_SIGNALS`` someone reads in this run (the rest are
        not measured and stay None in the packets). ``collective``: the ranks of a data-parallel
        run (``tolaria.collective``); ``batch_size`` is then the global batch, of which this rank
        trains its shard. Everything after the training steps (validation, probes, gates, packet)
        runs whole on every rank, on identical weights: every rank reaches the same verdicts as a
        single process would."""
        unknown = sorted(signals - set(GROWTH_SIGNALS))
        if unknown:
            raise ValueError(f"unknown growth signals {unknown}; choose from {GROWTH_SIGNALS}")
        self.signals = signals
        if config.lr_schedule != "constant" and total_epochs is None:
            raise ValueError(f"lr_schedule {config.lr_schedule!r} is a function of the run's length: pass total_epochs")
        self.model = model.to(device)
        self.manager = manager
        # The training split goes wherever the loader config puts it; evaluation splits live on
        # the device (they are read whole, once per epoch).
        resident = config.loader.resident_on(device)
        self.data = dataclasses.replace(
            data,
            train=data.train.to(device) if resident else data.train,
            val=data.val.to(device),
            test=data.test.to(device),
        )
        self.collective: Collective = collective or Solo()
        self.batches = BatchSource(
            self.data.train,
            device=device,
            batch_size=batch_size,
            seed=data_seed,
            config=config.loader,
            shard=(self.collective.rank, self.collective.world),
        )
        self.config = config
        self.loss_fn = loss_fn
        self.batch_size = batch_size
        self.data_seed = data_seed
        self.device = device
        self.run_id = run_id
        self.epoch = 0
        self.total_epochs = total_epochs
        self.best_val_loss: float | None = None
        self.optimizer = _optimizer(model.host_parameters(), config)
        manager.bind_optimizer(self.optimizer, base_lr=config.lr)
        manager.bind_signals(self)
        self.precision = Precision(device, config.amp)
        self.engine = StepEngine(
            self._train_step if self.precision.enabled else self._full_precision_step,
            zero_grad=self._zero_grad,
            parameters=lambda: [p for group in self.optimizer.param_groups for p in group["params"]],
            buffers=lambda: list(self.model.buffers()),
            config=config.step,
            device=device,
            workload=workload or f"{type(model).__name__}{model.layer_widths}:b{batch_size}",
            cache=decision_cache,
            run_steps=None if total_epochs is None else total_epochs * -(-len(self.data.train) // batch_size),
        )
        self.grad_pool = GradientBufferPool(model.host_parameters())
        self.grad_norms = GradNormAccumulator()
        self.grad_agg_stats = AggregationStats()
        self.layer_stats = LayerStats(model.layer_names, list(model.layers), root=model)
        # A fixed batch for G3's isolation probe and for sampling slot inputs.
        x0, y0 = self.data.train.head(batch_size)
        self._probe_batch = (x0.to(device), y0.to(device))
        self._accuracy_sample: tuple[torch.Tensor, torch.Tensor] | None = None
        self._epoch_structure: tuple[object, ...] | None = None  # see train_epoch

    # ------------------------------------------------------------------ training

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step closure the engine runs (eager, compiled or captured): forward under the
        precision policy, loss, backward. Returns the batch's loss sum, detached (no host sync)."""
        with self.precision.autocast():
            loss = self.loss_fn(self.model(x), y)
        self.precision.backward(loss)
        return loss.detach().float() * y.shape[0]

    def _full_precision_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``_train_step`` without autocast or a loss scaler, which a full-precision run never has:
        the same forward, loss and backward, without the three no-op calls (about 2 us a step, a
        per cent of the MNIST-1D MLP's). A loss of another dtype (a float64 model's) is
        still returned as float32."""
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        loss = loss.detach()
        return (loss if loss.dtype is torch.float32 else loss.float()) * y.shape[0]

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _aggregated_step(self, x: torch.Tensor, y: torch.Tensor, trainable: list[str], *, share: float) -> torch.Tensor:
        """Two or more trainable seeds: one loss per task (the teacher with every trainable seed
        bypassed, then each seed alone), host gradients combined by PCGrad (or summed), seed
        gradients from their own task. Eager on purpose: swapping seeds in and out and
        ``autograd.grad`` do not belong in a compiled or captured step. Returns the mean over
        the tasks of their loss sums (the loss the epoch reports).

        Data-parallel, each task's gradient is summed over the ranks (weighted by ``share``, this
        rank's part of the global batch) before PCGrad combines them: PCGrad is not linear, so
        combining each rank's own gradients and averaging would not be the single-process step."""
        self._zero_grad()
        k = 1 + len(trainable)
        stats, losses, private = [], [], []
        for keep in (None, *trainable):
            with contextlib.ExitStack() as stack, self.precision.autocast():
                for sid in trainable:
                    if sid != keep:
                        stack.enter_context(self.manager.without_seed(sid))
                loss = self.loss_fn(self.model(x), y)
            stats.append(loss.detach().float() * y.shape[0])
            # Each task's loss is divided by k so the combined step stays near a plain step's size.
            losses.append(self.precision.scale(loss / k))
            private.append([] if keep is None else self.manager.seed_parameters(keep))
        aggregate_microbatches(
            losses,
            self.model.host_parameters(),
            self.grad_pool,
            self.config.aggregation,
            self.grad_agg_stats,
            private_params=private,
            reduce_rows=lambda rows: self.collective.sum_rows(rows, weight=share),
        )
        self.collective.sum_gradients([p for group in private for p in group], weight=share)
        return torch.stack(stats).mean()

    def train_epoch(self) -> EpochResult:
        """Run one epoch: train on every batch, validate, run the seed gates, build the packet."""
        start = time.perf_counter()
        self._schedule_lr()
        self.manager.start_epoch()
        structure = self.manager.structure_signature()
        self.engine.start_epoch(structure)
        if structure != self._epoch_structure:
            # The slots' stages, seeds or owned shapes changed since the last epoch (or this is
            # the first). Two walks of the model (10-15 us each on the MNIST-1D MLP, 0.3 % of its
            # epoch) are needed only then: the last epoch's validation left every module in
            # training mode (``eval_mode`` restores it with ``train()``), and the host's layers
            # change only with a slot's owned shape.
            if self.layer_stats.names != tuple(self.model.layer_names):
                # A merged depth seed added its block's layers to the host (a restore or a rollback
                # to an earlier depth takes them away): the packets describe the network as it is.
                self.layer_stats = LayerStats(self.model.layer_names, list(self.model.layers), root=self.model)
            self.model.train()  # a seed or block arrives in the mode it was built in
            self._epoch_structure = structure
        elif not self.model.training:
            self.model.train()
        self.layer_stats.reset()
        trainable = self.manager.trainable_slots()
        self.grad_norms.track(
            {
                **{f"layer:{n}": [w] for n, w in zip(self.layer_stats.names, self.layer_stats.weights, strict=True)},
                **{f"seed:{sid}": self.manager.seed_parameters(sid) for sid in trainable},
            }
        )
        loss_sum = torch.zeros((), device=self.device)
        n_train = len(self.data.train)
        steps = -(-n_train // self.batch_size)
        sampled = grad_norm_steps(steps)
        # Stages change between epochs only (gates, commands), so the step's kind is fixed here,
        # and so are the engine's path, the precision and the ranks: each step below calls only
        # what this epoch needs (a few microseconds a step on the smallest hosts).
        aggregate = self.config.aggregation.aggregates(len(trainable))
        step = self.engine.epoch_step()
        parallel = self.collective.world > 1
        scaled = self.precision.scaler is not None
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        # Data-parallel, each rank draws its own dropout masks for its shard; every rank is back
        # on the shared stream afterwards (a single process draws from the run's stream as ever).
        with self.collective.rank_rng(salt=self.data_seed * 100_003 + self.epoch):
            for i, (x, y) in enumerate(self.batches.epoch(self.epoch)):
                if aggregate or parallel:
                    # The global batch this step's shard belongs to (the last one may be short).
                    share = int(y.shape[0]) / min(self.batch_size, n_train - i * self.batch_size)
                if aggregate:
                    loss_sum += self._aggregated_step(x, y, trainable, share=share)
                else:
                    # Short-circuit: zero or one trainable seed is the plain single backward.
                    loss_sum += step(x, y)
                    if parallel:
                        # Outside the step closure (eager, compiled and captured steps alike):
                        # every rank now holds the global batch's gradient.
                        self.collective.sum_gradients(params, weight=share)
                # Outside the step closure: per-seed and per-layer metrics stay plain and eager.
                if scaled:
                    self.precision.unscale(self.optimizer)
                if i in sampled:
                    self.grad_norms.step()
                if scaled:
                    self.precision.step(self.optimizer)
                else:
                    self.optimizer.step()
        # Every trainable seed saw every sample of the epoch (each passes through every slot).
        self.manager.attribute_batch(n_train)
        self.collective.sum_(loss_sum)
        self.collective.average_buffers(self.model)
        train_loss = loss_sum.item() / n_train  # the epoch's one sync
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        train_ms = (time.perf_counter() - start) * 1e3

        val_start = time.perf_counter()
        # Validation, the gate probes and the bottleneck signal all run in eval mode: one switch.
        with eval_mode(self.model):
            with self.layer_stats.watch_activations():
                val = self.evaluate(self.data.val)
            failure = epoch_failure(
                train_loss=train_loss,
                val_loss=val.loss,
                best_val_loss=self.best_val_loss,
                ratio=self.config.safety.loss_spike_ratio,
            )
            if failure is not None:
                # Nothing of this epoch may be committed: the session restores the last commit.
                raise EpochFailed(f"epoch {self.epoch}: {failure}")
            self.best_val_loss = val.loss if self.best_val_loss is None else min(self.best_val_loss, val.loss)
            norms = self.grad_norms.reduce()  # the epoch's one device sync for gradient norms
            probes = {sid: self._probe_loss(sid, alpha) for sid, alpha in self.manager.probe_plan().items()}
            bottlenecks = self.activation_grad_norms() if "activation_grad_norm" in self.signals else {}
        verdicts = self.manager.end_epoch(
            EpochObservation(
                val_loss=val.loss,
                seed_grad_norms={k[5:]: v for k, v in norms.items() if k.startswith("seed:")},
                probe_losses=probes,
                isolation_probe=self.isolation_probe,
                sample_input=self.slot_input,
            )
        )
        val_ms = (time.perf_counter() - val_start) * 1e3
        total_ms = (time.perf_counter() - start) * 1e3
        packet = SystemStatePacket(
            run_id=self.run_id,
            epoch=self.epoch,
            train_loss=train_loss,
            val_loss=val.loss,
            val_accuracy=val.accuracy,
            classifies=val.classified,
            train_accuracy=self.train_accuracy() if "train_accuracy" in self.signals else None,
            learning_rate=self.optimizer.param_groups[0]["lr"],
            epoch_latency_ms=train_ms,
            latency_budget_ms=self.config.latency_budget_ms,
            host_params=sum(p.numel() for p in self.model.host_parameters()),
            layers=self.layer_stats.export(
                {k[6:]: v for k, v in norms.items() if k.startswith("layer:")},
                self.model.layer_widths,
                samples=len(self.data.val),
            ),
            seeds=self.manager.export_seed_states(activation_grad_norms=bottlenecks),
        )
        engine_metrics, engine_events = self.engine.end_epoch()
        h2d_copy_ms, staging_events = self.batches.drain()
        engine_metrics.append(MetricPoint(name="tolaria.data.h2d_copy_ms", value=h2d_copy_ms, unit="ms"))
        engine_metrics.append(MetricPoint(name="tolaria.parallel.processes", value=float(self.collective.world)))
        engine_metrics.append(
            MetricPoint(name="tolaria.parallel.exchange_ms", value=self.collective.drain_exchange_ms(), unit="ms")
        )
        engine_events += staging_events
        engine_metrics += [MetricPoint(name=n, value=v) for n, v in self.grad_agg_stats.reduce().items()]
        metrics = self._metrics(packet, train_ms=train_ms, val_ms=val_ms, total_ms=total_ms) + tuple(engine_metrics)
        self.epoch += 1
        del verdicts  # recorded as events by the manager
        return EpochResult(
            packet=packet,
            metrics=metrics,
            events=(*engine_events, *self.manager.drain_events()),
            train_ms=train_ms,
            total_ms=total_ms,
        )

    def _schedule_lr(self) -> None:
        """Set this epoch's learning rates from ``TrainerConfig.lr_schedule``.

        Each group remembers the factor it last got (``lr_factor``, saved with the optimizer's
        state), and its rate is rescaled from that one to this epoch's. Rescaling, rather than
        setting ``base * factor`` as ``torch.optim.lr_scheduler`` does from the rates it saw at
        construction, keeps what changed a group's rate since: a seed group added later with its
        own ``lr_scale``, Tamiyo's learning-rate commands, the halving of a failed-epoch retry.
        """
        if self.config.lr_schedule == "constant":
            return
        factor = self.config.lr_factor(self.epoch, self.total_epochs)
        for group in self.optimizer.param_groups:
            group["lr"] *= factor / group.get("lr_factor", 1.0)
            group["lr_factor"] = factor

    def _metrics(
        self, packet: SystemStatePacket, *, train_ms: float, val_ms: float, total_ms: float
    ) -> tuple[MetricPoint, ...]:
        seeds = packet.seeds
        points = [
            MetricPoint(name="tolaria.training.latency_ms", value=train_ms, unit="ms"),
            MetricPoint(name="tolaria.validation.latency_ms", value=val_ms, unit="ms"),
            MetricPoint(name="tolaria.epoch.latency_ms", value=total_ms, unit="ms"),
            MetricPoint(name="tolaria.training.loss", value=packet.train_loss),
            MetricPoint(name="tolaria.validation.loss", value=packet.val_loss),
            MetricPoint(name="tolaria.validation.accuracy", value=packet.val_accuracy),
            MetricPoint(name="tolaria.train.amp_enabled", value=float(self.precision.enabled)),
            MetricPoint(name="tolaria.epochs_total", value=1.0),
            MetricPoint(
                name="kasmina.seeds.active",
                value=float(sum(1 for s in seeds if s.stage.is_active)),
            ),
        ]
        for s in seeds:
            points.append(MetricPoint(name="kasmina.seed.alpha", value=s.alpha, labels={"slot": s.slot_id}))
            for key in ("grad_norm", "kernel_load_ms", "kernel_first_use_ms"):
                if key in s.metrics:
                    name = f"kasmina.seed.{key}" if key == "grad_norm" else f"kasmina.kernel.{key[7:]}"
                    points.append(MetricPoint(name=name, value=s.metrics[key], labels={"slot": s.slot_id}))
        return tuple(points)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, split: AnySplit) -> EvalResult:
        """Mean loss and accuracy on ``split`` under ``torch.inference_mode()``.

        Accuracy counts argmax hits when the targets are class indices; it is 0 otherwise.
        """
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        classified = True
        with eval_mode(self.model), torch.inference_mode():
            for x, y in self._eval_batches(split):
                logits = self.model(x)
                loss_sum += self.loss_fn(logits, y).float() * y.shape[0]
                classified = classifies(logits, y)
                if classified:
                    correct += (logits.argmax(dim=1) == y).sum()
        n = len(split)
        return EvalResult(loss=loss_sum.item() / n, accuracy=correct.item() / n, classified=classified)

    def _eval_batches(self, split: AnySplit) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        size = self.config.val_batch_size
        if isinstance(split, Split):
            for start in range(0, len(split), size):
                yield split.x[start : start + size], split.y[start : start + size]
            return
        # A user's data set, read in order; the loader's workers are the training loader's.
        workers = self.config.loader.num_workers
        # Its own generator: starting a loader draws a seed, which must not come from the global RNG.
        loader = DataLoader(
            split.dataset,
            batch_size=size,
            shuffle=False,
            num_workers=workers,
            generator=torch.Generator(),
            multiprocessing_context=self.config.loader.multiprocessing_context if workers > 0 else None,
        )
        for x, y in loader:
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _probe_loss(self, slot_id: str, alpha: float) -> float:
        with self.manager.probe(slot_id, alpha):
            return self.evaluate(self.data.val).loss

    def isolation_probe(self, slot_id: str) -> float:
        """Largest difference of host gradients with the TRAINING seed present vs absent, relative
        to the largest host gradient (G3): scale-free, so one tolerance serves every model."""
        x, y = self._probe_batch
        params = self.model.host_parameters()

        def host_grads() -> list[torch.Tensor]:
            # Both passes draw the same dropout masks (a transformer's layers hold dropout), and
            # the run's own RNG stream is left where it was.
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(0)
                loss = self.loss_fn(self.model(x), y)
                return list(torch.autograd.grad(loss, params))

        with_seed = host_grads()
        with self.manager.without_seed(slot_id):
            without = host_grads()
        diff = max((a - b).abs().max().item() for a, b in zip(with_seed, without, strict=True))
        scale = max(b.abs().max().item() for b in without)
        if scale == 0.0:
            # A host with no gradient at all: any difference is a leak, none is isolation.
            return 0.0 if diff == 0.0 else math.inf
        return diff / scale

    def activation_grad_norms(self) -> dict[str, float | None]:
        """The bottleneck signal of each slot that can act, on the probe batch (``slotgrads``
        says how and why there, not in the training steps); the run's numbers do not change by
        measuring it. Slots that cannot act are left out (None in the packet)."""
        acting = {sid: slot for sid, slot in self.manager.slots.items() if slot.stage in ACTING_STAGES}
        if not acting:
            return {}
        x, y = self._probe_batch
        return slot_activation_grad_norms(self.model, acting, self.loss_fn, x, y)

    def train_accuracy(self) -> float | None:
        """Accuracy on a fixed sample of the training split (``slotgrads.sample_accuracy``)."""
        if self._accuracy_sample is None:
            x, y = self.data.train.head(min(len(self.data.train), self.config.train_accuracy_samples))
            self._accuracy_sample = (x.to(self.device), y.to(self.device))
        return sample_accuracy(self.model, *self._accuracy_sample)

    def grown_flops(self) -> int:
        """FLOPs of one sample's forward pass with every seed the network holds at full weight
        (``KasminaConfig.max_flops``): what the network costs if every seed in it is kept."""
        with contextlib.ExitStack() as stack:
            for slot_id, slot in self.manager.slots.items():
                if slot.seed is not None:
                    stack.enter_context(self.manager.probe(slot_id, 1.0))
            return forward_flops(self.model, self._probe_batch[0][:1])

    def slot_input(self, slot_id: str) -> torch.Tensor:
        """The activation a seed in ``slot_id`` reads, for the probe batch: the activation entering
        a branch slot, or the widened layer's input for a width slot."""
        captured: list[torch.Tensor] = []
        reader = self.manager.slots[slot_id].reader
        handle = reader.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
        try:
            with torch.inference_mode():
                self.model(self._probe_batch[0])
        finally:
            handle.remove()
        return captured[0]

    def site_signals(self, reader: nn.Module, joiner: nn.Module, batches: int) -> list[SiteSignals]:
        """The host's signals at a seed's site on the first ``batches`` training batches, in data
        order (``kasmina.signals.GrowthSignals``): eval mode (a BatchNorm's running statistics are
        read, not updated, and dropout draws nothing), no parameter gradient kept, no RNG drawn,
        so a resumed run germinates the same seed. Kasmina's data-aware initialisations read
        them once, at germination."""
        with eval_mode(self.model):
            return site_signals(self.model, reader, joiner, self.first_batches(batches), self.loss_fn)

    def first_batches(self, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``batches`` training batches in data order, on the device (no RNG drawn):
        what a seed's data-aware initialisation reads at germination."""
        x_all, y_all = self.data.train.head(batches * self.batch_size)
        return [
            (
                x_all[start : start + self.batch_size].to(self.device),
                y_all[start : start + self.batch_size].to(self.device),
            )
            for start in range(0, len(y_all), self.batch_size)
        ]

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self, *, in_memory: bool = False) -> dict[str, Any]:
        """Everything needed to resume exactly: model, optimizer, seeds, RNG, epoch.

        ``in_memory``: also the seed manager's undrained events (for a fork, never a checkpoint).
        """
        return {
            "epoch": self.epoch,
            "best_val_loss": self.best_val_loss,
            "manager": self.manager.state_dict(in_memory=in_memory),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "precision": self.precision.state_dict(),
            "engine": self.engine.state_dict(),
            "rng": capture_rng(),
        }

    def load_state_dict(self, state: dict[str, Any], *, load_kernel: Callable[[KernelArtifact], LoadedKernel]) -> None:
        """Restore a ``state_dict`` (seeds re-fetched through ``load_kernel``)."""
        self.manager.load_state_dict(state["manager"], load_kernel=load_kernel)
        self.model.to(self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state["precision"])
        self.engine.load_state_dict(state["engine"])
        restore_rng(state["rng"])
        self.epoch = int(state["epoch"])
        self.best_val_loss = state["best_val_loss"]


def _optimizer(params: list[nn.Parameter], config: TrainerConfig) -> torch.optim.Optimizer:
    # Fused updates (one kernel per parameter group, on CPU as on CUDA) beat the multi-tensor
    # ones of seed 000's change 6 on these small hosts: with one thread, Adam on the MNIST-1D MLP
    # 198 -> 81 us a step, SGD on the digits MLP 105 -> 63 us (docs/performance.md, "The training bench").
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay, fused=True)
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay, fused=True)


def count_parameters(module: nn.Module) -> int:
    """All parameters of ``module`` (host plus seeds)."""
    return sum(p.numel() for p in module.parameters())
