"""Per-layer statistics of the host: gradient norms accumulated on device every step and
activation moments gathered during validation, each reduced once per epoch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from esper_core.contracts import LayerState


class LayerStats:
    """Accumulates host-layer gradient norms (per step) and activations (per validation)."""

    def __init__(self, names: Sequence[str], layers: Sequence[nn.Module], widths: Sequence[int]) -> None:
        self.names = tuple(names)
        self.layers = tuple(layers)
        self.widths = tuple(widths)
        self._weights = [layer.weight for layer in self.layers]  # type: ignore[union-attr]
        self._grad_sq: torch.Tensor | None = None  # (L,) running sum of squared grad norms
        self._steps = 0
        self._act: dict[str, tuple[float, float]] = {}

    def reset(self) -> None:
        """Start a new epoch."""
        self._grad_sq = None
        self._steps = 0
        self._act = {}

    def accumulate_grads(self) -> None:
        """Add this step's per-layer weight-gradient norms (device only, no sync)."""
        grads = [w.grad for w in self._weights]
        if any(g is None for g in grads):
            return
        sq = torch.stack(torch._foreach_norm(grads)).square()  # type: ignore[arg-type]
        self._grad_sq = sq if self._grad_sq is None else self._grad_sq + sq
        self._steps += 1

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

    def export(self) -> tuple[LayerState, ...]:
        """One ``LayerState`` per host layer (one device sync for all gradient norms)."""
        grad = [0.0] * len(self.names)
        if self._grad_sq is not None and self._steps:
            grad = (self._grad_sq / self._steps).sqrt().tolist()
        return tuple(
            LayerState(
                name=name,
                width=width,
                activation_mean=self._act.get(name, (0.0, 0.0))[0],
                activation_std=self._act.get(name, (0.0, 0.0))[1],
                grad_norm=g,
            )
            for name, width, g in zip(self.names, self.widths, grad, strict=True)
        )
