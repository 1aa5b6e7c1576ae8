"""The complete configuration of one morphogenesis run, and the specs of a user's model and data.

A recipe (built in, or a user's function found by import path) returns a ``RunConfig``. Its host
is either one of Esper's built-in hosts (``HostConfig``) or the user's own ``nn.Module``
(``ModelSpec``: a function that builds it and the names of the modules seeds may grow on); its
data is a bundled data set (``DataConfig``) or the user's (``DataSpec``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.data import DataConfig, DataSpec
from esper_core.hosts import HostConfig
from esper_core.karn.depth import DEPTH_MENU
from esper_core.karn.stream import STREAM_MENU
from esper_core.karn.width import WIDTH_MENU
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.depth import DEPTH_SLOT_SUFFIX
from esper_core.kasmina.stream.slot import STREAM_SLOT
from esper_core.kasmina.width import WIDTH_SLOT_SUFFIX
from esper_core.run.task import EpisodeTask
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tolaria.checkpoint import CheckpointConfig
from esper_core.tolaria.config import TrainerConfig

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(outputs, targets)`` -> the batch's mean loss (a 0-d tensor)."""


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """A user's own network as the host of a run.

    Example::

        ModelSpec(build=lambda: MyNet(width=32), slots=("body.1", "head.0"))

    A seed slot sits on the **output** of each named module: a seed learns a delta of that
    output, blended in as ``output + alpha * seed(output)``. Slot shapes are discovered by a dry
    forward on the meta device (see ``esper_core.kasmina.graft``). A module that returns a tuple
    (``nn.LSTM``) takes a slot on one element: ``"lstm[0]"``.
    """

    build: Callable[[], nn.Module]
    """Returns a fresh model; called once per run, after the run's RNGs are seeded."""
    slots: Sequence[str] = ()
    """Dotted module names from ``model.named_modules()``, e.g. ``("layer1", "blocks.2.mlp")``."""
    batch_max: int = 512
    """Largest batch a slot must accept; seed kernels are compiled for it."""
    input_dtype: torch.dtype = torch.float32
    """The dtype of one input sample: ``torch.long`` for a model that takes token ids."""
    causal: bool = False
    """The model is causal (a language model predicting the next token): seeds on its (L, D)
    token slots never read a later position (``esper_core.karn.blueprints_tok``)."""
    widen: Sequence[str] = ()
    """Dotted names of ``Linear`` / ``Conv1d`` / ``Conv2d`` layers Tamiyo may widen. Each gets a
    width slot ``"<name>+width"`` whose seeds add units to the layer (and the matching inputs to
    the layer that reads it), merged in place when they fossilise. A layer whose output is read by
    something that cannot be extended (a residual add, a concatenation, the model's output) is
    refused with the reason (``esper_core.kasmina.width``)."""
    deepen: Sequence[str] = ()
    """Dotted names of ``nn.ModuleList`` / ``nn.Sequential`` stacks of identical blocks Tamiyo may
    deepen (transformer blocks, residual stages of one width). Each gets a depth slot
    ``"<name>+depth"`` whose seeds insert one block after the stack's last, blended in from the
    identity, and appended to the stack when they fossilise. A stack whose blocks differ, change
    their input's shape, or that ``forward()`` does not run as a chain, is refused with the reason
    when the run is planned (``esper_core.kasmina.depth``)."""
    widen_stream: bool = False
    """Tamiyo may double the model's width (a transformer's d_model: embeddings, every projection,
    LayerNorms, a tied head, twice the heads, the MLPs' hidden widths) with a stream slot
    ``"stream"``: applied in place, keeping the function, and kept at once. A model whose modules
    meet the stream in a way that cannot be followed is refused with the reason when the run is
    planned (``esper_core.kasmina.stream``); it cannot be combined with ``widen`` or ``slots``."""
    build_scaled: Callable[[float], nn.Module] | None = None
    """Optional: ``build_scaled(factor)`` returns the same architecture with every hidden width
    multiplied by ``factor`` (``build_scaled(1.0)`` is ``build()``'s). It lets ``esper bench
    growth`` train the static frontier a grown network is measured against; without it the
    benchmark refuses the recipe."""

    def __post_init__(self) -> None:
        if not callable(self.build):
            raise ValueError(f"ModelSpec.build must be a function returning an nn.Module, got {type(self.build)}")
        if isinstance(self.slots, str):
            raise ValueError(
                f"slots must be a sequence of module names, got the string {self.slots!r}: write ({self.slots!r},)"
            )
        if isinstance(self.widen, str):
            raise ValueError(
                f"widen must be a sequence of layer names, got the string {self.widen!r}: write ({self.widen!r},)"
            )
        if isinstance(self.deepen, str):
            raise ValueError(
                f"deepen must be a sequence of stack names, got the string {self.deepen!r}: write ({self.deepen!r},)"
            )
        self.slots, self.widen, self.deepen = tuple(self.slots), tuple(self.widen), tuple(self.deepen)
        if not self.slots and not self.widen and not self.deepen and not self.widen_stream:
            raise ValueError(
                "ModelSpec needs at least one slot or layer to widen, or a stack to deepen: name a module whose output "
                "a seed may grow on (slots=...), a Linear/Conv layer to widen (widen=...), a ModuleList of blocks "
                "to deepen (deepen=...), or let the model's width double (widen_stream=True)"
            )
        if self.widen_stream and (self.widen or self.slots):
            raise ValueError(
                f"widen_stream doubles every layer that meets the model's width, and the width slots of {self.widen} "
                f"and branch slots {self.slots} (whose seeds are built for the width they start at) would not "
                "follow: choose widen_stream=True alone (with deepen=... if you like), or slots/widen without it"
            )
        for name in self.widen:
            if WIDTH_SLOT_SUFFIX in name:
                raise ValueError(
                    f"widen names layers, got the slot id {name!r}: write {name.replace(WIDTH_SLOT_SUFFIX, '')!r}"
                )
        doubled = sorted({n for n in self.widen if self.widen.count(n) > 1})
        if doubled:
            raise ValueError(f"widen names {doubled} more than once: a layer has one width slot; list it once")
        for name in self.deepen:
            if DEPTH_SLOT_SUFFIX in name:
                raise ValueError(
                    f"deepen names stacks, got the slot id {name!r}: write {name.replace(DEPTH_SLOT_SUFFIX, '')!r}"
                )
        doubled = sorted({n for n in self.deepen if self.deepen.count(n) > 1})
        if doubled:
            raise ValueError(f"deepen names {doubled} more than once: a stack has one depth slot; list it once")
        if self.batch_max < 2:
            raise ValueError(f"batch_max must be >= 2, got {self.batch_max}")
        if not isinstance(self.input_dtype, torch.dtype):
            raise ValueError(f"input_dtype must be a torch.dtype such as torch.long, got {self.input_dtype!r}")
        if self.build_scaled is not None and not callable(self.build_scaled):
            raise ValueError(
                "ModelSpec.build_scaled must be a function build_scaled(factor) returning an nn.Module, "
                f"got {type(self.build_scaled).__name__}"
            )

    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Ids of the seed slots: the module names themselves, then each widened layer's width slot,
        then each deepened stack's depth slot."""
        return (
            *self.slots,
            *(name + WIDTH_SLOT_SUFFIX for name in self.widen),
            *(name + DEPTH_SLOT_SUFFIX for name in self.deepen),
            *((STREAM_SLOT,) if self.widen_stream else ()),
        )

    def scaled(self, factor: float) -> ModelSpec:
        """This spec with every hidden width multiplied by ``factor`` (through ``build_scaled``).

        Raises:
            ValueError: If the spec has no ``build_scaled`` or ``factor`` is not positive.
        """
        if self.build_scaled is None:
            raise ValueError(
                "this ModelSpec cannot change width: give it build_scaled=lambda factor: MyNet(width=round(32 * factor))"
            )
        if factor <= 0:
            raise ValueError(f"a width factor must be > 0, got {factor}")
        return dataclasses.replace(self, build=functools.partial(self.build_scaled, factor))


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything one morphogenesis run needs."""

    recipe: str = "custom"
    """Name (or import path) of the recipe this configuration came from; set by the resolver."""
    epochs: int
    seed: int = 0
    """Seeds data order, initialisation and every RNG of the run."""
    data: DataConfig | DataSpec = field(default_factory=DataConfig)
    host: HostConfig | ModelSpec = field(default_factory=HostConfig)
    loss: LossFn = F.cross_entropy
    """Training and validation loss; accuracy is reported when targets are class indices."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    kasmina: KasminaConfig = field(default_factory=KasminaConfig)
    tamiyo: TamiyoConfig = field(default_factory=TamiyoConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    blueprints: tuple[str, ...] = ()
    """Blueprints compiled for this run's slots; Tamiyo chooses among them. Empty (the default):
    every approved blueprint (safe, or named in ``approved_blueprints``) whose shape profile fits
    a slot is a candidate for that slot (``esper recipes show`` lists them per slot)."""
    approved_blueprints: tuple[str, ...] = ()
    """Experimental-tier blueprints this run may germinate (Karn requires explicit approval)."""
    task: EpisodeTask | None = None
    """The varied task of a Simic training episode (``TaskVariation.draw``): its training subset
    and label noise are applied when the run loads its data, its width is already in ``host``
    (``episode_config`` scales it). None: the recipe's own task, untouched."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if isinstance(self.blueprints, str) or isinstance(self.approved_blueprints, str):
            raise ValueError("blueprints and approved_blueprints are tuples of ids: write ('residual_mlp',)")
        self.blueprints, self.approved_blueprints = tuple(self.blueprints), tuple(self.approved_blueprints)
        if not callable(self.loss):
            raise ValueError(f"loss must be a function loss(outputs, targets), got {type(self.loss).__name__}")
        if isinstance(self.host, HostConfig) and isinstance(self.data, DataSpec):
            raise ValueError(
                "a built-in host (HostConfig) is sized for a bundled data set; with your own data, "
                "give your own model as host=ModelSpec(build=..., slots=...)"
            )
        if self.trainer.val_batch_size > self.host.batch_max:
            raise ValueError(
                f"val_batch_size {self.trainer.val_batch_size} exceeds the slots' batch_max "
                f"{self.host.batch_max}: seeds are guarded for at most batch_max samples; lower it"
            )
        self._check_schedule()
        if self.data.batch_size > self.host.batch_max:
            raise ValueError(
                f"batch_size {self.data.batch_size} exceeds the slots' batch_max "
                f"{self.host.batch_max}; raise host.batch_max or lower the batch size"
            )

    def _check_schedule(self) -> None:
        """A fixed schedule (policy ``scheduled``) must name this run's slots and blueprints (with no
        blueprint list, planning checks that each scheduled blueprint fits its slot); so must the
        heuristic's preferred blueprints."""
        allowed = (*self.blueprints, *self.approved_blueprints, *WIDTH_MENU, *DEPTH_MENU, *STREAM_MENU)
        for g in self.tamiyo.schedule:
            if g.slot not in self.host.slot_ids:
                raise ValueError(
                    f"scheduled germination at epoch {g.epoch}: no slot {g.slot!r}; slots are {self.host.slot_ids}"
                )
            if self.blueprints and g.blueprint not in allowed:
                raise ValueError(
                    f"scheduled germination at epoch {g.epoch}: blueprint {g.blueprint!r} is not among the run's "
                    f"blueprints {allowed}; add it to RunConfig.blueprints"
                )
            if g.epoch >= self.epochs:
                raise ValueError(
                    f"scheduled germination at epoch {g.epoch} never happens: the run has epochs 0..{self.epochs - 1}"
                )
        # The heuristic's preferred blueprints, checked as the schedule's are.
        for blueprint in self.tamiyo.heuristic.prefer:
            if self.blueprints and blueprint not in allowed:
                raise ValueError(
                    f"tamiyo.heuristic.prefer names {blueprint!r}, which is not among the run's blueprints "
                    f"{allowed}; add it to RunConfig.blueprints or drop it from prefer"
                )
