"""GradMax-style initialisation of a seed at germination: function-preserving and data-aware.

The idea (Evci et al., 2022, "GradMax: Growing Neural Networks using Gradient Information"): grow
so that the network's function is unchanged and the new weights' gradient is as large as
possible. For a seed ``delta = U act(D x)`` at a slot (``act(0) = 0``), ``U = 0`` keeps the host's
function for any ``D``, at any alpha, and the loss gradient for ``U`` is ``E[g act(D x)^T]`` with
``g = dL/dy`` the gradient at the slot's output. Linearising ``act`` around 0 (GELU: slope 1/2)
makes it proportional to ``M D^T`` with ``M = E[g x^T]``; among rows of ``D`` of a given norm, the
top right singular vectors of ``M`` maximise its norm. So: zero ``U`` (and its bias), and set the
first rows of ``D`` to those singular vectors, each at the mean row norm ``D`` had (the default
init's scale); rows beyond ``M``'s rank keep their default values. A singular vector's sign is
arbitrary, and beyond the linearisation it matters (GELU is not odd): each row takes the sign
whose hidden unit gets the larger exact gradient ``E[g act(D x)]``, measured through the module.

Shapes: a vector slot gives ``x`` and ``g`` of (B, W), one sample per row. A channels-first slot
(B, C, *S) treats every position as a sample: ``g`` rows are (B*P, C) and ``x`` rows are (B*P, C)
for a pointwise input projection, or the (B*P, C*k) patches a size-k "same" convolution reads
(then ``M`` is exact for the output convolution's centre tap). One pass over the batches given,
nothing per training step (the sign choice runs the seed twice more on the same batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.karn.catalog import GradMaxLayers

SEED_INITS = ("default", "gradmax")
"""``KasminaConfig.seed_init`` choices: the kernel's own weights, or ``gradmax_init_``."""

# Singular values below this fraction of the largest are noise, not directions to grow along.
_RANK_TOLERANCE = 1e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class GradMaxResult:
    """What ``gradmax_init_`` did.

    Attributes:
        rows: Rows of the input projection set to singular directions.
        hidden: Rows (hidden units) of the input projection.
        energy: Fraction of ``M``'s squared singular values those directions capture.
        samples: Rows of ``x`` (samples, or sample positions) the statistic averaged.
    """

    rows: int
    hidden: int
    energy: float
    samples: int

    def metrics(self) -> dict[str, float]:
        """Seed metrics for ``SeedState.metrics``."""
        return {
            "init_gradmax_rows": float(self.rows),
            "init_gradmax_energy": self.energy,
            "init_gradmax_samples": float(self.samples),
        }


def gradmax_init_(
    module: nn.Module, layers: GradMaxLayers, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> GradMaxResult:
    """Zero the seed's output projection and point its input rows at the slot's gradient statistic.

    Args:
        module: The seed module (eager or exported), changed in place.
        layers: Its input and output projections (``Blueprint.gradmax``).
        batches: ``(x, g)`` pairs: the activation entering the slot and the loss gradient at the
            slot's output, both (B, *feature_shape).

    Returns:
        How many rows were set and how much of the statistic they capture.

    Raises:
        ValueError: ``batches`` is empty, a named layer is missing, or the input projection does
            not read the slot's features.
    """
    params = dict(module.named_parameters())
    w_in = _weight(params, layers.input)
    w_out = _weight(params, layers.output)
    kernel = tuple(w_in.shape[2:])
    stat: torch.Tensor | None = None  # M: (C, C * prod(kernel))
    samples = 0
    for x, g in batches:
        xs = _rows(x.detach(), kernel).double()
        gs = _rows(g.detach(), ()).double()
        m = gs.T @ xs
        stat = m if stat is None else stat + m
        samples += xs.shape[0]
    if stat is None:
        raise ValueError(
            "gradmax_init_ got no batches: pass at least one (x, g) pair (KasminaConfig.seed_init_batches)"
        )
    if stat.shape[1] != w_in[0].numel():
        raise ValueError(
            f"{layers.input}.weight {tuple(w_in.shape)} does not read the slot's {stat.shape[1]} features per "
            "sample: the blueprint's GradMaxLayers must name the projection applied to the slot's input"
        )
    _, s, vh = torch.linalg.svd(stat / samples, full_matrices=False)  # vh: (min(C, C*k), C*k)
    usable = int((s > s[0] * _RANK_TOLERANCE).sum()) if s[0] > 0 else 0
    rows = min(w_in.shape[0], usable)
    with torch.no_grad():
        w_out.zero_()
        bias = params.get(f"{layers.output}.bias")
        if bias is not None:
            bias.zero_()
        if rows:
            scale = w_in.detach().flatten(1).double().norm(dim=1).mean()
            directions = (vh[:rows] * (scale if scale > 0 else 1.0)).reshape(rows, *w_in.shape[1:]).to(w_in.dtype)
            w_in[:rows].copy_(directions)
            plus = _hidden_gradients(module, w_out, batches)[:rows]
            w_in[:rows].copy_(-directions)
            minus = _hidden_gradients(module, w_out, batches)[:rows]
            sign = torch.where(plus >= minus, 1.0, -1.0).to(w_in.dtype)
            w_in[:rows].copy_(directions * sign.reshape(rows, *(1,) * (w_in.dim() - 1)))
    total = float((s**2).sum())
    energy = float((s[:rows] ** 2).sum()) / total if total > 0 else 0.0
    return GradMaxResult(rows=rows, hidden=w_in.shape[0], energy=energy, samples=samples)


def _hidden_gradients(
    module: nn.Module, w_out: nn.Parameter, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """Per hidden unit, the norm of the loss gradient for its output weights (``w_out[:, j]``).

    With ``w_out`` zero the seed's output is linear in it, so ``sum(g * module(x))`` has exactly
    the loss's first-order gradient ``E[g act(D x)^T]`` for it.
    """
    total = torch.zeros_like(w_out)
    with torch.enable_grad():
        for x, g in batches:
            (grad,) = torch.autograd.grad((module(x) * g).sum(), w_out)
            total += grad
    return total.transpose(0, 1).flatten(1).norm(dim=1)


def _weight(params: dict[str, nn.Parameter], layer: str) -> nn.Parameter:
    weight = params.get(f"{layer}.weight")
    if weight is None:
        raise ValueError(
            f"the seed module has no parameter {layer}.weight (it has {sorted(params)}): fix the blueprint's "
            "GradMaxLayers in the Karn catalogue"
        )
    return weight


def _rows(t: torch.Tensor, kernel: tuple[int, ...]) -> torch.Tensor:
    """(B, W) as is; (B, C, *S) as one row per position: (B*P, C), or (B*P, C*k) patches."""
    if t.dim() == 2:
        return t
    channels, dims = t.shape[1], t.dim() - 2
    if all(k == 1 for k in kernel):
        return t.movedim(1, -1).reshape(-1, channels)
    if len(kernel) != dims or any(k % 2 == 0 for k in kernel):
        raise ValueError(f"gradmax needs an odd-sized 'same' convolution over {dims} dims, got kernel {kernel}")
    if dims == 1:
        pad = kernel[0] // 2
        patches = F.pad(t, (pad, pad)).unfold(2, kernel[0], 1)  # (B, C, L, k)
        return patches.permute(0, 2, 1, 3).reshape(-1, channels * kernel[0])
    if dims == 2:
        patches = F.unfold(t, kernel, padding=tuple(k // 2 for k in kernel))  # (B, C*kh*kw, P)
        return patches.transpose(1, 2).reshape(-1, patches.shape[1])
    raise ValueError(f"gradmax supports vector, (C, L) and (C, H, W) slots, got {dims} spatial dims")
