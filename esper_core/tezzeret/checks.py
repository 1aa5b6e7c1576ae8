"""Tezzeret's acceptance checks: compiled-vs-eager numerics and the latency budget.

A failed check does not stop publication: the artifact is published QUARANTINED with the reason,
so the evidence stays inspectable (``esper registry show``) while nothing germinates it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from esper_core.contracts import LatencyStats
from esper_core.tezzeret.timing import Kernel

WithWeights = Callable[[dict[str, torch.Tensor] | None], Kernel]
"""Makes a fresh compiled kernel, with the given weights loaded (None: its own)."""


class NumericsMismatchError(RuntimeError):
    """A compiled kernel does not reproduce the eager module's outputs."""


def random_weights(module: nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """Deterministic random values for every floating tensor of ``module``'s state."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (
            torch.randn(value.shape, generator=generator).to(dtype=value.dtype, device=value.device)
            if value.is_floating_point()
            else value
        )
        for name, value in module.state_dict().items()
    }


def numerics_problem(
    module: nn.Module,
    with_weights: WithWeights,
    inputs: Sequence[torch.Tensor],
    *,
    rtol: float,
    atol: float,
    what: str,
) -> str | None:
    """Compare a compiled kernel with eager, on the real and on random weights.

    A neutral seed outputs zeros whatever its graph computes, so matching on the real weights
    alone would prove little: the second comparison loads the same random weights into a copy of
    each (which also proves the kernel's weights can be swapped) and compares again.

    Returns:
        None when both match, else what differs and by how much.
    """
    random_state = random_weights(module)
    probe = copy.deepcopy(module)
    probe.load_state_dict(random_state)
    for label, eager, state in (("initial weights", module, None), ("random weights", probe, random_state)):
        try:
            assert_close(eager, with_weights(state), inputs, rtol=rtol, atol=atol, what=f"{what}, {label}")
        except NumericsMismatchError as e:
            return str(e)
    return None


def assert_close(
    eager: Kernel, kernel: Kernel, inputs: Sequence[torch.Tensor], *, rtol: float, atol: float, what: str
) -> None:
    """Raise ``NumericsMismatchError`` unless ``kernel`` matches ``eager`` on every input."""
    with torch.inference_mode():
        for x in inputs:
            expected, actual = eager(x), kernel(x)
            if expected.shape != actual.shape:
                raise NumericsMismatchError(
                    f"{what}: kernel returns shape {tuple(actual.shape)} at batch {x.shape[0]}, "
                    f"eager returns {tuple(expected.shape)}"
                )
            if not torch.allclose(actual, expected, rtol=rtol, atol=atol):
                diff = (actual.float() - expected.float()).abs().max().item()
                raise NumericsMismatchError(
                    f"{what}: kernel differs from eager at batch {x.shape[0]}: max abs diff {diff:.3g} "
                    f"exceeds rtol={rtol:g}, atol={atol:g} (loosen TezzeretConfig tolerances for "
                    "low-precision dtypes)"
                )


def budget_problem(latency: Mapping[str, LatencyStats], budget_ms: float) -> str | None:
    """Which timed batch sizes exceed the median-latency budget, or None."""
    over = [f"{key} p50 {stats.p50_ms:.3f} ms" for key, stats in sorted(latency.items()) if stats.p50_ms > budget_ms]
    if not over:
        return None
    return f"latency budget {budget_ms:g} ms exceeded: {', '.join(over)}"
