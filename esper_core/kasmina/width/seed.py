"""A width seed: k new units of a host layer, kept as a side module while they are young.

Widening layer ``L`` (weights ``W``) by k units whose consumer has weights ``W2`` is, before the
merge, a side module added to the consumer's output::

    delta = W2_new * steps(L_new(x))        x: L's input;  L_new: k rows (fan-in U, bias b)

where ``steps`` replays the ops found between ``L`` and its consumer on the new units alone (their
own normalisation entries; a flatten folds k x positions columns) and ``W2_new`` holds the
consumer's k new input columns (fan-out V, no bias: the consumer's bias is the host's). Once
merged (``merge.py``) the same numbers sit inside the physically wider layers, so the side module
and the merged network compute the same function.

ReLU is replayed as a threshold just below 0 (``F.threshold`` at minus the dtype's smallest normal
number), whose gradient at exactly 0 is 1 (PyTorch's ``relu`` gives 0 there): a new unit with
all-zero fan-in (GradMax) would otherwise never receive a gradient. Away from 0 the gradient is
ReLU's; so is the value, except that a negative input smaller in magnitude than that number
(below 1.2e-38 in float32 and bfloat16, 6.1e-5 in float16) passes through instead of becoming 0.
``clamp_min(0)`` has the same gradient at 0, but its backward is a ``where`` that cost 73 us a
step against the threshold's 23 on the MNIST-1D CNN's first layer (batch 100, one CPU thread).
The threshold is a normal number, not the smallest subnormal, so that flushing denormals to zero
cannot move it to 0.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.kasmina.width.trace import Step, WidthSite

_RELUS = {F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_}


class WidthSeed(nn.Module):
    """The k new units of ``site.layer``: fan-in, per-unit norm entries, fan-out.

    Args:
        site: Where the units go (``trace_width_site``).
        host: The model that holds ``site.layer`` and ``site.consumer`` (read for geometry only).
        units: k, the units to add.
        device: Where its tensors live; None: the host layer's. ``torch.device("meta")`` sizes
            a seed without allocating or drawing from the host's random generator (its cost).

    Raises:
        ValueError: ``units`` < 1, or a ``GroupNorm`` in between whose group size does not
            divide ``units`` (the message names the sizes that work).
    """

    def __init__(self, site: WidthSite, host: nn.Module, *, units: int, device: torch.device | None = None) -> None:
        super().__init__()
        if units < 1:
            raise ValueError(f"a width seed adds at least one unit, got units={units}")
        modules = dict(host.named_modules())
        layer, consumer = modules[site.layer], modules[site.consumer]
        self.site = site
        self.units = units
        ref = layer.weight
        place = ref.device if device is None else device
        self.fan_in = nn.Parameter(torch.empty((units, *ref.shape[1:]), dtype=ref.dtype, device=place))
        bias = getattr(layer, "bias", None)
        self.fan_in_bias = None if bias is None else nn.Parameter(torch.zeros(units, dtype=ref.dtype, device=place))
        w2 = consumer.weight
        fan_out_shape = (
            (w2.shape[0], units * site.positions)
            if isinstance(consumer, nn.Linear)
            else (w2.shape[0], units, *w2.shape[2:])
        )
        self.fan_out = nn.Parameter(
            torch.zeros(fan_out_shape, dtype=w2.dtype, device=w2.device if device is None else device)
        )
        # The host's weights, read (never trained) by the data-aware inits; a tuple, not submodules.
        self._host = (layer, consumer)
        self._layer_geometry = _geometry(layer)
        self._consumer_geometry = _geometry(consumer)
        self.norms = nn.ModuleDict()
        # LayerNorm over other dims shares the host's affine parameters: read, never trained here.
        self._shared: dict[str, nn.Module] = {}
        for i, step in enumerate(site.steps):
            if step.kind in ("batch_norm", "group_norm"):
                self.norms[str(i)] = _new_norm(step, modules[step.module], units, device)
            elif step.kind == "layer_norm":
                self._shared[str(i)] = modules[step.module]
        self.reset_fan_in()

    def reset_fan_in(self) -> None:
        """Random fan-in at the host layer's own default scale (``nn.Linear`` / ``nn.Conv`` init)."""
        nn.init.kaiming_uniform_(self.fan_in, a=math.sqrt(5))
        if self.fan_in_bias is not None:
            fan_in = self.fan_in[0].numel()
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(self.fan_in_bias, -bound, bound)

    def host_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The widened layer's and the consumer's current weights (read only)."""
        return self._host[0].weight.detach(), self._host[1].weight.detach()

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The new units' activations as the consumer reads them (after every step)."""
        z = _apply(self._layer_geometry, x, self.fan_in, self.fan_in_bias)
        for i, step in enumerate(self.site.steps):
            z = self._replay(i, step, z)
        return z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The new units' contribution to the consumer's output, from the widened layer's input."""
        return _apply(self._consumer_geometry, self.hidden(x), self.fan_out, None)

    def _replay(self, i: int, step: Step, z: torch.Tensor) -> torch.Tensor:
        if step.kind == "elementwise":
            assert step.func is not None
            if step.func in _RELUS:
                return F.threshold(z, -torch.finfo(z.dtype).tiny, 0.0)
            return step.func(z, *step.args, **step.kwargs)
        if step.kind == "dropout":
            assert step.func is not None
            return step.func(z, p=step.kwargs["p"], training=self.training)
        if step.kind in ("batch_norm", "group_norm"):
            return self.norms[str(i)](z)
        if step.kind == "layer_norm":
            ln = self._shared[str(i)]
            weight = None if ln.weight is None else ln.weight.detach()
            bias = None if ln.bias is None else ln.bias.detach()
            return F.layer_norm(z, ln.normalized_shape, weight, bias, ln.eps)
        if step.kind == "pool":
            assert step.func is not None
            return step.func(z, *step.args, **step.kwargs)
        assert step.kind == "flatten"
        return z.flatten(1)


def _geometry(module: nn.Module) -> tuple[str, dict[str, object]]:
    if isinstance(module, nn.Linear):
        return "linear", {}
    kind = "conv1d" if isinstance(module, nn.Conv1d) else "conv2d"
    return kind, {"stride": module.stride, "padding": module.padding, "dilation": module.dilation}


def _apply(
    geometry: tuple[str, dict[str, object]], x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    kind, kw = geometry
    if kind == "linear":
        return F.linear(x, weight, bias)
    conv = F.conv1d if kind == "conv1d" else F.conv2d
    return conv(x, weight, bias, **kw)


def _new_norm(step: Step, host_norm: nn.Module, units: int, device: torch.device | None) -> nn.Module:
    place = _device(host_norm) if device is None else device
    if isinstance(host_norm, nn.GroupNorm):
        per_group = host_norm.num_channels // host_norm.num_groups
        if units % per_group:
            raise ValueError(
                f"{step.module!r} normalises groups of {per_group} channels: widen by a multiple of {per_group} "
                f"(got {units}) so that the new channels form whole groups of their own"
            )
        return nn.GroupNorm(units // per_group, units, eps=host_norm.eps, affine=host_norm.affine, device=place)
    assert isinstance(host_norm, nn.modules.batchnorm._BatchNorm), type(host_norm)
    return type(host_norm)(
        units,
        eps=host_norm.eps,
        momentum=host_norm.momentum,
        affine=host_norm.affine,
        track_running_stats=host_norm.track_running_stats,
        device=place,
    )


def _device(module: nn.Module) -> torch.device | None:
    tensor = next(iter([*module.parameters(), *module.buffers()]), None)
    return None if tensor is None else tensor.device
