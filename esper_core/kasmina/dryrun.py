"""One forward pass on the meta device: every shape a model produces, with no memory or compute.

Slot discovery (``graft``) and width tracing (``width.trace``) both watch such a pass.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.func import functional_call


def dry_forward(model: nn.Module, input_shape: tuple[int, ...]) -> None:
    """One forward with meta parameters, buffers and input: shapes only, nothing allocated."""
    dtype = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(())).dtype
    state = {
        k: torch.empty_like(v, device="meta")
        for k, v in itertools.chain(model.named_parameters(), model.named_buffers())
    }
    x = torch.empty(input_shape, dtype=dtype if dtype.is_floating_point else torch.float32, device="meta")
    with torch.no_grad():
        functional_call(model, state, (x,), strict=False)
