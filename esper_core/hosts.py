"""Host networks with Kasmina seed slots.

A host is a plain ``nn.Module`` whose activations pass through ``SeedSlot``s at fixed places.
``layer_names`` / ``layer_widths`` describe it to Tamiyo; ``slots()`` hands the slots to Kasmina.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.slot import SeedSlot

HOST_KINDS = ("mlp", "cnn")


@dataclass(kw_only=True, slots=True)
class HostConfig:
    """Shape of the host network and where its seed slots sit."""

    kind: str = "mlp"
    """Host family (``mlp`` or ``cnn``); seeds must list it in their blueprint's ``host_kinds``."""
    hidden: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers (``mlp``) or channels of the 3x3 conv layers (``cnn``)."""
    slot_inputs: tuple[int, ...] = (1, 2)
    """Indices of the layers whose input passes through a seed slot (0 = the raw input)."""
    batch_max: int = 512
    """Largest batch a slot must accept; compiled seed kernels are built for it."""

    def __post_init__(self) -> None:
        if self.kind not in HOST_KINDS:
            raise ValueError(f"host kind must be one of {HOST_KINDS}, got {self.kind!r}")
        if any(w < 1 for w in self.hidden):
            raise ValueError(f"hidden widths must be positive, got {self.hidden}")
        n_layers = len(self.hidden) + 1
        bad = [i for i in self.slot_inputs if not 0 <= i < n_layers]
        if bad:
            raise ValueError(f"slot_inputs {bad} out of range: this host has layers 0..{n_layers - 1}")
        if len(set(self.slot_inputs)) != len(self.slot_inputs):
            raise ValueError(f"slot_inputs has duplicates: {self.slot_inputs}")

    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Ids of the host's seed slots (``slot<i>``: the slot on layer ``i``'s input)."""
        return tuple(f"slot{i}" for i in sorted(self.slot_inputs))

    def scaled(self, factor: float) -> HostConfig:
        """This host with every hidden width multiplied by ``factor`` (rounded, at least 1).

        Raises:
            ValueError: If ``factor`` is not positive.
        """
        if factor <= 0:
            raise ValueError(f"a width factor must be > 0, got {factor}")
        return dataclasses.replace(self, hidden=tuple(max(1, round(w * factor)) for w in self.hidden))


class MLPHost(nn.Module):
    """``Linear -> ReLU`` stack; layer ``i`` reads its input through slot ``slot{i}`` if any (not
    called while it is idle: ``SeedSlot.idle``)."""

    def __init__(self, config: HostConfig, *, feature_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(feature_shape) != 1:
            raise ValueError(
                f"an mlp host takes flat features, got shape {feature_shape}; load the data with image=False"
            )
        widths = (feature_shape[0], *config.hidden, num_classes)
        self.kind = config.kind
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in itertools.pairwise(widths))
        self.layer_names = tuple(f"fc{i}" for i in range(len(self.layers)))
        self.layer_widths = tuple(widths[1:])
        slots = {
            f"slot{i}": SeedSlot(
                slot_id=f"slot{i}",
                layer=self.layer_names[i],
                profile=ShapeProfile(feature_shape=(widths[i],), batch_max=config.batch_max),
            )
            for i in config.slot_inputs
        }
        self.seed_slots = nn.ModuleDict(slots)
        self._slot_at = {int(k[4:]): slot for k, slot in slots.items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            slot = self._slot_at.get(i)
            if slot is not None and not slot.idle:
                x = slot(x)
            x = layer(x)
            if i < last:
                x = torch.relu(x)
        return x

    def slots(self) -> dict[str, SeedSlot]:
        """The seed slots by id, in forward order."""
        return {slot.slot_id: slot for _, slot in sorted(self._slot_at.items())}

    def host_parameters(self) -> list[nn.Parameter]:
        """Parameters of the host itself, excluding any seed."""
        return list(self.layers.parameters())


_POOL = 2  # side of the pooled feature map the classifier reads


class CNNHost(nn.Module):
    """``Conv3x3 -> ReLU`` stack on (C, H, W) images, 2x2 average pooling, a linear classifier.

    Conv layer ``i`` (and the classifier, index ``len(hidden)``) reads its input through slot
    ``slot{i}`` if any: conv slots see (C, H, W) feature maps, the classifier slot the pooled
    (4C)-vector. Pooling to 2x2 rather than 1x1 keeps the coarse layout a digit needs.
    """

    def __init__(self, config: HostConfig, *, feature_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(feature_shape) != 3:
            raise ValueError(
                f"a cnn host takes (C, H, W) images, got shape {feature_shape}; load the data with image=True"
            )
        channels, height, width = feature_shape
        widths = (channels, *config.hidden)
        self.kind = config.kind
        convs: list[nn.Module] = [nn.Conv2d(i, o, 3, padding=1) for i, o in itertools.pairwise(widths)]
        self.layers = nn.ModuleList([*convs, nn.Linear(widths[-1] * _POOL * _POOL, num_classes)])
        self.layer_names = (*(f"conv{i}" for i in range(len(convs))), "fc")
        self.layer_widths = (*config.hidden, num_classes)
        # The activation entering layer i: the image for i = 0, conv maps after, a vector for fc.
        shapes = [(w, height, width) for w in widths[:-1]] + [(widths[-1] * _POOL * _POOL,)]
        slots = {
            f"slot{i}": SeedSlot(
                slot_id=f"slot{i}",
                layer=self.layer_names[i],
                profile=ShapeProfile(feature_shape=shapes[i], batch_max=config.batch_max),
            )
            for i in config.slot_inputs
        }
        self.seed_slots = nn.ModuleDict(slots)
        self._slot_at = {int(k[4:]): slot for k, slot in slots.items()}
        self._n_convs = len(convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i == self._n_convs:
                x = F.adaptive_avg_pool2d(x, _POOL).flatten(1)  # (B, C, H, W) -> (B, C * 4)
            slot = self._slot_at.get(i)
            if slot is not None and not slot.idle:
                x = slot(x)
            x = layer(x)
            if i < self._n_convs:
                x = torch.relu(x)
        return x

    def slots(self) -> dict[str, SeedSlot]:
        """The seed slots by id, in forward order."""
        return {slot.slot_id: slot for _, slot in sorted(self._slot_at.items())}

    def host_parameters(self) -> list[nn.Parameter]:
        """Parameters of the host itself, excluding any seed."""
        return list(self.layers.parameters())


Host = MLPHost | CNNHost | GrowableModel
"""Any host network: a built-in one (``build_host_from_config``) or a user's model with grafted slots."""


def build_host_from_config(
    config: HostConfig, *, feature_shape: tuple[int, ...], num_classes: int
) -> MLPHost | CNNHost:
    """Build the host network described by ``config`` for the data's shapes."""
    if config.kind == "cnn":
        return CNNHost(config, feature_shape=feature_shape, num_classes=num_classes)
    return MLPHost(config, feature_shape=feature_shape, num_classes=num_classes)
