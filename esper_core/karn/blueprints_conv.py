"""Seed modules for convolutional hosts.

Every seed maps a feature map ``x`` of shape (B, C, H, W) to a delta of the same shape that the
slot adds (``y = x + alpha * seed(x)``). As for the MLP seeds, each module's last layer starts at
zero so a fresh seed is exactly neutral, and none holds a train/eval-dependent layer (dropout,
batch norm): Kasmina trains the exported graph, which freezes one mode. Normalisation uses
``GroupNorm``, which computes the same function in both modes.

Shape legend: B batch, C channels, H height, W width, E expanded channels, K key width,
P = H * W positions.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.karn.profiles import ShapeProfile


def _zero_(layer: nn.Conv2d | nn.Linear) -> nn.Conv2d | nn.Linear:
    nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class ConvResidual(nn.Module):
    """``conv3x3 (C -> E) -> GELU -> conv3x3 (E -> C)``: a ResNet basic block's residual branch."""

    def __init__(self, channels: int, expansion: int) -> None:
        super().__init__()
        hidden = expansion * channels
        self.conv_in = nn.Conv2d(channels, hidden, 3, padding=1)
        self.conv_out = _zero_(nn.Conv2d(hidden, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
        return self.conv_out(F.gelu(self.conv_in(x)))


class DepthwiseSeparable(nn.Module):
    """Depthwise 3x3 (dilated) per channel, GELU, then a pointwise 1x1 channel mix."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        # padding = dilation keeps H and W for a 3x3 kernel at any dilation.
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=dilation, dilation=dilation, groups=channels)
        self.pointwise = _zero_(nn.Conv2d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
        return self.pointwise(F.gelu(self.depthwise(x)))


class PointwiseAdapter(nn.Module):
    """Low-rank 1x1 bottleneck ``C -> R -> C``: the cheapest channel-mixing increment."""

    def __init__(self, channels: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Conv2d(channels, rank, 1, bias=False)
        self.up = _zero_(nn.Conv2d(rank, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
        return self.up(self.down(x))


class SqueezeExcitation(nn.Module):
    """Channel re-weighting from global context: ``delta = x * tanh(fc2(relu(fc1(mean_hw(x)))))``.

    ``tanh`` of a zero-initialised ``fc2`` makes the fresh delta exactly zero while ``fc2`` still
    receives a gradient.
    """

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = _zero_(nn.Linear(hidden, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
        context = x.mean(dim=(2, 3))  # (B, C)
        scale = torch.tanh(self.fc2(F.relu(self.fc1(context))))  # (B, C)
        return x * scale[:, :, None, None]


class GroupNormGate(nn.Module):
    """GroupNorm over (C, H, W), then a 1x1 map scaled per channel and position by a sigmoid gate."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, channels)
        self.gate = nn.Conv2d(channels, channels, 1)
        self.value = _zero_(nn.Conv2d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
        h = self.norm(x)
        return torch.sigmoid(self.gate(h)) * self.value(h)


class SpatialAttention(nn.Module):
    """Single-head self-attention across the P = H*W positions of a feature map (1x1 projections)."""

    def __init__(self, channels: int, key_dim: int) -> None:
        super().__init__()
        self.query = nn.Conv2d(channels, key_dim, 1)
        self.key = nn.Conv2d(channels, key_dim, 1)
        self.value = nn.Conv2d(channels, channels, 1)
        self.out = _zero_(nn.Conv2d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
        q = self.query(x).flatten(2).transpose(1, 2)  # (B, P, K)
        k = self.key(x).flatten(2).transpose(1, 2)  # (B, P, K)
        v = self.value(x).flatten(2).transpose(1, 2)  # (B, P, C)
        attended = F.scaled_dot_product_attention(q, k, v)  # (B, P, C)
        return self.out(attended.transpose(1, 2).reshape(x.shape))


class WideConv(nn.Module):
    """Two 3x3 convolutions through ``expansion*C`` channels (up to 8x): large and slow."""

    def __init__(self, channels: int, expansion: int) -> None:
        super().__init__()
        hidden = expansion * channels
        self.conv_in = nn.Conv2d(channels, hidden, 3, padding=1)
        self.conv_mid = nn.Conv2d(hidden, hidden, 3, padding=1)
        self.conv_out = _zero_(nn.Conv2d(hidden, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, H, W) maps to a (B, C, H, W) delta."""
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
