"""What a decision says in telemetry: the catalogued ``tamiyo.*`` metrics and command attributes."""

from __future__ import annotations

from esper_core.contracts import AdaptationCommand, MetricPoint
from esper_core.contracts.messages import Scalar
from esper_core.tamiyo.breaker import CircuitBreaker
from esper_core.tamiyo.service import Decision


def decision_metrics(decision: Decision) -> list[MetricPoint]:
    """Policy latency, graph coverage and the compile state of one decision.

    ``tamiyo.gnn.compile_fallback_total`` is a counter: each packet carries the fallbacks since
    the previous decision, which Prometheus adds up.
    """
    return [
        MetricPoint(name="tamiyo.gnn.inference.latency_ms", value=decision.gnn_latency_ms, unit="ms"),
        MetricPoint(name="tamiyo.graph.coverage", value=decision.coverage),
        MetricPoint(name="tamiyo.gnn.compile_enabled", value=1.0 if decision.compile_enabled else 0.0),
        MetricPoint(name="tamiyo.gnn.compile_fallback_total", value=float(decision.compile_fallbacks)),
    ]


def command_attributes(
    command: AdaptationCommand, decision: Decision | None, breaker: CircuitBreaker
) -> dict[str, Scalar]:
    """Attributes of the ``tamiyo.command`` event: who proposed, what the risk engine changed."""
    attributes: dict[str, Scalar] = {
        "action": command.action,
        "issued_by": command.issued_by,
        "risk_rule": command.risk_rule or "",
        "breaker": breaker.state.value,
    }
    if decision is not None:
        attributes["policy"] = decision.policy
        attributes["proposal"] = decision.proposal.action
        attributes["compiled"] = decision.compiled
        if decision.policy_version is not None:
            attributes["policy_version"] = decision.policy_version
    return attributes
