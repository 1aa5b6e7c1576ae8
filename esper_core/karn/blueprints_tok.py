"""Seed modules for token features: channels-last (B, L, D) activations.

A ``tok`` slot sits on the output of a transformer block, an embedding, a batch-first LSTM or any
layer that works on the last axis: each of L positions carries a D-vector. The ``seq_*`` seeds
convolve over (C, L), the wrong axis for these; the seeds here mix features per token with
``nn.Linear`` (which acts on the last axis) and positions only through attention.

As for every seed, the last layer starts at zero so a fresh seed is exactly neutral, no module
holds a train/eval-dependent layer (Kasmina trains the exported graph, which freezes one mode),
and every module is non-linear in ``x`` (an affine delta would fold into the next layer).
Sequence length is not fixed: a kernel compiled for L accepts any length from 1 to L (the
profile's L is the longest), so nothing here depends on L. A causal profile (a language model's)
builds the attention with a causal mask, so the seed's output at position t never reads a later
position; the per-token seeds are causal by construction.

Shape legend: B batch, L tokens, D features, E expanded features, R rank, K key width.
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


class TokenFFN(nn.Module):
    """A transformer's FFN branch per token: ``LayerNorm -> D -> E -> GELU -> D`` (pre-norm)."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc_in = nn.Linear(width, expansion * width)
        self.fc_out = _zero_(nn.Linear(expansion * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, L, D) activations to a (B, L, D) delta."""
        return self.fc_out(F.gelu(self.fc_in(self.norm(x))))


class TokenAdapter(nn.Module):
    """Non-linear low-rank adapter per token, ``D -> R -> GELU -> D``: the cheapest token seed.

    The GELU is what makes it capacity: ``up(down(x))`` alone is one rank-R linear map that the
    next layer absorbs.
    """

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(width, rank, bias=False)
        self.up = _zero_(nn.Linear(rank, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, L, D) activations to a (B, L, D) delta."""
        return self.up(F.gelu(self.down(x)))


class TokenGLU(nn.Module):
    """A gated FFN per token (SwiGLU): ``LayerNorm -> (silu(gate) * value) of width E -> D``."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate = nn.Linear(width, expansion * width)
        self.value = nn.Linear(width, expansion * width)
        self.fc_out = _zero_(nn.Linear(expansion * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, L, D) activations to a (B, L, D) delta."""
        h = self.norm(x)
        return self.fc_out(F.silu(self.gate(h)) * self.value(h))


class TokenWideMLP(nn.Module):
    """Three per-token layers through up to 8*D features: a large jump in capacity and cost."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        hidden = expansion * width
        self.norm = nn.LayerNorm(width)
        self.fc_in = nn.Linear(width, hidden)
        self.fc_mid = nn.Linear(hidden, hidden)
        self.fc_out = _zero_(nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, L, D) activations to a (B, L, D) delta."""
        return self.fc_out(F.gelu(self.fc_mid(F.gelu(self.fc_in(self.norm(x))))))


class TokenSelfAttention(nn.Module):
    """One self-attention head across the L tokens (pre-norm), causal when the profile is.

    Args:
        width: D, the features per token.
        key_dim: K, the query and key width.
        causal: Mask every later position: the output at t depends only on tokens 0..t.
    """

    def __init__(self, width: int, key_dim: int, *, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.norm = nn.LayerNorm(width)
        self.query = nn.Linear(width, key_dim)
        self.key = nn.Linear(width, key_dim)
        self.value = nn.Linear(width, width)
        self.out = _zero_(nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, L, D) activations to a (B, L, D) delta."""
        h = self.norm(x)
        attended = F.scaled_dot_product_attention(
            self.query(h), self.key(h), self.value(h), is_causal=self.causal
        )  # (B, L, D)
        return self.out(attended)

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


def tok_width(profile: ShapeProfile, blueprint_id: str) -> int:
    """D of an (L, D) token profile, or a ValueError for any other profile.

    Args:
        profile: The slot's shape profile.
        blueprint_id: The blueprint being built (named in the error).

    Returns:
        ``profile.feature_shape[1]``.
    """
    if profile.kind != "tok":
        raise ValueError(
            f"blueprint {blueprint_id!r} is for token features and needs an (L, D) token profile "
            f"such as f64x32-b512-tok, got {profile.name}: attach it to a slot on a transformer "
            "block's, an embedding's or a batch-first LSTM's output"
        )
    return profile.feature_shape[1]
