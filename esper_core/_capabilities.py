"""Probe device capabilities once, in one place, and say what was chosen.

Everything that branches on CUDA availability asks this module, so tests can force each path
and the resolved choice is logged once at start-up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Literal, get_args

import torch

log = logging.getLogger(__name__)

Device = Literal["auto", "cpu", "cuda"]
"""A device request: ``auto`` picks CUDA when present, else CPU."""

DEVICE_CHOICES: tuple[str, ...] = get_args(Device)


def cuda_available() -> bool:
    """True when a CUDA device can be used by this process."""
    return torch.cuda.is_available()


def resolve_device(requested: str) -> torch.device:
    """Turn ``auto`` / ``cpu`` / ``cuda`` into a device, refusing an impossible request.

    Args:
        requested: ``auto`` picks CUDA when present, else CPU.

    Returns:
        The device to run on.

    Raises:
        ValueError: for an unknown name, or ``cuda`` on a machine without a CUDA device.
    """
    if requested not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {requested!r}")
    if requested == "cuda" and not cuda_available():
        raise ValueError(
            "device 'cuda' was requested but torch sees no CUDA device "
            f"(torch {torch.__version__}); use --device cpu or --device auto"
        )
    if requested == "auto":
        requested = "cuda" if cuda_available() else "cpu"
    device = torch.device(requested)
    _log_choice(str(device))
    return device


@functools.cache
def _log_choice(device: str) -> None:
    log.info("esper device: %s (torch %s)", device, torch.__version__)


RECOMPILE_LIMIT = 64
"""Graphs Dynamo may compile per function before it runs that function eagerly (its default: 8)."""


@functools.cache
def initialise_pytorch_defaults() -> None:
    """Set float32 matmul precision and TF32 once per process (seed 000, change 3), and make
    compiled code see module hooks.

    On CPU the precision setting is harmless; TF32 flags only matter on CUDA, so they are set
    only when a CUDA device is present.

    Dynamo leaves hooks out of a compiled graph's guards by default
    (``skip_nnmodule_hook_guards``): a hook added after the compile is silently not run. Kasmina
    grows a layer's width through hooks (``WidthSlot``), so with that default a compiled training
    step kept running the network as it was before the seed: the seed got no gradient, G1
    culled it, and width growth never happened (found by counting the step's traces,
    ``tolaria.compile.traces``). With the guards, a hook added or removed re-traces the step once.

    Each growth event (a seed in, each of its stage changes, its merge) is a new graph for the
    step, two with an epoch's short last batch, so Dynamo's default limit of 8 graphs per function
    was reached by the first merge, after which the step silently ran eagerly for the rest of the
    run. 64 leaves room for a run's growth; past it Dynamo still falls back to eager, correctly.
    """
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    torch.set_float32_matmul_precision("high")
    if cuda_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log.info("matmul precision 'high'; TF32 %s", "on" if cuda_available() else "n/a (no CUDA)")


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one torch intra-op thread, then restore the process's setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
