"""Tamiyo's decision service: graph, policy forward, and (until Simic trains it) the heuristic."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from esper_core.contracts import AdaptationCommand, SystemStatePacket
from esper_core.tamiyo.build import prepare_policy
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.graph import build_graph
from esper_core.tamiyo.heuristic import HeuristicPolicy
from esper_core.tamiyo.model import ACTION_NAMES, TamiyoGNN

__all__ = ["Decision", "TamiyoConfig", "TamiyoService"]

UNTRAINED_NOTE = "(GNN untrained: heuristic decides)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """One epoch's decision with what the policy saw and how long it took.

    Attributes:
        command: The command to carry out.
        gnn_latency_ms: Wall time of the policy forward, including reading its result back.
        coverage: Share of graph feature entries that were observed (see ``TamiyoGraph``).
        action_probs: The GNN's probability for each action name in ``ACTION_NAMES``.
    """

    command: AdaptationCommand
    gnn_latency_ms: float
    coverage: float
    action_probs: dict[str, float]


class TamiyoService:
    """Turns the run's state into an ``AdaptationCommand`` once per epoch.

    Args:
        config: Service configuration.
        model: A policy network to use (e.g. trained by Simic); when None a fresh
            ``TamiyoGNN(config.gnn)`` is built. ``config.gnn`` is ignored when a model is given.
    """

    def __init__(self, config: TamiyoConfig, *, model: TamiyoGNN | None = None) -> None:
        self.config = config
        self.model = model if model is not None else TamiyoGNN(config.gnn)
        self._device = torch.device(config.device)
        self._policy = prepare_policy(self.model, config)
        self.heuristic = HeuristicPolicy(config.heuristic)

    def decide(
        self,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        run_id: str,
    ) -> Decision:
        """Decide this epoch's command.

        The GNN runs on every call (so its latency and outputs are observable), but it is
        untrained, so the heuristic's command is returned, annotated with the GNN's action
        probabilities in ``command.scores`` under ``gnn.<action>``.

        Args:
            history: The run's packets, oldest first; ``history[-1]`` is the current epoch.
            candidates: Blueprints with active artifacts that may be germinated.
            run_id: Run the command belongs to.

        Returns:
            The decision.

        Raises:
            ValueError: If ``history`` is empty.
        """
        graph = build_graph(history, candidates)
        x_dict, edge_index_dict = graph.inputs(self._device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self._policy(x_dict, edge_index_dict)
            # .tolist() waits for the device, so the timing covers the whole forward.
            probs: list[float] = torch.softmax(out.action_logits[0], dim=-1).tolist()
        gnn_latency_ms = (time.perf_counter() - start) * 1e3
        action_probs = dict(zip(ACTION_NAMES, probs, strict=True))
        proposal = self.heuristic.decide(history, candidates, run_id=run_id)
        command = proposal.model_copy(
            update={
                "reason": f"{proposal.reason} {UNTRAINED_NOTE}",
                "scores": {
                    **proposal.scores,
                    **{f"gnn.{name}": p for name, p in action_probs.items()},
                },
            }
        )
        return Decision(
            command=command,
            gnn_latency_ms=gnn_latency_ms,
            coverage=graph.coverage,
            action_probs=action_probs,
        )

    def state_dict(self) -> dict[str, Any]:
        """The policy network's weights (``TamiyoGNN.state_dict``)."""
        return self.model.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[list[str], list[str]]:
        """Load policy weights into the network the service runs.

        Args:
            state_dict: Weights from ``state_dict()`` (or Simic).
            strict: Require exactly matching keys, as in ``nn.Module.load_state_dict``.

        Returns:
            ``(missing_keys, unexpected_keys)`` as from ``nn.Module.load_state_dict``.
        """
        return self.model.load_state_dict(state_dict, strict=strict)
