"""Shared pieces of the training benchmarks: options, the bare-PyTorch twin, a seed for a slot."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.contracts import BlendSchedule
from esper_core.data import Split, epoch_batches
from esper_core.hosts import CNNHost
from esper_core.karn.catalog import default_catalog
from esper_core.kasmina.loader import load_kernel
from esper_core.tezzeret.compiler import compile_blueprint
from esper_core.tolaria.loop import Trainer


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """Options shared by the training benchmarks (names as the seeds' harness used them)."""

    epochs: int = 30
    """Timed epochs per path."""
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

    def __post_init__(self) -> None:
        if self.epochs < 5:
            raise ValueError(f"epochs must be >= 5 for a p95 to mean anything, got {self.epochs}")
        if self.warmup_batches < 0:
            raise ValueError(f"warmup_batches must be >= 0, got {self.warmup_batches}")
        if self.seeds not in (0, 1):
            raise ValueError(f"seeds must be 0 or 1, got {self.seeds}")


class _Residual(nn.Module):
    """``x + block(x)``: how a plain PyTorch model would carry the seed's block."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def bare_twin(trainer: Trainer) -> nn.Module:
    """A plain ``nn.Sequential`` doing the same computation as the trainer's host: its layers, plus
    each active seed as an ordinary residual block built from Karn with the seed's weights. The
    ratio against it measures Esper's machinery (isolation, bookkeeping, metrics), not the seed."""
    host = trainer.model
    slots = {slot.layer: slot for slot in trainer.manager.slots.values()}
    seeds = {s.slot_id: s for s in trainer.manager.export_seed_states() if s.blueprint_id is not None}
    catalog = default_catalog()
    layers: list[nn.Module] = []
    last = len(host.layers) - 1
    for i, (name, layer) in enumerate(zip(host.layer_names, host.layers, strict=True)):
        if isinstance(host, CNNHost) and i == last:
            layers += [nn.AdaptiveAvgPool2d(2), nn.Flatten()]
        slot = slots.get(name)
        if slot is not None and slot.slot_id in seeds and slot.seed is not None:
            state = seeds[slot.slot_id]
            block = catalog.build(state.blueprint_id or "", slot.profile)
            block.load_state_dict(slot.seed.state_dict())
            layers.append(_Residual(block))
        clone = type(layer)(*_shape_args(layer))
        clone.load_state_dict(layer.state_dict())
        layers.append(clone)
        if i < last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _shape_args(layer: nn.Module) -> tuple:
    if isinstance(layer, nn.Conv2d):
        return (layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding)
    assert isinstance(layer, nn.Linear)
    return (layer.in_features, layer.out_features)


class BareLoop:
    """The bare training loop: zero_grad, forward, loss, backward, SGD step, one sync an epoch."""

    def __init__(self, model: nn.Module, trainer: Trainer) -> None:
        cfg = trainer.config
        self.model = model.to(trainer.device)
        self.device = trainer.device
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            # PyTorch's default implementation, as a person would write it; Esper's own
            # choices (foreach updates and the rest) are what the ratio measures.
        )
        self.split = trainer.data.train
        self.batch_size = trainer.batch_size
        self.seed = trainer.data_seed

    def epoch(self, epoch: int) -> float:
        """Train one epoch; returns its wall time in ms."""
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        for x, y in epoch_batches(self.split, batch_size=self.batch_size, seed=self.seed, epoch=epoch):
            self.opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            loss_sum += loss.detach() * y.shape[0]
        loss_sum.item()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - start) * 1e3

    def accuracy(self, split: Split) -> float:
        """Accuracy on ``split`` under inference mode."""
        self.model.eval()
        with torch.inference_mode():
            acc = (self.model(split.x).argmax(dim=1) == split.y).sum().item() / len(split)
        self.model.train()
        return acc


def germinate_one(trainer: Trainer, blueprint_id: str = "lowrank_adapter") -> str:
    """Compile ``blueprint_id`` for the first slot it fits (in memory, no registry), germinate it
    and promote it to TRAINING; returns the slot id."""
    catalog = default_catalog()
    descriptor = catalog.get(blueprint_id).descriptor
    slot = next(s for s in trainer.manager.slots.values() if s.profile.kind in descriptor.host_kinds)
    kernel = compile_blueprint(catalog, blueprint_id, slot.profile, device=trainer.device)
    loaded = load_kernel(kernel.artifact, kernel.blob, catalog=catalog, device=trainer.device)
    verdict = trainer.manager.germinate(
        slot.slot_id, loaded, params={}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=1, lr_scale=1.0
    )
    if not verdict.passed:
        raise RuntimeError(f"benchmark seed refused by G0: {verdict.reason}")
    trainer.manager.drain_events()
    return slot.slot_id
