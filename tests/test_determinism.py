"""RNG capture: a state saved in a checkpoint brings back the same draws, in today's form and in
the lists of integers older checkpoints hold."""

from __future__ import annotations

import io
import random

import numpy as np
import torch

from esper_core.determinism import capture_rng, restore_rng, seed_everything


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _through_checkpoint(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_a_captured_state_replays_the_same_draws_after_a_checkpoint_round_trip() -> None:
    seed_everything(7)
    _draws()
    saved = _through_checkpoint(capture_rng())
    expected = _draws()
    seed_everything(99)
    restore_rng(saved)
    assert _draws() == expected


def test_a_state_from_an_older_checkpoint_with_integer_lists_still_restores() -> None:
    seed_everything(3)
    version, internal, gauss = random.getstate()
    kind, keys, *rest = np.random.get_state()
    old = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), *rest],
        "torch": torch.get_rng_state(),
    }
    old = _through_checkpoint(old)
    expected = _draws()
    seed_everything(4)
    restore_rng(old)
    assert _draws() == expected
