"""Fold a blended width seed into its host: the layers become physically wider.

After the merge the host is a plain module of the static architecture at its new width (a
``Linear(in, W + k)``, a ``BatchNorm1d(W + k)``, a consumer reading ``W + k`` units), and it
computes what the host plus the seed at alpha 1 computed. Parameters keep their identity (their
``data`` grows in place), so the optimizer's parameter groups, and anything else that holds them,
stay valid; their optimizer state grows with them:

- the old entries keep their moments and the tensor keeps its step count;
- the new entries take the seed's own moments, rescaled to the host tensor's step count so that
  Adam's bias-corrected moments (and so its step sizes) are the ones the seed had. Zero-padded
  moments with the host's step count would give the new entries steps of about 3x the learning
  rate for ~100 updates (bias correction no longer divides the first update's small moments);
- a seed that never took a step gives its entries zero first moments and the old entries' mean
  second moment: steps of the size the layer's other entries take.

The seed's parameters leave the optimizer. A compiled training step re-traces once on the new
shapes (the caller counts it); ``torch.export`` should see only the final network.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from esper_core.kasmina.width.seed import WidthSeed
from esper_core.kasmina.width.trace import WidthSite

_ADAM_KEYS = {"exp_avg": 0, "exp_avg_sq": 1, "max_exp_avg_sq": 1}
"""Adam-family state tensors and the index of the beta their bias correction uses."""


@torch.no_grad()
def merge_width_seed(host: nn.Module, seed: WidthSeed, optimizer: torch.optim.Optimizer | None = None) -> WidthSite:
    """Grow ``seed.site.layer`` and its consumer by the seed's units, in place.

    Args:
        host: The model holding the site's layers.
        seed: A width seed at alpha 1 (what it adds is folded in as is).
        optimizer: The optimizer training ``host`` (and the seed), if any.

    Returns:
        The site at its new width (for a later widening of the same layer).
    """
    site, k = seed.site, seed.units
    dead = [i for i, row in enumerate(seed.fan_in.flatten(1)) if not row.any()]
    if dead:
        # The seed replays ReLU with gradient 1 at 0; the host's own ReLU has gradient 0 there,
        # so a unit merged with all-zero fan-in would never move again.
        raise ValueError(
            f"units {dead} of the width seed on {site.layer!r} still have all-zero fan-in (GradMax starts them so): "
            "merged now they would never learn; train the seed at least one step before merging it"
        )
    for i, step in enumerate(site.steps):
        new = seed.norms[str(i)] if step.kind in ("batch_norm", "group_norm") else None
        if new is None or not new.affine:
            continue
        off = [j for j in range(k) if new.weight[j] == 0 and new.bias[j] == 0]
        if off:
            # Scale and shift 0 make the channel a constant 0 into the host's ReLU, whose gradient
            # there is 0: neither would move again.
            raise ValueError(
                f"units {off} of the width seed on {site.layer!r} still have zero scale and shift in "
                f"{step.module!r} (TINY starts them so behind a normalisation): merged now they would never learn; "
                "train the seed at least one step before merging it"
            )
    modules = dict(host.named_modules())
    layer, consumer = modules[site.layer], modules[site.consumer]
    pieces: list[tuple[nn.Parameter, nn.Parameter, int]] = [(layer.weight, seed.fan_in, 0)]
    if layer.bias is not None:
        assert seed.fan_in_bias is not None
        pieces.append((layer.bias, seed.fan_in_bias, 0))
    for i, step in enumerate(site.steps):
        if step.kind not in ("batch_norm", "group_norm"):
            continue
        norm, new = modules[step.module], seed.norms[str(i)]
        if norm.affine:
            pieces += [(norm.weight, new.weight, 0), (norm.bias, new.bias, 0)]
        if isinstance(norm, nn.modules.batchnorm._BatchNorm) and norm.track_running_stats:
            norm.running_mean = torch.cat([norm.running_mean, new.running_mean])
            norm.running_var = torch.cat([norm.running_var, new.running_var])
        if isinstance(norm, nn.GroupNorm):
            norm.num_groups += new.num_groups
            norm.num_channels += k
        else:
            norm.num_features += k
    pieces.append((consumer.weight, seed.fan_out, 1))
    for host_param, seed_param, dim in pieces:
        _grow(host_param, seed_param, dim, optimizer)
    if isinstance(layer, nn.Linear):
        layer.out_features += k
    else:
        layer.out_channels += k
    if isinstance(consumer, nn.Linear):
        consumer.in_features += k * site.positions
    else:
        consumer.in_channels += k
    if optimizer is not None:
        _forget(optimizer, list(seed.parameters()))
    return dataclasses.replace(site, width=site.width + k)


def _grow(
    host_param: nn.Parameter, seed_param: nn.Parameter, dim: int, optimizer: torch.optim.Optimizer | None
) -> None:
    old_shape = host_param.shape
    host_param.data = torch.cat([host_param.data, _fit(seed_param.data.to(host_param.dtype), old_shape, dim, 0.0)], dim)
    host_param.grad = None
    if optimizer is None:
        return
    state = optimizer.state.get(host_param)
    if not state:
        return
    seed_state = optimizer.state.get(seed_param, {})
    group = next(g for g in optimizer.param_groups if any(p is host_param for p in g["params"]))
    betas = group.get("betas")
    host_step = float(state["step"]) if "step" in state else 0.0
    seed_step = float(seed_state["step"]) if "step" in seed_state else 0.0
    for key, value in list(state.items()):
        if not isinstance(value, torch.Tensor) or value.shape != old_shape:
            continue
        # Entries with no history of their own: no direction, second moments at the scale of
        # the layer's other entries (zero would make Adam's first steps several times lr).
        fill = value.mean().item() if key in ("exp_avg_sq", "max_exp_avg_sq") else 0.0
        piece = seed_state.get(key)
        if piece is None or seed_step == 0:
            piece = torch.full_like(seed_param, fill)
        elif betas is not None and key in _ADAM_KEYS:
            beta = betas[_ADAM_KEYS[key]]
            piece = piece * ((1 - beta**host_step) / (1 - beta**seed_step))
        state[key] = torch.cat([value, _fit(piece.to(value.dtype), old_shape, dim, fill)], dim)


def _fit(piece: torch.Tensor, host_shape: torch.Size, dim: int, fill: float) -> torch.Tensor:
    """Pad ``piece`` at the end of every dim but ``dim`` to ``host_shape``.

    A neighbouring seed merged first may have grown the host tensor on another dim (the layer
    before added input channels, or the consumer added rows); this seed's units never saw those,
    so their connections to them start at zero.
    """
    pad = [(0, host_shape[d] - piece.shape[d]) if d != dim else (0, 0) for d in range(piece.dim())]
    if not any(after for _, after in pad):
        return piece
    out = piece.new_full([host_shape[d] if d != dim else piece.shape[d] for d in range(piece.dim())], fill)
    out[tuple(slice(0, n) for n in piece.shape)] = piece
    return out


def _forget(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    """Drop ``params`` from ``optimizer``'s groups and state (a group left empty stays: its owner
    may index it)."""
    ids = {id(p) for p in params}
    for p in params:
        optimizer.state.pop(p, None)
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in ids]


@torch.no_grad()
def resize_width(host: nn.Module, site: WidthSite, width: int) -> WidthSite:
    """Give ``site.layer`` exactly ``width`` units (truncating or zero-padding every tensor the
    widening touches), for loading a checkpoint taken at that width; the values are the
    checkpoint's to fill in, and optimizer state is the checkpoint's too.

    Returns:
        The site at ``width``.
    """
    if width < 1:
        raise ValueError(f"a layer keeps at least one unit, got width={width} for {site.layer!r}")
    if width == site.width:
        return site
    modules = dict(host.named_modules())
    layer, consumer = modules[site.layer], modules[site.consumer]
    tensors: list[tuple[nn.Module, str, int, int]] = [(layer, "weight", 0, 1), (layer, "bias", 0, 1)]
    for step in site.steps:
        if step.kind not in ("batch_norm", "group_norm"):
            continue
        norm = modules[step.module]
        tensors += [(norm, n, 0, 1) for n in ("weight", "bias", "running_mean", "running_var")]
        if isinstance(norm, nn.GroupNorm):
            per_group = norm.num_channels // norm.num_groups
            if width % per_group:
                raise ValueError(f"{step.module!r} has groups of {per_group}: width {width} is not a multiple")
            norm.num_groups, norm.num_channels = width // per_group, width
        else:
            norm.num_features = width
    tensors.append((consumer, "weight", 1, site.positions))
    for module, name, dim, per_unit in tensors:
        t = getattr(module, name, None)
        if t is None:
            continue
        size = width * per_unit
        kept = t.data.narrow(dim, 0, min(size, t.shape[dim]))
        pad = list(kept.shape)
        pad[dim] = size - kept.shape[dim]
        new = torch.cat([kept, kept.new_zeros(pad)], dim) if pad[dim] > 0 else kept.clone()
        t.data = new
        t.grad = None
    if isinstance(layer, nn.Linear):
        layer.out_features = width
    else:
        layer.out_channels = width
    if isinstance(consumer, nn.Linear):
        consumer.in_features = width * site.positions
    else:
        consumer.in_channels = width
    return dataclasses.replace(site, width=width)
