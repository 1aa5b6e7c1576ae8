"""Comparing two snapshots of a run's state (``RunState.state_dict``) value by value."""

from __future__ import annotations

from typing import Any

import torch


def assert_same_state(before: Any, after: Any, path: str = "state") -> None:
    """Equal value by value: tensors bit for bit, containers key by key, the rest by ``==``."""
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor) and torch.equal(before, after), path
    elif isinstance(before, dict):
        assert isinstance(after, dict) and before.keys() == after.keys(), f"{path}: {before.keys()} != {after.keys()}"
        for key in before:
            assert_same_state(before[key], after[key], f"{path}.{key}")
    elif isinstance(before, list | tuple):
        assert type(after) is type(before) and len(after) == len(before), path
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            assert_same_state(b, a, f"{path}[{i}]")
    else:
        assert before == after, f"{path}: {before!r} != {after!r}"
