"""One forward pass on the meta device: every shape a model produces, with no memory or compute.

Slot discovery (``graft``) and width tracing (``width.trace``) both watch such a pass.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.func import functional_call


def dry_forward(model: nn.Module, input_shape: tuple[int, ...], input_dtype: torch.dtype = torch.float32) -> object:
    """One forward with meta parameters, buffers and input: shapes only, nothing allocated.
    Returns what the model returned (meta tensors).

    Raises:
        ValueError: the user's forward failed on such an input; the message says what it got.
    """
    dtype = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(())).dtype
    state = {
        k: torch.empty_like(v, device="meta")
        for k, v in itertools.chain(model.named_parameters(), model.named_buffers())
    }
    if input_dtype.is_floating_point and dtype.is_floating_point:
        # Float inputs follow the model's parameters (a float64 or bfloat16 model).
        input_dtype = dtype
    x = torch.empty(input_shape, dtype=input_dtype, device="meta")
    with torch.no_grad():
        try:
            return functional_call(model, state, (x,), strict=False)
        except (RuntimeError, TypeError, IndexError) as e:
            raise ValueError(
                f"the model's forward failed on a {tuple(input_shape)} {input_dtype} input ({type(e).__name__}: "
                f"{e}); check the data's sample shape, and give ModelSpec(input_dtype=torch.long) to a model "
                "that takes token ids"
            ) from e
