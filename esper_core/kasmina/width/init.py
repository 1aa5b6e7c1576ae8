"""Initialisations of a width seed's new units, from a few batches of the host's own signals.

Every method keeps the host's function at germination by a zero factor on the new units' path:
``random`` zeroes the fan-out, ``gradmax`` the fan-in, and ``tiny``, whose fan-in and fan-out both
start at the host's own per-unit scale, zeroes the scale and shift (weight and bias) of the new
channels in the last normalisation before the consumer; with no normalisation in between, ``tiny``
keeps the function through the lifecycle instead (an isolated seed contributes nothing until its
blend's alpha ramps up from 0). A normalisation rescales each new channel to unit variance
whatever its fan-in, so behind one neither a small fan-in nor the alpha ramp's first step keeps
the new channels small: measured on the zoo's 2-D CNN (digits, BatchNorm2d after the widened
conv), a TINY seed with the norm's default scale 1 moved the logits by 9.2 (their largest is 4.8)
in training mode at alpha 1, and after one isolated epoch the with-seed validation loss was 0.70
against the host's 0.32 (G2 culls above 2x); with scale 0 the logits did not move and the loss was
0.32. The zero scale also gives TINY its line search: the scale's gradient is the first-order loss
change along TINY's direction, so gradient descent grows it from 0 as far as the loss wants.
``check_width_init`` refuses, before a run starts, a method whose zero factor cannot sit there
(a LayerNorm or a norm without a per-channel weight, an activation not 0 at 0 after the zero).

The three share one object, the first-order loss change of adding one unit with fan-in ``u`` and
fan-out ``v``, which is bilinear: ``dL ~ u^T A v`` with ``A = sum over samples and positions of
P(x) ... g`` (``x`` the widened layer's input, ``g`` the loss gradient at the consumer's output,
the ops in between linearised at 0). ``A`` is built by autograd through the seed's own forward, so
a ``Linear``, a ``Conv`` and a flatten into a ``Linear`` need no case of their own.

- ``random``: the host layer's default fan-in init, zero fan-out (the plain baseline).
- ``gradmax`` (Evci et al., 2022, "GradMax: Growing Neural Networks using Gradient Information"):
  zero fan-in, fan-out along the top right singular vectors of ``A``, which maximise the norm of
  the gradient the zero fan-in receives. ReLU is replayed with gradient 1 at 0 (``seed.py``), or
  these units would never move.
- ``tiny`` (Verbockhaven et al., 2024, "Growing Tiny Networks: Spotting Expressivity Bottlenecks
  and Fixing Them Optimally", the method behind GroMo): remove from ``g`` what the consumer's
  existing weights could already fit (least squares on its current inputs), then take the top
  singular pairs of ``S^-1/2 A`` with ``S`` the covariance of the fan-in's inputs: the new units
  that best reduce the remaining first-order loss. TINY picks the scale by a line search; here the
  units start at the host's own per-unit norms and the blend's alpha ramp plays that part, or,
  behind a normalisation, the norm's new weight, learned from 0.

GroMo (on the registry) implements TINY for ``Linear`` and ``Conv2d`` growing modules that replace
the user's layers; Esper grows the user's own modules in place and needs ``Conv1d``, so the maths
is implemented here from the paper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.func import grad, jacfwd, jacrev
from torch.nn import functional as F

from esper_core._capabilities import one_thread
from esper_core.kasmina.signals import SiteSignals, site_signals
from esper_core.kasmina.width.seed import _RELUS, WidthSeed, _apply
from esper_core.kasmina.width.trace import WidthSite

WIDTH_INITS = ("random", "gradmax", "tiny")
"""How a width seed's new units start (``init_width_seed_``)."""

# Singular values below this fraction of the largest are noise, not directions to grow along.
_RANK_TOLERANCE = 1e-6
# Added to S's diagonal (times its mean eigenvalue) so S^-1/2 exists for rank-deficient inputs.
_RIDGE = 1e-4


def width_batches(
    model: nn.Module,
    site: WidthSite,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> list[SiteSignals]:
    """The host's signals at a width site (``signals.site_signals`` with the widened layer as the
    reader and its consumer as the joiner), for initialising a seed outside a run."""
    return site_signals(model, model.get_submodule(site.layer), model.get_submodule(site.consumer), batches, loss_fn)


@torch.no_grad()
def init_width_seed_(seed: WidthSeed, method: str, batches: Sequence[SiteSignals]) -> dict[str, float]:
    """Set ``seed``'s fan-in and fan-out by ``method``; the host is not touched.

    Args:
        seed: A freshly built width seed.
        method: One of ``WIDTH_INITS``.
        batches: The host's signals at the seed's site (``width_batches``); unused by ``random``.

    Returns:
        Metrics for the seed's state (``init_energy``: the share of ``A``'s squared singular
        values the chosen directions capture).

    Raises:
        ValueError: an unknown method, no batches for a data-aware one, or a site where the
            method's zero factor would not keep the function (``check_width_init``).
    """
    check_width_init(seed, method)
    seed.fan_out.zero_()
    seed.reset_fan_in()
    for norm in seed.norms.values():
        norm.reset_parameters()
    if method == "random":
        return {"init_energy": 0.0}
    if not batches:
        raise ValueError(f"width init {method!r} reads the host's gradients: give it at least one batch")
    # One thread: the data-aware inits are many small kernels whose fork-join costs more than it buys
    # (on a busy 2-core machine a TINY init took 0.8 s on one thread, 12 s on two, past Kasmina's
    # 10 s command deadline).
    with one_thread():
        metrics = _data_aware(seed, method, batches)
    last = _last_norm(seed)
    if method == "tiny" and last is not None:
        norm = seed.norms[str(last)]
        nn.init.zeros_(norm.weight)
        nn.init.zeros_(norm.bias)
    return metrics


def check_width_init(seed: WidthSeed, method: str) -> None:
    """Refuse ``method`` where its zero factor could not keep the network's function (the
    module's docstring says where each method puts it).

    Reads only the seed's structure, so a seed built on the meta device can be checked when a
    run is planned.

    Raises:
        ValueError: an unknown method; ``gradmax`` with an activation that is not 0 at 0 or a
            LayerNorm bias between the layers; ``tiny`` whose last normalisation is a LayerNorm
            (its weights are shared by every unit) or has no weight, or is followed by an
            activation that is not 0 at 0. The message names the layer and what to change.
    """
    if method not in WIDTH_INITS:
        raise ValueError(f"width init must be one of {WIDTH_INITS}, got {method!r}")
    if method == "random":
        return  # a zero fan-out keeps the function whatever lies in between
    site = seed.site
    layer = site.layer
    instead = "set KasminaConfig.width_init to 'random' (zero fan-out), or widen another layer"
    first = 0
    if method == "tiny":
        last = _last_norm(seed)
        if last is None:
            return  # kept through the lifecycle: alpha ramps up from 0
        step = site.steps[last]
        if step.kind == "layer_norm":
            raise ValueError(
                f"width init 'tiny' cannot start new units of {layer!r} at zero: {step.module!r} (a LayerNorm) "
                "rescales each new unit to unit variance with a weight shared by every unit, so nothing of theirs "
                f"alone can start at 0; {instead}"
            )
        if not seed.norms[str(last)].affine:
            raise ValueError(
                f"width init 'tiny' cannot start new units of {layer!r} at zero: {step.module!r} rescales each new "
                "channel to unit variance and has no per-channel weight to start at 0 (affine=False); make it "
                f"affine, or {instead}"
            )
        first = last + 1
    for i in range(first, len(site.steps)):
        step = site.steps[i]
        if step.kind == "elementwise" and float(seed._replay(i, step, torch.zeros(()))) != 0.0:
            name = getattr(step.func, "__name__", step.func)
            zero = "fan-in" if method == "gradmax" else f"channels' scale in {site.steps[first - 1].module!r}"
            raise ValueError(
                f"width init {method!r} zeroes the new units' {zero}, but {name} after it is not 0 at 0, so new "
                f"units of {layer!r} would change the network; {instead}"
            )
        if step.kind == "layer_norm" and seed._shared[str(i)].bias is not None:
            raise ValueError(
                f"width init 'gradmax' zeroes the new units' fan-in, but {step.module!r} (a LayerNorm) adds its bias "
                f"to them, so new units of {layer!r} would change the network; {instead}"
            )


def _last_norm(seed: WidthSeed) -> int | None:
    """Index of the last normalisation step between the layer and its consumer, if any."""
    norms = [i for i, s in enumerate(seed.site.steps) if s.kind in ("batch_norm", "group_norm", "layer_norm")]
    return norms[-1] if norms else None


def _data_aware(seed: WidthSeed, method: str, batches: Sequence[SiteSignals]) -> dict[str, float]:
    """GradMax or TINY (``init_width_seed_``'s data-aware half)."""
    with torch.enable_grad():
        a = _bilinear(seed, batches, project=method == "tiny")  # (d_in, d_out)
    k = seed.units
    in_norm = seed.fan_in.flatten(1).norm(dim=1).mean()
    out_norm = _host_fan_out_norm(seed)
    if method == "gradmax":
        _, s, vh = torch.linalg.svd(a, full_matrices=False)
        rank = int((s > s[0] * _RANK_TOLERANCE).sum()) if s.numel() and s[0] > 0 else 0
        cols = vh[: min(k, rank)]  # (r, d_out)
        # Units beyond A's rank keep a random fan-in (and zero fan-out): two zero factors never move.
        seed.fan_in[: cols.shape[0]] = 0
        if seed.fan_in_bias is not None:
            seed.fan_in_bias[: cols.shape[0]] = 0
        _set_out_rows(seed, cols * out_norm)
        return {"init_energy": float((s[: cols.shape[0]] ** 2).sum() / (s**2).sum().clamp_min(1e-30))}
    s_cov = _input_covariance(seed, batches)  # (d_in, d_in)
    ridge = _RIDGE * s_cov.diagonal().mean().clamp_min(1e-12)
    evals, evecs = torch.linalg.eigh(s_cov + ridge * torch.eye(s_cov.shape[0], dtype=s_cov.dtype, device=s_cov.device))
    inv_sqrt = evecs @ torch.diag(evals.rsqrt()) @ evecs.T
    p, s, qh = torch.linalg.svd(inv_sqrt @ a, full_matrices=False)
    r = min(k, int((s > s[0] * _RANK_TOLERANCE).sum()) if s.numel() and s[0] > 0 else 0)
    u = (inv_sqrt @ p[:, :r]).T  # (r, d_in): the optimal fan-in directions
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-30) * in_norm
    # A negative first-order loss change: fan-out against A's right vectors, larger for larger sigma.
    v = -qh[:r] * (s[:r] / s[0]).unsqueeze(1) * out_norm
    seed.fan_in[:r] = u.view(r, *seed.fan_in.shape[1:])
    if seed.fan_in_bias is not None:
        seed.fan_in_bias[:r] = 0
    _set_out_rows(seed, v)
    return {"init_energy": float((s[:r] ** 2).sum() / (s**2).sum().clamp_min(1e-30))}


def _is_linear(seed: WidthSeed) -> bool:
    return seed._consumer_geometry[0] == "linear"


def _unit_out(seed: WidthSeed, flat: torch.Tensor) -> torch.Tensor:
    """One unit's fan-out, from its flat vector to the consumer weight's layout for one unit."""
    out = seed.fan_out.shape[0]
    return flat.view(out, seed.site.positions) if _is_linear(seed) else flat.view(out, 1, *seed.fan_out.shape[2:])


def _set_out_rows(seed: WidthSeed, rows: torch.Tensor) -> None:
    """Write per-unit flat fan-outs (r, d_out) into the first r units of ``seed.fan_out``."""
    p = seed.site.positions
    for j, row in enumerate(rows):
        unit = _unit_out(seed, row)
        if _is_linear(seed):
            seed.fan_out[:, j * p : (j + 1) * p] = unit
        else:
            seed.fan_out[:, j : j + 1] = unit


def _bilinear(seed: WidthSeed, batches: Sequence[SiteSignals], *, project: bool) -> torch.Tensor:
    """``A`` (d_in, d_out): the first-order loss change of one unit is ``u^T A v``."""
    d_in = seed.fan_in[0].numel()
    d_out = seed.fan_out.numel() // seed.units
    slopes = _slopes(seed)

    def change(u: torch.Tensor, v: torch.Tensor, batch: SiteSignals, g: torch.Tensor) -> torch.Tensor:
        z = _apply(seed._layer_geometry, batch.x, u.view(1, *seed.fan_in.shape[1:]), None)
        for i, step in enumerate(seed.site.steps):
            if step.kind == "elementwise":
                z = z * slopes[i]
            elif step.kind in ("pool", "flatten"):
                z = seed._replay(i, step, z)
            # norms and dropout: identity to first order around a fresh unit
        y = _apply(seed._consumer_geometry, z, _unit_out(seed, v), None)
        return (y * g).sum()

    total = torch.zeros(d_in, d_out, dtype=seed.fan_in.dtype, device=seed.fan_in.device)
    zeros_u, zeros_v = total.new_zeros(d_in), total.new_zeros(d_out)
    for batch in batches:
        g = _residual_gradient(seed, batch) if project else batch.g
        # Forward mode over the smaller side, one tangent per entry: a conv consumer's fan-out
        # (out channels x kernel) is often far longer than the fan-in (in channels x kernel).
        if d_in <= d_out:
            total += jacfwd(grad(change, argnums=1), argnums=0)(zeros_u, zeros_v, batch, g).T
        else:
            total += jacfwd(grad(change, argnums=0), argnums=1)(zeros_u, zeros_v, batch, g)
    return total / sum(b.x.shape[0] for b in batches)


def _residual_gradient(seed: WidthSeed, batch: SiteSignals) -> torch.Tensor:
    """``g`` less its least-squares fit by a change of the consumer's existing weights (TINY's
    projection: only what the current units cannot express is a bottleneck)."""
    h_rows = _rows(seed._consumer_geometry, batch.h, _consumer_unit_weight(seed, batch))  # (N, d_h)
    # Outputs per row: a Linear's on the last dim (any leading dims), a convolution's on dim 1.
    g = batch.g if _is_linear(seed) else batch.g.movedim(1, -1)
    g_rows = g.reshape(-1, g.shape[-1])
    # gelsd (SVD) because the rows are rank-deficient whenever a unit is dead; CUDA's lstsq has
    # only gels (QR, full rank), so the solve runs on the CPU, once per germination (found on the
    # first GPU lease: every TINY germination on CUDA failed here).
    fit = torch.linalg.lstsq(h_rows.cpu(), g_rows.cpu(), driver="gelsd").solution.to(h_rows.device)  # (d_h, out)
    residual = (g_rows - h_rows @ fit).reshape(g.shape)
    return residual if _is_linear(seed) else residual.movedim(-1, 1)


def _consumer_unit_weight(seed: WidthSeed, batch: SiteSignals) -> torch.Tensor:
    """A one-output weight of the consumer's shape: (1, d_h) or (1, C, *kernel)."""
    if _is_linear(seed):
        return batch.h.new_zeros(1, batch.h.shape[-1])
    return batch.h.new_zeros(1, batch.h.shape[1], *seed.fan_out.shape[2:])


def _input_covariance(seed: WidthSeed, batches: Sequence[SiteSignals]) -> torch.Tensor:
    """``S`` (d_in, d_in): second moment of what one new unit's fan-in reads (rows or patches)."""
    unit = seed.fan_in[:1]
    total, n = None, 0
    for batch in batches:
        rows = _rows(seed._layer_geometry, batch.x, unit)
        total = rows.T @ rows if total is None else total + rows.T @ rows
        n += rows.shape[0]
    assert total is not None
    return total / n


def _rows(geometry: tuple[str, dict[str, object]], t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The rows a one-output layer of ``weight``'s shape reads from ``t``: (samples x positions, d).

    A Linear reads ``t``'s last dim; a convolution with integer padding reads the patches
    ``F.unfold`` cuts (im2col). Any other geometry (a string padding such as ``"same"``) takes the
    Jacobian of the one-output layer, which is exact but costs a backward per output position:
    1.8 s of a 3.2 s TINY init on an 8x8 map, where the patches take milliseconds.
    """
    kind, kw = geometry
    if kind == "linear":
        return t.reshape(-1, t.shape[-1])
    if not isinstance(kw["padding"], str):
        return _patches(kind, kw, t, tuple(weight.shape[2:]))
    zero = torch.zeros_like(weight)

    def one_output(w: torch.Tensor) -> torch.Tensor:
        return _apply(geometry, t, w, None).flatten()

    return jacrev(one_output)(zero).reshape(-1, weight[0].numel())


def _patches(kind: str, kw: dict[str, object], t: torch.Tensor, kernel: tuple[int, ...]) -> torch.Tensor:
    """im2col of a convolution's input: one row per (sample, output position), in the order the
    convolution's output flattens, columns in the weight's (channel, *kernel) order."""
    if kind == "conv1d":
        # A 1-D convolution is a 2-D one over a height of 1.
        t = t.unsqueeze(2)
        kernel = (1, *kernel)
        kw = {k: (1 if k != "padding" else 0, *v) for k, v in kw.items()}  # type: ignore[misc]
    cols = F.unfold(t, kernel_size=kernel, dilation=kw["dilation"], padding=kw["padding"], stride=kw["stride"])
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])  # (N, d, L) -> (N * L, d)


def _slopes(seed: WidthSeed) -> dict[int, float]:
    """Each elementwise step's slope at 0 (ReLU: 1, the right derivative the seed trains with)."""
    slopes = {}
    for i, step in enumerate(seed.site.steps):
        if step.kind != "elementwise":
            continue
        if step.func in _RELUS:
            slopes[i] = 1.0
            continue
        z = seed.fan_in.new_zeros((), requires_grad=True)  # on the seed's device: a step may hold tensors
        with torch.enable_grad():
            (d,) = torch.autograd.grad(seed._replay(i, step, z), z)
        slopes[i] = float(d)
    return slopes


def _host_fan_out_norm(seed: WidthSeed) -> torch.Tensor:
    """The mean norm of one existing unit's fan-out in the consumer (the scale new units start at)."""
    w2 = seed.host_weights()[1]
    if _is_linear(seed):
        per_unit = w2.view(w2.shape[0], -1, seed.site.positions).transpose(0, 1).flatten(1)
    else:
        per_unit = w2.transpose(0, 1).flatten(1)
    return per_unit.norm(dim=1).mean()
