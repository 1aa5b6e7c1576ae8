"""Shared pieces of the training benchmark: options, the bare-PyTorch twin and loop, a seed for a slot."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from esper_core.contracts import BlendSchedule
from esper_core.data import AnySplit, Split, epoch_batches, epoch_order
from esper_core.hosts import CNNHost
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.kinds import Residual
from esper_core.kasmina.loader import LoadedKernel, load_kernel
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.plan import slot_blueprints
from esper_core.tezzeret.compiler import compile_blueprint
from esper_core.tolaria.loop import EvalResult, Trainer
from esper_core.tolaria.modes import eval_mode
from esper_core.tolaria.precision import AMP_CHOICES
from esper_core.tolaria.slotgrads import classifies


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """Options shared by the training benchmarks (names as the seeds' harness used them)."""

    epochs: int = 30
    """Timed epochs per path (at least; see ``min_timed_s``)."""
    min_timed_s: float = 0.0
    """Time at least this many seconds of the bare loop: a workload whose epochs are short runs
    more than ``epochs`` (a 1.5 ms ``seed-reference`` epoch gives 45 ms of samples in 30, and
    its p50 ratio moves by several per cent from run to run). 0: exactly ``epochs``."""
    warmup_batches: int = 20
    """Untimed steps before timing, rounded up to whole epochs."""
    device: str = "cpu"
    compile: str = "auto"
    """Step engine mode for the 'chosen' path: ``auto``, ``on`` or ``off`` (``--no-compile``)."""
    compile_mode: str | None = None
    compile_dynamic: bool | None = False
    compile_warmup_steps: int = 2
    seeds: int = 1
    """Seeds germinated before timing (0 or 1); the seed trains in isolation (TRAINING)."""
    gpu_dataset: bool = True
    """Keep the training split on the device (CUDA); False stages batches from pinned host memory."""
    amp: str = "auto"
    """Precision of all three paths (``TrainerConfig.amp``): ``auto`` is bf16 autocast on CUDA and
    fp32 on CPU. The bare loop runs under the autocast Esper resolved, so the ratio compares
    machinery at one precision."""
    cuda_graphs: bool = False
    """Capture the chosen path's step as a CUDA graph (``StepEngineConfig.enable_graphs``); the
    eager path and the bare loop run without. Reported and skipped on CPU, as in a run."""

    def __post_init__(self) -> None:
        if self.epochs < 5:
            raise ValueError(f"epochs must be >= 5 for a p95 to mean anything, got {self.epochs}")
        if self.min_timed_s < 0:
            raise ValueError(f"min_timed_s (--min-seconds) must be >= 0 (0: exactly epochs), got {self.min_timed_s}")
        if self.warmup_batches < 0:
            raise ValueError(f"warmup_batches must be >= 0, got {self.warmup_batches}")
        if self.seeds not in (0, 1):
            raise ValueError(f"seeds must be 0 or 1, got {self.seeds}")
        if self.amp not in AMP_CHOICES:
            raise ValueError(f"amp (--amp) must be one of {AMP_CHOICES}, got {self.amp!r}")


BENCH_WIDTH = "width-100"
"""The width seed benchmarked on a host that grows in width only: doubling a layer, the step the
learned width policies take (docs/growth-results.md, "Width growth")."""


def bare_twin(trainer: Trainer, spec: ModelSpec | None = None) -> nn.Module:
    """A plain module doing the same computation as the trainer's host, seeds included.

    A built-in host becomes an ``nn.Sequential`` of its layers; a user's model (``ModelSpec``) is
    rebuilt by its own ``build()`` with the host's weights. Each active branch seed becomes an
    ordinary residual block built from Karn with the seed's weights, after the module it grows
    on; an active width seed widens its layer (the static network of the grown size). The
    ratio against it measures Esper's machinery (isolation, bookkeeping, metrics), not the seed.

    Args:
        trainer: The trainer whose host (and seeds) the twin copies.
        spec: The recipe's ``ModelSpec`` when the host is a user's model (needed to rebuild it).
    """
    if isinstance(trainer.model, GrowableModel):
        if spec is None:
            raise ValueError("the host is a user's model: pass its recipe's ModelSpec to rebuild it bare")
        return _bare_user_model(trainer, trainer.model, spec)
    host = trainer.model
    slots = {slot.layer: slot for slot in trainer.manager.slots.values()}
    layers: list[nn.Module] = []
    last = len(host.layers) - 1
    for i, (name, layer) in enumerate(zip(host.layer_names, host.layers, strict=True)):
        if isinstance(host, CNNHost) and i == last:
            layers += [nn.AdaptiveAvgPool2d(2), nn.Flatten()]
        slot = slots.get(name)
        if slot is not None:
            block = _seed_block(trainer, slot.slot_id)
            if block is not None:
                layers.append(block)
        clone = type(layer)(*_shape_args(layer))
        clone.load_state_dict(layer.state_dict())
        layers.append(clone)
        if i < last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _seed_block(trainer: Trainer, slot_id: str) -> nn.Module | None:
    """The seed in ``slot_id`` of a built-in host as a plain residual block, or None for an empty
    slot (a built-in host has branch slots only)."""
    slot = trainer.manager.slots[slot_id]
    state = next(s for s in trainer.manager.export_seed_states() if s.slot_id == slot_id)
    if slot.seed is None or state.blueprint_id is None:
        return None
    block = default_catalog().build(state.blueprint_id, slot.profile)
    block.load_state_dict(slot.seed.state_dict())
    return Residual(block)


def _bare_user_model(trainer: Trainer, host: GrowableModel, spec: ModelSpec) -> nn.Module:
    """The user's model built afresh (no slot hooks) with the host's weights and every live seed
    as plain PyTorch, merged where its kind merges (``SeedManager.copy_seeds_into``): an active
    width seed widens its layer, so the twin is the static network at the widened size."""
    # On the trainer's device before the seeds are merged in (a width merge concatenates the
    # seed's weights onto the layer's: on the 2026-11-28 lease a CPU-built twin failed there).
    model = spec.build().to(trainer.device)
    model.load_state_dict(host.model.state_dict())
    trainer.manager.copy_seeds_into(model, merged=True)
    return model


def unmerged_twin(trainer: Trainer, spec: ModelSpec | None) -> nn.Module | None:
    """The bare twin with each live seed that would merge kept beside its layer, as it trains: the
    same computation as Esper's, in plain PyTorch. None when no such seed is live.

    ``bare_twin`` merges a width seed into its layer: the static network of the grown size, the
    yardstick a user compares growth against. While the seed trains in isolation Esper computes
    more than that network (the seed's fan-in and fan-out beside the host's layers, and a host
    that does not see the seed's gradient), so against it the ratio holds the seed's structural
    cost too. Here the seed is a plain copy of itself, run by hooks with the isolation's
    arithmetic (``SeedKind.copy_into`` unmerged): the ratio against this twin is Esper's
    machinery alone, as it is for a branch seed.

    Args:
        trainer: The trainer whose host (and seeds) the twin copies.
        spec: The recipe's ``ModelSpec``; width seeds grow only a user's model.
    """
    merging = [s for s in trainer.manager.slots.values() if s.seed is not None and s.kind.merges]
    if not merging or spec is None or not isinstance(trainer.model, GrowableModel):
        return None
    model = spec.build().to(trainer.device)
    model.load_state_dict(trainer.model.model.state_dict())
    trainer.manager.copy_seeds_into(model, merged=False)
    return model


def _shape_args(layer: nn.Module) -> tuple:
    if isinstance(layer, nn.Conv2d):
        return (layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding)
    assert isinstance(layer, nn.Linear)
    return (layer.in_features, layer.out_features)


_FULL_PRECISION = contextlib.nullcontext()


class BareLoop:
    """The bare training loop: zero_grad, forward, loss, backward, optimizer step, one sync an
    epoch; the same optimizer (SGD with momentum, or Adam), per-epoch learning-rate schedule and
    precision (the trainer's autocast dtype, a GradScaler for fp16) as the trainer, written as a
    person would with ``torch.optim`` and ``torch.autocast``.

    ``fused``: the optimizer's implementation. True (the yardstick) is the fused update Tolaria
    uses (``tolaria.loop``), so a ratio measures Esper's own machinery, not its choice of
    optimizer kernel; None is PyTorch's default (foreach on CUDA, a per-parameter loop on CPU),
    what a person who never passes ``fused`` gets, reported beside it."""

    def __init__(self, model: nn.Module, trainer: Trainer, *, fused: bool | None = True) -> None:
        cfg = trainer.config
        self.model = model.to(trainer.device)
        self.device = trainer.device
        if cfg.optimizer == "adam":
            self.opt: torch.optim.Optimizer = torch.optim.Adam(
                self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused
            )
        else:
            self.opt = torch.optim.SGD(
                self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused
            )
        total = trainer.total_epochs
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda e: cfg.lr_factor(e, total))
        self.loss_fn = trainer.loss_fn
        self.split = trainer.data.train
        self.val = trainer.data.val
        self.batch_size = trainer.batch_size
        self.val_batch_size = cfg.val_batch_size
        self.seed = trainer.data_seed
        self.dtype = trainer.precision.dtype
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype is torch.float16 else None

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        # Full precision enters one shared no-op context: the bare loop is the yardstick, and a
        # new context manager a step would slow it on the smallest workloads.
        if self.dtype is None:
            return _FULL_PRECISION
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def _batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if isinstance(self.split, Split):
            return epoch_batches(self.split, batch_size=self.batch_size, seed=self.seed, epoch=epoch)
        order = epoch_order(len(self.split), seed=self.seed, epoch=epoch).tolist()
        loader = DataLoader(self.split.dataset, batch_size=self.batch_size, sampler=order)
        return ((x.to(self.device), y.to(self.device)) for x, y in loader)

    def epoch(self, epoch: int) -> float:
        """Train one epoch; returns its wall time in ms."""
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        for x, y in self._batches(epoch):
            self.opt.zero_grad(set_to_none=True)
            with self._autocast():
                loss = self.loss_fn(self.model(x), y)
            if self.scaler is None:
                loss.backward()
                self.opt.step()
            else:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            loss_sum += loss.detach() * y.shape[0]
        self.schedule.step()
        loss_sum.item()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - start) * 1e3

    def validate(self) -> float:
        """Loss on the validation split under inference mode, as a plain loop would check it
        every epoch; returns its wall time in ms."""
        start = time.perf_counter()
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device)
        with torch.inference_mode():  # full precision, as Trainer.evaluate
            for x, y in _eval_batches(self.val, self.val_batch_size, self.device):
                loss_sum += self.loss_fn(self.model(x), y) * y.shape[0]
        loss_sum.item()
        self.model.train()
        return (time.perf_counter() - start) * 1e3

    def evaluate(self, split: AnySplit) -> EvalResult:
        """Mean loss and accuracy on ``split`` under inference mode, as ``Trainer.evaluate``
        counts them: argmax hits for class targets, 0 accuracy otherwise (a language model's
        next-token loss, say)."""
        loss_sum = torch.zeros((), device=self.device)
        correct = 0
        classified = True
        with eval_mode(self.model), torch.inference_mode():
            for x, y in _eval_batches(split, self.val_batch_size, self.device):
                logits = self.model(x)
                loss_sum += self.loss_fn(logits, y).float() * y.shape[0]
                classified = classifies(logits, y)
                if classified:
                    correct += int((logits.argmax(dim=1) == y).sum())
        return EvalResult(loss=loss_sum.item() / len(split), accuracy=correct / len(split), classified=classified)


def _eval_batches(split: AnySplit, size: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(split, Split):
        for start in range(0, len(split), size):
            yield split.x[start : start + size], split.y[start : start + size]
        return
    for x, y in DataLoader(split.dataset, batch_size=size):
        yield x.to(device), y.to(device)


def germinate_one(trainer: Trainer, config: RunConfig) -> str:
    """Germinate one seed the way ``config``'s host grows, for the warm-up epochs to promote to
    TRAINING; returns the slot id.

    A host with branch slots gets the low-rank adapter (the seeds' workload) where it fits, else
    the first of the recipe's blueprints (all approved ones when it lists none) that fits a slot,
    compiled in memory (no registry), in the first slot it fits. A host that grows from itself
    only gets, on its first such slot, ``BENCH_WIDTH`` where the slot's kind offers it (a width
    slot, initialised as the recipe says), else the first entry of its kind's menu (a depth slot:
    a stacked copy of the stack's last block).

    Raises:
        ValueError: no blueprint fits any slot of the host.
    """
    catalog = default_catalog()
    slots = trainer.manager.slots
    compiled = {sid: slot.profile for sid, slot in slots.items() if slot.kind.compiled}
    listed = slot_blueprints(config, catalog=catalog, slot_profiles=compiled, approved=config.approved_blueprints)
    adapter = catalog.get("lowrank_adapter")
    candidates = [("lowrank_adapter", sid) for sid, profile in compiled.items() if adapter.supports(profile)]
    candidates += [
        (b, sid) for b in dict.fromkeys(b for bs in listed.values() for b in bs) for sid in listed if b in listed[sid]
    ]
    if not candidates:
        # A host that grows from itself only (width or depth slots): the first such slot.
        # Not a kind kept at once (a doubled stream): no seed would stay in TRAINING to measure.
        candidates = [
            (BENCH_WIDTH if BENCH_WIDTH in slot.kind.menu else slot.kind.menu[0], sid)
            for sid, slot in slots.items()
            if not slot.kind.compiled and not slot.kind.immediate
        ][:1]
    if not candidates:
        raise ValueError(f"no blueprint of recipe {config.recipe} fits a slot of this host; bench with --seeds 0")
    blueprint_id, slot_id = candidates[0]

    def compile_in_memory(blueprint_id: str, profile: ShapeProfile) -> LoadedKernel:
        kernel = compile_blueprint(catalog, blueprint_id, profile, device=trainer.device)
        return load_kernel(kernel.artifact, kernel.blob, catalog=catalog, device=trainer.device)

    verdict = trainer.manager.germinate(
        slot_id,
        blueprint_id,
        params={},
        blend_schedule=BlendSchedule.LINEAR,
        blend_epochs=1,
        lr_scale=1.0,
        kernels=compile_in_memory,
    )
    if not verdict.passed:
        raise RuntimeError(f"benchmark seed refused by G0: {verdict.reason}")
    trainer.manager.drain_events()
    return slot_id
