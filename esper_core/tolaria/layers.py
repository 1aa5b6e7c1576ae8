"""Per-layer statistics of the host: activation moments gathered during validation, plus the
epoch gradient norms the trainer's ``GradNormAccumulator`` measured."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from esper_core.contracts import LayerState


class LayerStats:
    """Host-layer activations (per validation) and their export as ``LayerState``s."""

    def __init__(self, names: Sequence[str], layers: Sequence[nn.Module]) -> None:
        self.names = tuple(names)
        self.layers = tuple(layers)
        # The weight Parameters themselves: a merged width seed grows them in place, so they stay valid.
        self.weights = [layer.weight for layer in self.layers]  # gradient norms are tracked on these
        self._act: dict[str, tuple[float, float]] = {}

    def reset(self) -> None:
        """Start a new epoch."""
        self._act = {}

    @contextlib.contextmanager
    def watch_activations(self) -> Iterator[None]:
        """Within the block, record mean/std of each layer's output (use around validation)."""
        sums: dict[str, list[torch.Tensor]] = {n: [] for n in self.names}

        def hook(name: str):
            def record(_m: nn.Module, _inp: object, out: torch.Tensor) -> None:
                sums[name].append(torch.stack([out.mean(), out.std(unbiased=False)]))

            return record

        handles = [layer.register_forward_hook(hook(n)) for n, layer in zip(self.names, self.layers, strict=True)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        for name, parts in sums.items():
            if parts:
                mean_std = torch.stack(parts).mean(dim=0).tolist()
                self._act[name] = (mean_std[0], mean_std[1])

    def export(self, grad_norms: dict[str, float], widths: Sequence[int]) -> tuple[LayerState, ...]:
        """One ``LayerState`` per host layer; ``grad_norms`` maps a layer name to its epoch norm,
        ``widths`` are the layers' current widths (the host's ``layer_widths``, which growth changes)."""
        grad = [grad_norms.get(name, 0.0) for name in self.names]
        return tuple(
            LayerState(
                name=name,
                width=width,
                activation_mean=self._act.get(name, (0.0, 0.0))[0],
                activation_std=self._act.get(name, (0.0, 0.0))[1],
                grad_norm=g,
            )
            for name, width, g in zip(self.names, widths, grad, strict=True)
        )
