"""Seed modules for convolutional hosts: 2-D feature maps and 1-D sequences.

Every seed maps a channels-first activation ``x`` of shape (B, C, *S) to a delta of the same
shape that the slot adds (``y = x + alpha * seed(x)``): S is (H, W) for a ``cnn`` slot (after an
``nn.Conv2d``) and (L,) for a ``seq`` slot (after an ``nn.Conv1d``). Each module takes ``dims``
(2 or 1) and uses the matching convolution, so the 2-D and the 1-D blueprints are the same code.

As for the MLP seeds, each module's last layer starts at zero so a fresh seed is exactly neutral,
and none holds a train/eval-dependent layer (dropout, batch norm): Kasmina trains the exported
graph, which freezes one mode. Normalisation uses ``GroupNorm``, which computes the same function
in both modes. Every module is non-linear in ``x``: a linear (or affine) delta would fold into
the neighbouring convolution and add nothing the host could not already represent.

Shape legend: B batch, C channels, S spatial dims ((H, W) or (L,)), E expanded channels,
R rank, K key width, P positions (H * W or L).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.karn.profiles import ShapeProfile

_CONV: dict[int, type[nn.Conv1d] | type[nn.Conv2d]] = {1: nn.Conv1d, 2: nn.Conv2d}


def _conv(dims: int) -> type[nn.Conv1d] | type[nn.Conv2d]:
    if dims not in _CONV:
        raise ValueError(f"convolutional seeds take dims 1 (sequences) or 2 (feature maps), got {dims}")
    return _CONV[dims]


_Layer = TypeVar("_Layer", bound=nn.Conv1d | nn.Conv2d | nn.Linear)


def _zero_(layer: _Layer) -> _Layer:
    nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class ConvResidual(nn.Module):
    """``conv3 (C -> E) -> GELU -> conv3 (E -> C)``: a ResNet basic block's residual branch."""

    def __init__(self, channels: int, expansion: int, *, dims: int = 2) -> None:
        super().__init__()
        conv, hidden = _conv(dims), expansion * channels
        self.conv_in = conv(channels, hidden, 3, padding=1)
        self.conv_out = _zero_(conv(hidden, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        return self.conv_out(F.gelu(self.conv_in(x)))


class DepthwiseSeparable(nn.Module):
    """Depthwise size-3 (dilated) convolution per channel, GELU, then a pointwise channel mix."""

    def __init__(self, channels: int, dilation: int, *, dims: int = 2) -> None:
        super().__init__()
        conv = _conv(dims)
        # padding = dilation keeps every spatial size for a size-3 kernel at any dilation.
        self.depthwise = conv(channels, channels, 3, padding=dilation, dilation=dilation, groups=channels)
        self.pointwise = _zero_(conv(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        return self.pointwise(F.gelu(self.depthwise(x)))


class PointwiseAdapter(nn.Module):
    """Non-linear low-rank pointwise bottleneck ``C -> R -> GELU -> C``: the cheapest channel mix.

    The GELU between the two 1x1 projections is what makes it capacity: without it (version 1)
    the two projections multiply into one rank-R linear map that the next convolution absorbs.
    """

    def __init__(self, channels: int, rank: int, *, dims: int = 2) -> None:
        super().__init__()
        conv = _conv(dims)
        self.down = conv(channels, rank, 1, bias=False)
        self.up = _zero_(conv(rank, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        return self.up(F.gelu(self.down(x)))


class SqueezeExcitation(nn.Module):
    """Channel re-weighting from global context: ``delta = x * tanh(fc2(relu(fc1(mean_S(x)))))``.

    ``tanh`` of a zero-initialised ``fc2`` makes the fresh delta exactly zero while ``fc2`` still
    receives a gradient.
    """

    def __init__(self, channels: int, reduction: int, *, dims: int = 2) -> None:
        super().__init__()
        _conv(dims)  # validates dims
        hidden = max(1, channels // reduction)
        self.spatial = tuple(range(2, 2 + dims))
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = _zero_(nn.Linear(hidden, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        context = x.mean(dim=self.spatial)  # (B, C)
        scale = torch.tanh(self.fc2(F.relu(self.fc1(context))))  # (B, C)
        return x * scale.reshape(*scale.shape, *(1 for _ in self.spatial))  # (B, C, 1, ...) broadcast


class GroupNormGate(nn.Module):
    """GroupNorm over (C, *S), then a 1x1 map scaled per channel and position by a sigmoid gate."""

    def __init__(self, channels: int, *, dims: int = 2) -> None:
        super().__init__()
        conv = _conv(dims)
        self.norm = nn.GroupNorm(1, channels)
        self.gate = conv(channels, channels, 1)
        self.value = _zero_(conv(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        h = self.norm(x)
        return torch.sigmoid(self.gate(h)) * self.value(h)


class SpatialAttention(nn.Module):
    """Single-head self-attention across the P positions of a map or sequence (1x1 projections)."""

    def __init__(self, channels: int, key_dim: int, *, dims: int = 2) -> None:
        super().__init__()
        conv = _conv(dims)
        self.query = conv(channels, key_dim, 1)
        self.key = conv(channels, key_dim, 1)
        self.value = conv(channels, channels, 1)
        self.out = _zero_(conv(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        q = self.query(x).flatten(2).transpose(1, 2)  # (B, P, K)
        k = self.key(x).flatten(2).transpose(1, 2)  # (B, P, K)
        v = self.value(x).flatten(2).transpose(1, 2)  # (B, P, C)
        attended = F.scaled_dot_product_attention(q, k, v)  # (B, P, C)
        return self.out(attended.transpose(1, 2).reshape(x.shape))


class WideConv(nn.Module):
    """Two size-3 convolutions through ``expansion*C`` channels (up to 8x): large and slow."""

    def __init__(self, channels: int, expansion: int, *, dims: int = 2) -> None:
        super().__init__()
        conv, hidden = _conv(dims), expansion * channels
        self.conv_in = conv(channels, hidden, 3, padding=1)
        self.conv_mid = conv(hidden, hidden, 3, padding=1)
        self.conv_out = _zero_(conv(hidden, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, *S) activations to a (B, C, *S) delta."""
        h = F.gelu(self.conv_in(x))
        return self.conv_out(F.gelu(self.conv_mid(h)))


def conv_channels(profile: ShapeProfile, blueprint_id: str) -> int:
    """The channel count of a (C, H, W) profile, or a ValueError for any other profile.

    Args:
        profile: The slot's shape profile.
        blueprint_id: The blueprint being built (named in the error).

    Returns:
        ``profile.feature_shape[0]``.
    """
    if len(profile.feature_shape) != 3:
        raise ValueError(
            f"blueprint {blueprint_id!r} is for convolutional hosts and needs a (C, H, W) feature "
            f"shape such as (16, 8, 8), got {profile.feature_shape} (profile {profile.name}): attach "
            "it to a slot on a convolution's input"
        )
    return profile.feature_shape[0]


def seq_channels(profile: ShapeProfile, blueprint_id: str) -> int:
    """The channel count of a (C, L) profile, or a ValueError for any other profile.

    Args:
        profile: The slot's shape profile.
        blueprint_id: The blueprint being built (named in the error).

    Returns:
        ``profile.feature_shape[0]``.
    """
    if len(profile.feature_shape) != 2:
        raise ValueError(
            f"blueprint {blueprint_id!r} is for 1-D convolutional hosts and needs a (C, L) feature "
            f"shape such as (8, 40), got {profile.feature_shape} (profile {profile.name}): attach it "
            "to a slot on an nn.Conv1d's output (channels first)"
        )
    return profile.feature_shape[0]
