"""Where a layer can be widened: the path from its output to the weight layer that reads it.

Widening layer ``L`` by k units means k new output rows of ``L`` (fan-in), k new entries in every
per-channel module between ``L`` and its consumer, and k new input columns of the consumer
(fan-out; after a flatten, k x positions columns). Which modules lie in between is discovered, not
written by hand: one dry forward on the meta device (no memory, no compute) under a
``TorchFunctionMode`` follows every tensor computed from ``L``'s output, op by op, until a
``Linear`` or ``Conv`` module reads it. Only ops that act on each unit (channel) alone can be
extended with new units: activations, dropout, per-channel normalisation, pooling, and a flatten
of channels-first features. Anything else (a residual add, a concatenation, a reshape that mixes
units, a reduction, a split whose parts are read apart as a fused q/k/v projection's are, or two
readers) is refused, naming the op, before any work starts.

Shapes: ``L``'s output is (B, C, *S) for a convolution (units on dim 1) or (B, ..., F) for a
``Linear`` (units on the last dim).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from esper_core.kasmina.dryrun import dry_forward

StepKind = Literal["elementwise", "dropout", "batch_norm", "group_norm", "layer_norm", "pool", "flatten"]

WIDENABLE = (nn.Linear, nn.Conv1d, nn.Conv2d)
"""Layer types a width seed can widen and that can consume new units."""

# Ops that act on every element alone: new units pass through them unchanged in form.
_ELEMENTWISE = {
    F.relu,
    torch.relu,
    torch.relu_,
    torch.Tensor.relu,
    torch.Tensor.relu_,
    F.relu6,
    F.gelu,
    F.silu,
    F.elu,
    F.leaky_relu,
    F.hardtanh,
    F.mish,
    F.softplus,
    torch.tanh,
    torch.Tensor.tanh,
    torch.sigmoid,
    torch.Tensor.sigmoid,
    F.sigmoid,
    F.tanh,
}
_DROPOUT = {F.dropout, F.dropout1d, F.dropout2d}
# Pooling acts on each channel of a channels-first tensor alone.
_POOL = {
    F.max_pool1d,
    F.max_pool2d,
    F.avg_pool1d,
    F.avg_pool2d,
    F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d,
    F.adaptive_max_pool1d,
    F.adaptive_max_pool2d,
}
_FLATTEN = {torch.flatten, torch.Tensor.flatten, torch.Tensor.view, torch.Tensor.reshape, torch.reshape}
_WEIGHT_OPS = {F.linear, F.conv1d, F.conv2d}


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One op between the widened layer and its consumer, replayed on the new units.

    Attributes:
        kind: How new units pass through it.
        func: The op, for ``elementwise`` and ``pool`` steps.
        args: Its non-tensor positional arguments after the input.
        kwargs: Its keyword arguments.
        module: Dotted name of the module that ran it (norms: the module whose per-channel
            parameters grow), or ``""`` for an op called in ``forward()`` itself.
    """

    kind: StepKind
    func: Callable[..., torch.Tensor] | None = None
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = field(default_factory=dict)
    module: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class WidthSite:
    """A layer that can be widened, as the dry forward found it.

    Attributes:
        layer: Dotted name of the widened layer (``Linear``, ``Conv1d``, ``Conv2d``).
        consumer: Dotted name of the weight layer that reads its (transformed) output.
        steps: The ops in between, in order.
        width: The layer's current output units (``out_features`` / ``out_channels``).
        input_shape: Per-sample shape of the layer's input.
        positions: Consumer input columns per unit: 1, or the spatial positions a flatten folds
            into the consumer's features.
        output_shape: Per-sample shape of the consumer's output (what a width seed adds to).
    """

    layer: str
    consumer: str
    steps: tuple[Step, ...]
    width: int
    input_shape: tuple[int, ...]
    positions: int
    output_shape: tuple[int, ...]


def trace_width_site(
    model: nn.Module, layer: str, sample_shape: tuple[int, ...], input_dtype: torch.dtype = torch.float32
) -> WidthSite:
    """Follow ``layer``'s output through one dry forward to the weight layer that reads it.

    Args:
        model: The user's model (its weights are not read or changed).
        layer: Dotted name of the layer to widen.
        sample_shape: Shape of one input sample, without the batch dimension.
        input_dtype: The input's dtype (``torch.long`` for token ids).

    Returns:
        The site: consumer, the ops in between, and the shapes a width seed needs.

    Raises:
        ValueError: the layer does not exist or is not a ``Linear`` / ``Conv1d`` / ``Conv2d``, or
            its output reaches something that cannot take new units; the message says what and
            how to choose another layer.
    """
    modules = dict(model.named_modules())
    target = modules.get(layer) if layer else None
    if target is None:
        widenable = [n for n, m in modules.items() if isinstance(m, WIDENABLE)]
        raise ValueError(f"the model has no module named {layer!r} to widen; its widenable layers are {widenable}")
    _check_widenable(layer, target, role="widened")
    tracer = _Tracer(layer, modules)
    handles = [m.register_forward_pre_hook(tracer.enter(n)) for n, m in modules.items() if n]
    handles += [m.register_forward_hook(tracer.leave(n)) for n, m in modules.items() if n]
    try:
        with tracer:
            dry_forward(model, (2, *sample_shape), input_dtype)
    finally:
        for h in handles:
            h.remove()
    return tracer.site()


def _check_widenable(name: str, module: nn.Module, *, role: str) -> None:
    if not isinstance(module, WIDENABLE):
        raise ValueError(
            f"{name!r} is a {type(module).__name__}: a width seed widens and feeds Linear, Conv1d or Conv2d layers; "
            "name one of those"
        )
    if isinstance(module, nn.Conv1d | nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
        raise ValueError(
            f"{name!r} (the {role} layer) is a grouped or non-zero-padded convolution (groups={module.groups}, "
            f"padding_mode={module.padding_mode!r}), which a width seed cannot extend; widen a plain convolution"
        )


class _Tracer(TorchFunctionMode):
    """Follows tensors computed from one layer's output through a forward pass."""

    def __init__(self, layer: str, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        self.layer = layer
        self.modules = modules
        self.stack: list[str] = []
        self.calls = 0
        # id -> (tensor, units dim or None once flattened, positions folded per unit). The tensors
        # are kept referenced so that no id is reused while tracing.
        self.tracked: dict[int, tuple[torch.Tensor, int | None, int]] = {}
        self.readers: dict[int, int] = {}
        self.steps: list[Step] = []
        self.consumers: list[str] = []
        self.output_shapes: dict[str, tuple[int, ...]] = {}
        self.input_shape: tuple[int, ...] = ()
        self.problem: str | None = None
        self.positions = 1

    def enter(self, name: str) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def hook(_m: nn.Module, args: tuple[object, ...]) -> None:
            self.stack.append(name)
            if name == self.layer and args and isinstance(args[0], torch.Tensor):
                self.input_shape = tuple(args[0].shape[1:])

        return hook

    def leave(self, name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(_m: nn.Module, _args: object, out: object) -> None:
            self.stack.pop()
            if isinstance(out, torch.Tensor):
                self.output_shapes[name] = tuple(out.shape[1:])
            if name == self.layer:
                self.calls += 1
                assert isinstance(out, torch.Tensor)
                units_dim = 1 if isinstance(self.modules[name], nn.Conv1d | nn.Conv2d) else out.dim() - 1
                self.tracked[id(out)] = (out, units_dim, 1)

        return hook

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.problem is not None:
            return out
        hits = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and id(t) in self.tracked]
        if not hits:
            return out
        where = f"in {self.stack[-1]!r}" if self.stack else "in forward()"
        name = getattr(func, "__name__", str(func))
        if not isinstance(out, torch.Tensor):
            if any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
                # split / chunk / unbind: the parts are read apart (a fused q/k/v projection's
                # thirds feed attention, whose output another layer reads), so no one consumer
                # could take new units.
                self.problem = (
                    f"is split into parts by {name} {where} (a fused projection such as attention's q, k and v), "
                    "and each part is read on its own; a width seed needs one reader of the whole output. Widen "
                    "a layer whose output is read whole, such as the MLP's first layer"
                )
            return out  # metadata reads (shape, dim, dtype) return no tensor and change nothing
        src, units_dim, positions = self.tracked[id(hits[0])]
        first = args[0] if args else kwargs.get("input")
        if len(hits) > 1 or first is not hits[0]:
            self.problem = f"reaches {name} {where} together with another tensor (a residual add, a concatenation?)"
            return out
        if out is not src:  # an in-place op hands the same tensor on: not a second reader
            self.readers[id(src)] = self.readers.get(id(src), 0) + 1
            if self.readers[id(src)] > 1:
                self.problem = f"is read twice (again by {name} {where}); a width seed needs one reader"
                return out
        if func in _WEIGHT_OPS:
            self._consume(func, where)
            return out
        step = self._step(func, args, kwargs, src, units_dim, out, where)
        if step is not None:
            self.steps.append(step)
            new_dim, new_positions = (None, positions * _spatial(src)) if step.kind == "flatten" else (units_dim, 1)
            self.tracked[id(out)] = (out, new_dim, positions if step.kind != "flatten" else new_positions)
            if step.kind == "flatten":
                self.positions = new_positions
        return out

    def _consume(self, func: object, where: str) -> None:
        name = self.stack[-1] if self.stack else ""
        module = self.modules.get(name)
        if module is None or not isinstance(module, WIDENABLE) or (func is F.linear) != isinstance(module, nn.Linear):
            self.problem = f"is read by a functional {getattr(func, '__name__', func)} {where}, not by a layer module"
            return
        self.consumers.append(name)

    def _step(
        self,
        func: object,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        src: torch.Tensor,
        units_dim: int | None,
        out: torch.Tensor,
        where: str,
    ) -> Step | None:
        module = self.stack[-1] if self.stack else ""
        name = getattr(func, "__name__", str(func))
        if func in _ELEMENTWISE:
            # Replayed out of place on the seed's own tensor.
            extra = {k: v for k, v in kwargs.items() if k != "inplace"}
            return Step(kind="elementwise", func=func, args=tuple(args[1:]), kwargs=extra, module=module)
        if func in _DROPOUT:
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            return Step(kind="dropout", func=func, kwargs={"p": p}, module=module)
        if units_dim is None:
            self.problem = f"after a flatten reaches {name} {where}, which a width seed cannot follow"
            return None
        if func is F.batch_norm and units_dim == 1:
            return Step(kind="batch_norm", module=module)
        if func is F.group_norm and units_dim == 1:
            return Step(kind="group_norm", module=module)
        if func is F.layer_norm:
            shape = kwargs.get("normalized_shape", args[1] if len(args) > 1 else ())
            if units_dim >= src.dim() - len(tuple(shape)):  # type: ignore[arg-type]
                self.problem = (
                    f"reaches a LayerNorm {where} that normalises across its units, so new units would change the "
                    "old ones' values; widen a layer whose units are not normalised together"
                )
                return None
            return Step(kind="layer_norm", module=module)
        if func in _POOL and units_dim == 1:
            return Step(kind="pool", func=func, args=tuple(args[1:]), kwargs=dict(kwargs), module=module)
        if (
            func in _FLATTEN
            and units_dim == 1
            and src.dim() >= 3
            and tuple(out.shape) == (src.shape[0], src[0].numel())
        ):
            return Step(kind="flatten", module=module)
        if func in _FLATTEN and tuple(out.shape) == tuple(src.shape):
            return None  # a no-op view: the same tensor under another name
        self.problem = f"reaches {name} {where}, which mixes or reshapes units in a way a width seed cannot extend"
        return None

    def site(self) -> WidthSite:
        if self.calls != 1:
            what = "never runs" if self.calls == 0 else f"runs {self.calls} times (a shared module)"
            raise ValueError(f"{self.layer!r} {what} in one forward; a width seed needs a layer that runs once")
        if self.problem is not None:
            raise ValueError(f"{self.layer!r} cannot be widened: its output {self.problem}")
        if not self.consumers:
            raise ValueError(
                f"{self.layer!r} cannot be widened: its output reaches the model's output without another weight "
                "layer reading it (an output layer's width is fixed by the task); widen a hidden layer"
            )
        consumer = self.consumers[0]
        _check_widenable(consumer, self.modules[consumer], role="consuming")
        target = self.modules[self.layer]
        width = target.out_features if isinstance(target, nn.Linear) else target.out_channels
        return WidthSite(
            layer=self.layer,
            consumer=consumer,
            steps=tuple(self.steps),
            width=int(width),
            input_shape=self.input_shape,
            positions=self.positions,
            output_shape=self.output_shapes[consumer],
        )


def _spatial(t: torch.Tensor) -> int:
    return math.prod(t.shape[2:])
