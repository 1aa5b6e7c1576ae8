"""Configuration of the Tamiyo service: policy network, heuristic thresholds, device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.tamiyo.model import TamiyoGNNConfig


@dataclass(kw_only=True, slots=True)
class TamiyoConfig:
    """Everything ``TamiyoService`` needs to know.

    Attributes:
        gnn: Size of the policy network (used when the service builds its own model).
        heuristic: Thresholds of the rule-based policy that decides until the GNN is trained.
        device: Torch device the policy runs on, e.g. ``"cpu"`` or ``"cuda:0"``.
    """

    gnn: TamiyoGNNConfig = field(default_factory=TamiyoGNNConfig)
    heuristic: HeuristicConfig = field(default_factory=HeuristicConfig)
    device: str = "cpu"

    def __post_init__(self) -> None:
        try:
            device = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"device {self.device!r} is not a torch device: use 'cpu' or 'cuda[:index]'") from e
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"device {self.device!r} was requested but CUDA is not available here: "
                "set device='cpu' or run on a machine with a CUDA build of torch and a GPU"
            )
