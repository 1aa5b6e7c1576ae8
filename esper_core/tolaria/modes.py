"""Eval mode for a block of measurements, switched once.

``nn.Module.train()`` walks every submodule through ``__setattr__`` (~21 us on the 12-module
digits MLP, one thread). An epoch's end used to switch to eval and back around each of its
measurements (validation, the gate probes, the growth signals): eight walks an epoch. Inside one
``eval_mode`` block the nested ones find the model in eval mode already and do not switch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run the block with ``model`` in eval mode, and leave it in the mode it was in.

    A model already in eval mode is not switched at all (nor back).
    """
    if not model.training:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train()
