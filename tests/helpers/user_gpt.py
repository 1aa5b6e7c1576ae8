"""A nanoGPT-style language model written outside esper_core, as a new user would bring it.

``GPT`` spells its layers as nanoGPT does (``transformer.h.<i>.attn.c_attn`` fuses the q/k/v
projections, ``c_proj`` reads the heads back, ``mlp.c_fc`` / ``mlp.c_proj``), returns (B, T, V)
logits and has no loss of its own. The recipes are found by import path
(``tests.helpers.user_gpt:recipe``).

Legend: B batch, T sequence length, C width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from esper_core.run import (
    DataSpec,
    DataSplits,
    HeuristicConfig,
    ModelSpec,
    RunConfig,
    StepEngineConfig,
    TamiyoConfig,
    TrainerConfig,
)
from esper_core.tamiyo.config import ScheduledGermination

VOCAB, CONTEXT = 16, 12


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, a final LayerNorm and an untied head."""

    def __init__(self, n_embd: int = 16, n_layer: int = 2, n_head: int = 2) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(VOCAB, n_embd),
                "wpe": nn.Embedding(CONTEXT, n_embd),
                "h": nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, V)


def counting(n: int, seed: int) -> TensorDataset:
    """Windows of a sequence that counts up modulo VOCAB from a random start; targets are inputs shifted by one."""
    start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
    tokens = (start + torch.arange(CONTEXT + 1)) % VOCAB  # (n, T + 1)
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def data() -> DataSplits:
    return DataSplits(train=counting(256, seed=1), val=counting(64, seed=2), test=counting(64, seed=3))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """nanoGPT's loss: cross-entropy over the flattened (B * T, V) logits."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def recipe() -> RunConfig:
    """Seeds on both blocks' (T, C) outputs; the loss flattens the sequence as nanoGPT's does."""
    return RunConfig(
        epochs=2,
        host=ModelSpec(
            build=GPT, slots=("transformer.h.0", "transformer.h.1"), input_dtype=torch.long, causal=True, batch_max=64
        ),
        data=DataSpec(load=data, batch_size=32, name="counting"),
        trainer=TrainerConfig(optimizer="adam", lr=3e-3, val_batch_size=64, step=StepEngineConfig(compile="off")),
        loss=next_token_loss,
    )


def default_loss() -> RunConfig:
    """The same recipe as a new user first writes it: no loss named, so ``F.cross_entropy`` meets (B, T, V) logits."""
    config = recipe()
    config.loss = F.cross_entropy
    return config


def grown() -> RunConfig:
    """``recipe`` with a per-token MLP seed germinated on the first block after epoch 0 (policy
    ``scheduled``), kept within the run: a branch seed fossilised in its slot."""
    config = recipe()
    config.epochs = 6
    config.blueprints = ("tok_mlp",)
    config.tamiyo = TamiyoConfig(
        policy="scheduled",
        heuristic=HeuristicConfig(blend_epochs=1),
        schedule=(ScheduledGermination(epoch=0, slot="transformer.h.0", blueprint="tok_mlp"),),
    )
    return config
