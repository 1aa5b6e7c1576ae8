"""Seeding and RNG capture in one place, so runs and retried epochs are reproducible."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """Every RNG state a training epoch can consume, in a ``torch.load(weights_only=True)``-safe form.

    Python's and NumPy's Mersenne Twister keys (~625 integers each) are held as int64 tensors:
    every commit pickles this state, and as lists of Python ints they were ~1,250 objects to
    pickle, half the cost of a small model's whole checkpoint.
    """
    version, internal, gauss = random.getstate()
    # The legacy form (the default) of the global MT19937: a tuple, never the dict form.
    kind, keys, *rest = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    state: dict[str, Any] = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), *rest],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng``; also takes the lists of integers older checkpoints hold."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(_ints(internal)), gauss))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(_ints(keys), dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _ints(keys: torch.Tensor | list[int]) -> list[int]:
    return keys.tolist() if isinstance(keys, torch.Tensor) else list(keys)
