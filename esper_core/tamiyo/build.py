"""Prepare a Tamiyo policy for inference: the one place performance features are applied.

Today this is eager-only (device, eval mode, a dry forward). Compilation and precision are to
be added here, in a fixed order, so that ``TamiyoGNN`` itself stays plain PyTorch.
"""

from __future__ import annotations

import torch

from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.graph import build_graph
from esper_core.tamiyo.model import TamiyoGNN
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history


def prepare_policy(model: TamiyoGNN, cfg: TamiyoConfig) -> TamiyoGNN:
    """Move the policy to its device, switch it to eval mode and run one dry forward.

    The model has no lazy layers, so the dry forward materialises nothing today; it checks that
    the model runs on ``cfg.device`` before the first real decision, and is where a compiled
    policy will be warmed up.

    Args:
        model: The policy network (modified in place).
        cfg: Service configuration; ``cfg.device`` is used.

    Returns:
        The callable to run inference with (the model itself while eager-only).
    """
    device = torch.device(cfg.device)
    model = model.to(device).eval()
    example = build_graph(synthetic_history(), synthetic_candidates())
    with torch.inference_mode():
        model(*example.inputs(device))
    return model
