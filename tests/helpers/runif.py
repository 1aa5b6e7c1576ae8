"""One place that says why a test is skipped on this machine."""

from __future__ import annotations

import pytest
import torch


def requires_cuda(reason: str = "") -> pytest.MarkDecorator:
    """Skip unless a CUDA device is present; the reason says what the test needs it for."""
    why = "needs a CUDA device" + (f": {reason}" if reason else "")
    return pytest.mark.skipif(not torch.cuda.is_available(), reason=why)


def devices() -> list[str]:
    """Devices a ``device`` parametrisation runs on: CPU always, CUDA when present."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
