"""Tamiyo: the controller that reads the run's state as a hetero graph and issues commands."""

from esper_core.tamiyo.build import prepare_policy
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.graph import (
    BLUEPRINT_DIM,
    EDGE_TYPES,
    GLOBAL_DIM,
    LAYER_DIM,
    NODE_TYPES,
    SLOT_DIM,
    TamiyoGraph,
    build_graph,
)
from esper_core.tamiyo.heuristic import HeuristicConfig, HeuristicPolicy
from esper_core.tamiyo.model import ACTION_NAMES, ACTIONS, PolicyOutput, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.service import Decision, TamiyoService

__all__ = [
    "ACTIONS",
    "ACTION_NAMES",
    "BLUEPRINT_DIM",
    "EDGE_TYPES",
    "GLOBAL_DIM",
    "LAYER_DIM",
    "NODE_TYPES",
    "SLOT_DIM",
    "BlueprintCandidate",
    "Decision",
    "HeuristicConfig",
    "HeuristicPolicy",
    "PolicyOutput",
    "TamiyoConfig",
    "TamiyoGNN",
    "TamiyoGNNConfig",
    "TamiyoGraph",
    "TamiyoService",
    "build_graph",
    "prepare_policy",
]
