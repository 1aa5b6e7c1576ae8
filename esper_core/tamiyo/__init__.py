"""Tamiyo: the controller that reads the run's state as a hetero graph and issues commands."""

from typing import TYPE_CHECKING

from esper_core._lazy import lazy_exports

if TYPE_CHECKING:
    from esper_core.tamiyo.actions import ActionMasks, Choice, choose, legal_masks
    from esper_core.tamiyo.breaker import BreakerConfig, BreakerState, CircuitBreaker
    from esper_core.tamiyo.build import PreparedPolicy, prepare_policy
    from esper_core.tamiyo.candidates import BlueprintCandidate
    from esper_core.tamiyo.config import (
        POLICIES,
        PeriodicPolicyConfig,
        PolicyCompileConfig,
        RandomPolicyConfig,
        ScheduledGermination,
        TamiyoConfig,
    )
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
    from esper_core.tamiyo.risk import RiskConfig, RiskContext, RiskEngine, RiskVerdict
    from esper_core.tamiyo.service import Decision, TamiyoService

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "esper_core.tamiyo.actions": ("ActionMasks", "Choice", "choose", "legal_masks"),
        "esper_core.tamiyo.breaker": ("BreakerConfig", "BreakerState", "CircuitBreaker"),
        "esper_core.tamiyo.build": ("PreparedPolicy", "prepare_policy"),
        "esper_core.tamiyo.candidates": ("BlueprintCandidate",),
        "esper_core.tamiyo.config": (
            "POLICIES",
            "PeriodicPolicyConfig",
            "PolicyCompileConfig",
            "RandomPolicyConfig",
            "ScheduledGermination",
            "TamiyoConfig",
        ),
        "esper_core.tamiyo.graph": (
            "BLUEPRINT_DIM",
            "EDGE_TYPES",
            "GLOBAL_DIM",
            "LAYER_DIM",
            "NODE_TYPES",
            "SLOT_DIM",
            "TamiyoGraph",
            "build_graph",
        ),
        "esper_core.tamiyo.heuristic": ("HeuristicConfig", "HeuristicPolicy"),
        "esper_core.tamiyo.model": ("ACTION_NAMES", "ACTIONS", "PolicyOutput", "TamiyoGNN", "TamiyoGNNConfig"),
        "esper_core.tamiyo.risk": ("RiskConfig", "RiskContext", "RiskEngine", "RiskVerdict"),
        "esper_core.tamiyo.service": ("Decision", "TamiyoService"),
    },
)

__all__ = [
    "ACTIONS",
    "ACTION_NAMES",
    "BLUEPRINT_DIM",
    "EDGE_TYPES",
    "GLOBAL_DIM",
    "LAYER_DIM",
    "NODE_TYPES",
    "POLICIES",
    "SLOT_DIM",
    "ActionMasks",
    "BlueprintCandidate",
    "BreakerConfig",
    "BreakerState",
    "Choice",
    "CircuitBreaker",
    "Decision",
    "HeuristicConfig",
    "HeuristicPolicy",
    "PolicyCompileConfig",
    "PolicyOutput",
    "PreparedPolicy",
    "PeriodicPolicyConfig",
    "RandomPolicyConfig",
    "RiskConfig",
    "RiskContext",
    "RiskEngine",
    "RiskVerdict",
    "ScheduledGermination",
    "TamiyoConfig",
    "TamiyoGNN",
    "TamiyoGNNConfig",
    "TamiyoGraph",
    "TamiyoService",
    "build_graph",
    "choose",
    "legal_masks",
    "prepare_policy",
]
