"""Per-layer statistics and shape of the host: activation moments and output sizes gathered
during validation, the epoch gradient norms the trainer's ``GradNormAccumulator`` measured, and
what each layer is (kind, fans, parameters, FLOPs per sample) in terms every architecture shares."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from esper_core.contracts import LayerState
from esper_core.contracts.enums import LayerKind

# Modules whose projections belong to an attention or transformer block, whatever they are called.
_ATTENTION_TYPES: tuple[type[nn.Module], ...] = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
)
_RECURRENT_TYPES: tuple[type[nn.Module], ...] = (nn.RNNBase, nn.RNNCellBase)
_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
)


def layer_kind(module: nn.Module, ancestors: Sequence[nn.Module] = ()) -> LayerKind:
    """What ``module`` computes, from its type and, for a plain ``Linear``, the blocks around it.

    A ``Linear`` is an attention projection when the block it sits in directly is
    ``nn.MultiheadAttention`` or a torch transformer layer, or when that block's class name says
    "attention" (a user's ``CausalSelfAttention``); recurrent inside an RNN cell. Only the
    direct parent: a whole model called ``AttentionClassifier`` does not make its head attention.
    Names of classes, never of layers: a user's class names describe what a block is, a recipe's
    layer names only where it sits.

    Args:
        module: The layer.
        ancestors: The modules that contain it, outermost first.

    Returns:
        Its kind; ``OTHER`` for what the vocabulary has no word for (a 3-D conv, say).
    """
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return LayerKind.EMBEDDING
    if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
        return LayerKind.CONV1D
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        return LayerKind.CONV2D
    if isinstance(module, _NORM_TYPES):
        return LayerKind.NORM
    if isinstance(module, _RECURRENT_TYPES):
        return LayerKind.RECURRENT
    block = (*ancestors[-1:], module)
    if any(isinstance(m, _ATTENTION_TYPES) or "attention" in type(m).__name__.lower() for m in block):
        return LayerKind.ATTENTION
    if any(isinstance(m, _RECURRENT_TYPES) for m in ancestors):
        return LayerKind.RECURRENT
    if isinstance(module, nn.Linear):
        return LayerKind.LINEAR
    return LayerKind.OTHER


def _ancestors(root: nn.Module, layers: Sequence[nn.Module]) -> list[list[nn.Module]]:
    """The modules enclosing each of ``layers`` under ``root`` (found by identity), outermost first."""
    modules = dict(root.named_modules())
    name_of = {id(m): name for name, m in modules.items()}
    out = []
    for layer in layers:
        name = name_of.get(id(layer))
        parts = name.split(".") if name else []
        # Every proper prefix of the dotted name is an enclosing module (the root is "").
        out.append([modules[p] for i in range(len(parts)) if (p := ".".join(parts[:i])) in modules])
    return out


def _watched(layer: nn.Module, ancestors: Sequence[nn.Module]) -> nn.Module:
    """The module whose output is ``layer``'s: itself, except ``nn.MultiheadAttention``'s
    ``out_proj``, whose weight the attention applies without calling it (its own hook never
    fires); the attention's first output is exactly its output."""
    parent = ancestors[-1] if ancestors else None
    if isinstance(parent, nn.MultiheadAttention) and parent.out_proj is layer:
        return parent
    return layer


class LayerStats:
    """Host-layer activations (per validation) and their export as ``LayerState``s.

    Args:
        names: The layers' names, in host order.
        layers: The layers (modules owning a weight of two or more dimensions).
        root: The host they belong to; their kinds are read from the blocks around them.
    """

    def __init__(self, names: Sequence[str], layers: Sequence[nn.Module], *, root: nn.Module) -> None:
        self.names = tuple(names)
        self.layers = tuple(layers)
        # The weight Parameters themselves: a merged width seed grows them in place, so they stay valid.
        self.weights = [layer.weight for layer in self.layers]  # gradient norms are tracked on these
        # A module's type never changes in a run: the kinds are read once.
        ancestors = _ancestors(root, self.layers)
        self.kinds = tuple(layer_kind(layer, a) for layer, a in zip(self.layers, ancestors, strict=True))
        self._watched = tuple(_watched(layer, a) for layer, a in zip(self.layers, ancestors, strict=True))
        self._act: dict[str, tuple[float, float]] = {}
        self._out_elements: dict[str, int] = {}

    def reset(self) -> None:
        """Start a new epoch."""
        self._act = {}
        self._out_elements = {}

    @contextlib.contextmanager
    def watch_activations(self) -> Iterator[None]:
        """Within the block, record mean/std of each layer's output and how many output elements
        it produced (use around one pass over the validation split)."""
        sums: dict[str, list[torch.Tensor]] = {n: [] for n in self.names}
        elements: dict[str, int] = dict.fromkeys(self.names, 0)

        def hook(name: str):
            def record(_m: nn.Module, _inp: object, out: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
                if isinstance(out, tuple):  # a watched attention: (output, weights)
                    out = out[0]
                sums[name].append(torch.stack([out.mean(), out.std(unbiased=False)]))
                elements[name] += out.numel()  # shape metadata: no device sync

            return record

        handles = [m.register_forward_hook(hook(n)) for n, m in zip(self.names, self._watched, strict=True)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        for name, parts in sums.items():
            if parts:
                mean_std = torch.stack(parts).mean(dim=0).tolist()
                self._act[name] = (mean_std[0], mean_std[1])
                self._out_elements[name] = elements[name]

    def export(self, grad_norms: dict[str, float], widths: Sequence[int], *, samples: int) -> tuple[LayerState, ...]:
        """One ``LayerState`` per host layer.

        Args:
            grad_norms: A layer name's epoch gradient norm.
            widths: The layers' current widths (the host's ``layer_widths``, which growth changes).
            samples: How many samples the watched validation pass ran (for FLOPs per sample).

        Returns:
            The states, in host order.
        """
        states = []
        for name, layer, kind, width in zip(self.names, self.layers, self.kinds, widths, strict=True):
            # Counts read off the weight's shape, never timings: the same on every machine.
            shape = layer.get_parameter("weight").shape
            fan_in = math.prod(shape[1:])  # in features, or in channels per group x the kernel
            out_elements = self._out_elements.get(name)
            flops = None
            if out_elements is not None and samples > 0:
                # Each output element is a dot product of fan_in terms (a multiply and an add
                # each); a lookup multiplies nothing.
                flops = 0 if kind is LayerKind.EMBEDDING else 2 * fan_in * out_elements // samples
            mean, std = self._act.get(name, (0.0, 0.0))
            states.append(
                LayerState(
                    name=name,
                    width=width,
                    activation_mean=mean,
                    activation_std=std,
                    grad_norm=grad_norms.get(name, 0.0),
                    kind=kind,
                    fan_in=fan_in,
                    fan_out=shape[0] * math.prod(shape[2:]),
                    params=sum(p.numel() for p in layer.parameters(recurse=False)),
                    flops_per_sample=flops,
                )
            )
        return tuple(states)
