"""Seed modules for MLP hosts.

Every seed maps ``x`` of shape (B, W) to a delta of the same shape that the host's slot adds
(``y = x + alpha * seed(x)``). Each module's last layer starts at zero, so a fresh seed's delta
is exactly zero and germinating it cannot perturb the host. None of them holds mode-dependent
layers (dropout, batch norm): Tezzeret exports them in eval mode and Kasmina trains the exported
graph, so train and eval must compute the same function. Every module is non-linear in ``x``: a
linear (or affine) delta would fold into the next linear layer and add no capacity.

Shape legend: B batch, W width (the slot's feature size), H hidden width, R rank, T tokens,
D token width (W = T * D), K key width.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.karn.profiles import ShapeProfile


def _zero_(layer: nn.Linear) -> nn.Linear:
    nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class ResidualMLP(nn.Module):
    """Two-layer MLP ``W -> expansion*W -> W`` with GELU."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(width, expansion * width)
        self.fc_out = _zero_(nn.Linear(expansion * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        return self.fc_out(F.gelu(self.fc_in(x)))


class LowRankAdapter(nn.Module):
    """Non-linear rank-R adapter ``up(GELU(down(x)))``, ``W -> R -> W``: the cheapest increment.

    A LoRA-style ``up(down(x))`` (version 1) is a rank-R linear map that folds into the next
    linear layer, so it adds no function the host could not represent; the GELU between the
    projections does. Its rank is absolute and ``down`` has no bias, as LoRA's; ``bottleneck_mlp``
    scales its hidden width with W and biases both projections.
    """

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(width, rank, bias=False)
        self.up = _zero_(nn.Linear(rank, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        return self.up(F.gelu(self.down(x)))  # (B, R) hidden


class NormGate(nn.Module):
    """LayerNorm, then a linear map scaled per feature by a sigmoid gate."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate = nn.Linear(width, width)
        self.value = _zero_(nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        h = self.norm(x)
        return torch.sigmoid(self.gate(h)) * self.value(h)


class GLUBlock(nn.Module):
    """Gated linear unit ``(xA) * sigmoid(xB)`` of hidden width ``expansion*W``, projected back."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        hidden = expansion * width
        self.proj_in = nn.Linear(width, 2 * hidden)
        self.proj_out = _zero_(nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        value, gate = self.proj_in(x).chunk(2, dim=-1)  # (B, H) each
        return self.proj_out(value * torch.sigmoid(gate))


class WideMLP(nn.Module):
    """Three-layer MLP ``W -> H -> H -> W`` with ``H = expansion*W`` (up to 8x): large and slow."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        hidden = expansion * width
        self.fc_in = nn.Linear(width, hidden)
        self.fc_mid = nn.Linear(hidden, hidden)
        self.fc_out = _zero_(nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        h = F.gelu(self.fc_in(x))
        return self.fc_out(F.gelu(self.fc_mid(h)))


class BottleneckMLP(nn.Module):
    """Non-linear bottleneck ``W -> W/reduction -> W`` with GELU (a low-rank adapter that can bend)."""

    def __init__(self, width: int, reduction: int) -> None:
        super().__init__()
        hidden = max(1, width // reduction)
        self.down = nn.Linear(width, hidden)
        self.up = _zero_(nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        return self.up(F.gelu(self.down(x)))


TOKEN_WIDTH = 4
"""Features per token of ``TokenAttention``: a W-vector is read as W / 4 tokens."""


class TokenAttention(nn.Module):
    """Single-head self-attention across the T = W / 4 tokens of a feature vector."""

    def __init__(self, width: int, key_dim: int) -> None:
        super().__init__()
        if width % TOKEN_WIDTH:
            raise ValueError(f"token_attention needs a width divisible by {TOKEN_WIDTH}, got {width}")
        self.tokens = width // TOKEN_WIDTH
        self.query = nn.Linear(TOKEN_WIDTH, key_dim)
        self.key = nn.Linear(TOKEN_WIDTH, key_dim)
        self.value = nn.Linear(TOKEN_WIDTH, TOKEN_WIDTH)
        self.out = _zero_(nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, W) activations to a (B, W) delta."""
        tokens = x.unflatten(1, (self.tokens, TOKEN_WIDTH))  # (B, T, D)
        attended = F.scaled_dot_product_attention(self.query(tokens), self.key(tokens), self.value(tokens))  # (B, T, D)
        return self.out(attended.flatten(1))


def mlp_width(profile: ShapeProfile, blueprint_id: str) -> int:
    """The width of a 1-D profile, or a ValueError for a profile an MLP seed cannot take.

    Args:
        profile: The slot's shape profile.
        blueprint_id: The blueprint being built (named in the error).

    Returns:
        ``profile.feature_shape[0]``.
    """
    if len(profile.feature_shape) != 1:
        raise ValueError(
            f"blueprint {blueprint_id!r} is for MLP hosts and needs a 1-D feature shape such as "
            f"(128,), got {profile.feature_shape} (profile {profile.name}): attach it to a linear "
            "layer's output or flatten the activation first"
        )
    return profile.feature_shape[0]
