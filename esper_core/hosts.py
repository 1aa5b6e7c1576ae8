"""Host networks with Kasmina seed slots.

A host is a plain ``nn.Module`` whose activations pass through ``SeedSlot``s at fixed places.
``layer_names`` / ``layer_widths`` describe it to Tamiyo; ``slots()`` hands the slots to Kasmina.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.slot import SeedSlot

HOST_KINDS = ("mlp",)


@dataclass(kw_only=True, slots=True)
class HostConfig:
    """Shape of the host network and where its seed slots sit."""

    kind: str = "mlp"
    """Host family; seeds must list it in their blueprint's ``host_kinds``."""
    hidden: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers."""
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


class MLPHost(nn.Module):
    """``Linear -> ReLU`` stack; layer ``i`` reads its input through slot ``slot{i}`` if any."""

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
        self.seed_slots = nn.ModuleDict(
            {
                f"slot{i}": SeedSlot(
                    slot_id=f"slot{i}",
                    layer=self.layer_names[i],
                    profile=ShapeProfile(feature_shape=(widths[i],), batch_max=config.batch_max),
                )
                for i in config.slot_inputs
            }
        )
        self._slot_at = {int(k[4:]): slot for k, slot in self.seed_slots.items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            slot = self._slot_at.get(i)
            if slot is not None:
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


def build_host(config: HostConfig, *, feature_shape: tuple[int, ...], num_classes: int) -> MLPHost:
    """Build the host network described by ``config`` for the data's shapes."""
    return MLPHost(config, feature_shape=feature_shape, num_classes=num_classes)
