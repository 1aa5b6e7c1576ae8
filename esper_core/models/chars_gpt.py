"""A small GPT for character-level language modelling, as a plain ``nn.Module``.

``CharGPT``: token and position embeddings, ``depth`` pre-norm causal transformer blocks
(``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``, as in nanoGPT), a final LayerNorm and a linear
head to next-character logits. No dropout: the runs are short and the comparison is paired.
Each block's output, ``blocks.<i>``, is an (L, D) token activation that a seed slot may take;
the model is causal, so a recipe declares it ``ModelSpec(causal=True)``.

Legend: B batch, L context (characters), D width, H heads, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention over (B, L, D)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (B, H, L, D/H) per projection.
        q, k, v = (t.view(b, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, L, D/H)
        return self.proj(y.transpose(1, 2).reshape(b, length, width))


class Block(nn.Module):
    """A pre-norm transformer block: attention then a 4x GELU MLP, each as a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))  # (B, L, D)


class CharGPT(nn.Module):
    """Next-character logits (B, L, V) from character ids (B, L).

    Args:
        vocab: V, the number of character ids.
        context: The longest sequence (position embeddings).
        width: D, the embedding width; a multiple of ``heads``.
        depth: Number of transformer blocks.
        heads: Attention heads per block.
    """

    def __init__(self, *, vocab: int = 128, context: int = 64, width: int = 64, depth: int = 3, heads: int = 4) -> None:
        super().__init__()
        if min(vocab, context, width, depth, heads) < 1 or width % heads:
            raise ValueError(
                f"CharGPT needs positive sizes and a width divisible by heads, got vocab {vocab}, "
                f"context {context}, width {width}, depth {depth}, heads {heads}"
            )
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.apply(_init)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.token(idx) + self.position(positions)  # (B, L, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, L, V)


def _init(module: nn.Module) -> None:
    # GPT-2's initialisation: N(0, 0.02) weights, zero biases.
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def next_char_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of (B, L, V) logits against (B, L) next characters."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
