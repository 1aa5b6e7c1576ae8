"""Tamiyo's decision service: graph, policy forward, the deciding policy, the risk engine, the breaker.

One call per epoch. The GNN runs on every call (its latency, action probabilities, value and
predicted risk are always observable); who decides is ``TamiyoConfig.policy``: the heuristic
(default until Simic has trained a policy), the GNN, random, periodic or scheduled germination, or
nobody. Every proposal then passes the risk engine. ``decide_safely`` adds the circuit breaker: an error
counts as a failure and the epoch gets the safe command (WAIT) instead of an exception.

When the GNN does not decide, its forward is side work (shadow scoring): ``decide(...,
shadow=False)`` leaves it out and ``add_shadow`` adds it afterwards, so a caller's deadline
covers only the policy that decides, and a slow shadow forward (a busy machine, a compile
warming up) can never turn the heuristic's command into a timeout WAIT.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_core.contracts import (
    AdaptationCommand,
    CommandType,
    FieldReport,
    SeedOperation,
    SystemStatePacket,
)
from esper_core.tamiyo.actions import Choice, choose, legal_masks
from esper_core.tamiyo.baselines import (
    PeriodicGrowthPolicy,
    RandomGerminationPolicy,
    ScheduledGrowthPolicy,
    decision_seed,
    no_growth,
)
from esper_core.tamiyo.breaker import CircuitBreaker
from esper_core.tamiyo.build import PreparedPolicy, prepare_policy
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.graph import TamiyoGraph, build_graph
from esper_core.tamiyo.heuristic import HeuristicPolicy
from esper_core.tamiyo.model import ACTION_NAMES, ACTIONS, BLEND_SCHEDULES, PolicyOutput, TamiyoGNN, untrained_policy
from esper_core.tamiyo.risk import RiskContext, RiskEngine, merged_growth

__all__ = ["BREAKER_ISSUER", "SHADOW_NOTE", "Decision", "TamiyoConfig", "TamiyoService"]

log = logging.getLogger(__name__)

SHADOW_NOTE = "(heuristic decides; GNN in shadow)"
BREAKER_ISSUER = "tamiyo.breaker"
BREAKER_RULE = "circuit_breaker"


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """One epoch's decision with what the policy saw and how long it took.

    Attributes:
        command: The command to carry out (after the risk engine).
        proposal: The deciding policy's own command, before the risk engine.
        policy: Who proposed: ``heuristic``, ``gnn``, ``random``, ``periodic``, ``scheduled``, ``none`` or ``tamiyo.breaker``.
        policy_version: Version of the GNN weights served, if any were loaded.
        gnn_latency_ms: Wall time of the policy forward, including reading its result back.
        coverage: Share of graph feature entries that were observed (see ``TamiyoGraph``).
        missing: Features that were not observed (``<node type>.<feature>``).
        action_probs: The GNN's probability for each action name in ``ACTION_NAMES``.
        value: The GNN's value estimate of the state.
        predicted_risk: The GNN's predicted probability that the proposal regresses the run.
        log_prob: log-probability of the GNN's proposal (GNN policy only; Simic's PPO uses it).
        risk_rules: Risk-engine rules that vetoed or downgraded the proposal.
        compiled: Whether this forward ran the compiled policy.
        compile_enabled: Whether the compiled policy is ready (1) or eager serves (0).
        compile_fallbacks: Compile fallbacks since the previous decision (a counter increment).
        param_budget: Parameters all active seeds could hold at this epoch (the graph's budget
            feature; ``RiskConfig.seed_param_limit``), recorded so Simic rebuilds the same graph.
        fallback: Why the heuristic decided in place of the shipped policy (``policy="shipped"``
            whose weights could not be served); None when the configured policy decided.
    """

    command: AdaptationCommand
    proposal: AdaptationCommand
    policy: str
    policy_version: str | None = None
    gnn_latency_ms: float = 0.0
    coverage: float = 0.0
    missing: tuple[str, ...] = ()
    action_probs: dict[str, float] | None = None
    value: float | None = None
    predicted_risk: float | None = None
    log_prob: float | None = None
    risk_rules: tuple[str, ...] = ()
    compiled: bool = False
    compile_enabled: bool = False
    compile_fallbacks: int = 0
    param_budget: int | None = None
    fallback: str | None = None


class TamiyoService:
    """Turns the run's state into an ``AdaptationCommand`` once per epoch.

    Args:
        config: Service configuration.
        model: A policy network to use (e.g. trained by Simic); when None an untrained one
            (``untrained_policy(config.gnn)``, which leaves the run's random state alone).
            ``config.gnn`` is ignored when a model is given.
        cache_dir: Compiler cache directory for a compiled policy (``<ESPER_HOME>/cache/inductor``).
    """

    def __init__(self, config: TamiyoConfig, *, model: TamiyoGNN | None = None, cache_dir: Path | None = None) -> None:
        self.config = config
        self.model = model if model is not None else untrained_policy(config.gnn)
        self.policy: PreparedPolicy = prepare_policy(self.model, config, cache_dir=cache_dir)
        self.heuristic = HeuristicPolicy(config.heuristic)
        self.random = RandomGerminationPolicy(config.random, self.heuristic)
        self.periodic = PeriodicGrowthPolicy(config.periodic, self.heuristic)
        self.scheduled = ScheduledGrowthPolicy(config.schedule, self.heuristic)
        self.risk = RiskEngine(config.risk)
        self.breaker = CircuitBreaker(config.breaker)
        self.policy_version: str | None = None
        self.shipped_refused: str | None = None
        """Why the shipped policy cannot serve (set by ``simic.serving``); None: not refused."""
        self._reported_fallbacks = 0

    def decide(
        self,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        run_id: str,
        reports: Sequence[FieldReport] = (),
        total_epochs: int | None = None,
        shadow: bool = True,
    ) -> Decision:
        """Decide this epoch's command (errors propagate; see ``decide_safely``).

        Args:
            history: The run's packets, oldest first; ``history[-1]`` is the current epoch.
            candidates: Blueprints with active artifacts that may be germinated.
            run_id: Run the command belongs to.
            reports: The run's field reports so far (the risk engine reads them).
            total_epochs: Length of the run (the graph's ``progress`` feature).
            shadow: Run the GNN's shadow scoring now when another policy decides; False leaves
                it to ``add_shadow`` (callers that hold the decision to a deadline).

        Returns:
            The decision.

        Raises:
            ValueError: If ``history`` is empty.
        """
        graph = self.graph(history, candidates, total_epochs=total_epochs)
        policy = self.config.policy
        fallback = None
        if policy == "shipped":
            # The shipped weights decide once served; until then (refused, or never loaded) the
            # rule does, and the decision says why: a run must never pass untrained weights, or
            # the rule, off as the shipped policy.
            if self.policy_version is not None:
                policy = "gnn"
            else:
                policy = "heuristic"
                fallback = self.shipped_refused or f"shipped policy {self.config.shipped!r} was not loaded"
        scores: _Scores | None = None
        log_prob = None
        if policy == "gnn":
            scores = self._score(graph)
            out = scores.out
            choice = choose(
                out,
                legal_masks(history[-1], candidates),
                sample=self.config.explore,
                generator=_generator(run_id, history[-1].epoch),
            )
            proposal = self._gnn_command(graph, choice, out, history[-1], run_id)
            log_prob = choice.log_prob
        elif policy == "heuristic":
            proposal = self.heuristic.decide(history, candidates, run_id=run_id, total_epochs=total_epochs)
        elif policy == "random":
            proposal = self.random.decide(history, candidates, run_id=run_id)
        elif policy == "periodic":
            proposal = self.periodic.decide(history, candidates, run_id=run_id)
        elif policy == "scheduled":
            proposal = self.scheduled.decide(history, candidates, run_id=run_id)
        else:
            proposal = no_growth(history, run_id=run_id)
        verdict = self.risk.review(
            proposal,
            RiskContext(
                history=history,
                candidates=candidates,
                reports=reports,
                predicted_risk=scores.predicted_risk if scores is not None else None,
                total_epochs=total_epochs,
            ),
        )
        decision = Decision(
            command=verdict.command,
            proposal=proposal,
            policy=policy,
            policy_version=self.policy_version,
            coverage=graph.coverage,
            missing=graph.missing,
            log_prob=log_prob,
            risk_rules=verdict.rules,
            param_budget=self.param_budget(history),
            fallback=fallback,
        )
        if scores is not None:
            return self._with_scores(decision, scores)
        return self.add_shadow(decision, history, candidates, total_epochs=total_epochs) if shadow else decision

    def add_shadow(
        self,
        decision: Decision,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        total_epochs: int | None = None,
    ) -> Decision:
        """``decision`` with the GNN's shadow scores (when another policy decided it).

        The heuristic's command and proposal also carry the GNN's action probabilities
        (``gnn.<action>`` scores) and ``SHADOW_NOTE``. Decisions the GNN made, or that already
        carry scores, and the breaker's fallback decisions are returned unchanged.

        Args:
            decision: From ``decide(..., shadow=False)`` for the same ``history`` and ``candidates``.
            history: The run's packets, oldest first.
            candidates: Blueprints that could be germinated.
            total_epochs: Length of the run.

        Returns:
            The decision with ``action_probs``, ``value``, ``predicted_risk``, ``gnn_latency_ms``
            and the compile state filled in (unchanged, and the error logged, if the forward fails).
        """
        if decision.action_probs is not None or decision.policy not in ("heuristic", "random", "none"):
            return decision
        try:
            scores = self._score(self.graph(history, candidates, total_epochs=total_epochs))
        # Side work: a failing shadow forward must not change (or stop) the decision it annotates.
        except Exception:  # noqa: BLE001
            log.exception(
                "Tamiyo's shadow GNN scoring failed; the %s decision stands without GNN scores", decision.policy
            )
            return decision
        decision = self._with_scores(decision, scores)
        if decision.policy != "heuristic":
            return decision
        update = {"reason": f"{{}} {SHADOW_NOTE}", "scores": {f"gnn.{n}": p for n, p in scores.action_probs.items()}}
        return dataclasses.replace(
            decision,
            command=_annotated(decision.command, update),
            proposal=_annotated(decision.proposal, update),
        )

    def graph(
        self,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        total_epochs: int | None = None,
    ) -> TamiyoGraph:
        """The graph the policy reads for ``history[-1]``, with this service's parameter budget.

        Args:
            history: The run's packets, oldest first.
            candidates: Blueprints that could be germinated.
            total_epochs: Length of the run.

        Returns:
            ``build_graph``'s graph.
        """
        return build_graph(history, candidates, total_epochs=total_epochs, param_budget=self.param_budget(history))

    def param_budget(self, history: Sequence[SystemStatePacket]) -> int | None:
        """Parameters all active seeds may hold at ``history[-1]`` (None for an empty history):
        the risk engine's limit for the run's starting host, less what merged width seeds grew."""
        if not history:
            return None
        return self.config.risk.seed_param_limit(history[0].host_params) - merged_growth(history)

    def _score(self, graph: TamiyoGraph) -> _Scores:
        x_dict, edge_index_dict = self.policy.inputs(graph)
        start = time.perf_counter()
        out = self.policy(x_dict, edge_index_dict)
        # .tolist() waits for the device, so the timing covers the whole forward.
        probs: list[float] = torch.softmax(out.action_logits[0].float(), dim=-1).tolist()
        latency_ms = (time.perf_counter() - start) * 1e3
        return _Scores(
            out=out,
            action_probs=dict(zip(ACTION_NAMES, probs, strict=True)),
            value=float(out.value[0]),
            predicted_risk=float(out.risk[0]),
            latency_ms=latency_ms,
            compiled=self.policy.last_call_compiled,
        )

    def _with_scores(self, decision: Decision, scores: _Scores) -> Decision:
        fallbacks = self.policy.fallback_total - self._reported_fallbacks
        self._reported_fallbacks = self.policy.fallback_total
        return dataclasses.replace(
            decision,
            gnn_latency_ms=scores.latency_ms,
            action_probs=scores.action_probs,
            value=scores.value,
            predicted_risk=scores.predicted_risk,
            compiled=scores.compiled,
            compile_enabled=self.policy.compile_enabled,
            compile_fallbacks=fallbacks,
        )

    def decide_safely(
        self,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        run_id: str,
        reports: Sequence[FieldReport] = (),
        total_epochs: int | None = None,
    ) -> Decision:
        """``decide`` behind the circuit breaker: never raises for a failing policy.

        While the breaker is open Tamiyo is not asked; an error is recorded as a failure (and
        logged); both give ``fallback_decision``. Deadlines are the caller's: on a timeout call
        ``breaker.record_failure(...)`` and use ``fallback_decision`` yourself.

        Raises:
            ValueError: If ``history`` is empty (a caller bug, not a policy failure).
        """
        if not history:
            raise ValueError("history is empty: pass at least the current epoch's packet")
        if not self.breaker.allow():
            why = f"circuit breaker open ({self.breaker.consecutive_failures} consecutive failures, last: {self.breaker.last_failure})"
            return self.fallback_decision(history, run_id=run_id, reason=why)
        try:
            decision = self.decide(history, candidates, run_id=run_id, reports=reports, total_epochs=total_epochs)
        # Any failure of graph building, the policy or the risk engine must not stop training.
        except Exception as e:  # noqa: BLE001
            self.breaker.record_failure(f"{type(e).__name__}: {e}")
            log.exception("Tamiyo failed to decide epoch %d of %s; waiting this epoch", history[-1].epoch, run_id)
            return self.fallback_decision(history, run_id=run_id, reason=f"Tamiyo failed: {type(e).__name__}: {e}")
        self.breaker.record_success()
        return decision

    def fallback_decision(self, history: Sequence[SystemStatePacket], *, run_id: str, reason: str) -> Decision:
        """The safe decision (WAIT) used when Tamiyo errs, times out, or the breaker is open.

        Args:
            history: The run's packets (the command is for ``history[-1].epoch``).
            run_id: Run the command belongs to.
            reason: Why Tamiyo was not (successfully) asked.

        Returns:
            A WAIT decision with ``issued_by="tamiyo.breaker"`` and ``risk_rule="circuit_breaker"``.
        """
        command = AdaptationCommand(
            run_id=run_id,
            epoch=history[-1].epoch,
            command_type=CommandType.WAIT,
            issued_by=BREAKER_ISSUER,
            reason=f"wait: {reason} (breaker {self.breaker.state.value})",
            risk_rule=BREAKER_RULE,
        )
        return Decision(command=command, proposal=command, policy=BREAKER_ISSUER, risk_rules=(BREAKER_RULE,))

    def swap_policy(self, state_dict: Mapping[str, Any], *, version: str) -> None:
        """Serve new GNN weights from the next decision on (between epochs; compiled code stays valid).

        Args:
            state_dict: Weights of a ``TamiyoGNN`` of the same size.
            version: Their version label (e.g. Simic's ``policy-v3``), reported with each decision.
        """
        self.policy.load_state_dict(dict(state_dict))
        self.policy_version = version

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

    def close(self) -> None:
        """Stop the background compiler (its current job finishes first)."""
        self.policy.close(timeout=60.0)

    def _gnn_command(
        self, graph: TamiyoGraph, choice: Choice, out: PolicyOutput, current: SystemStatePacket, run_id: str
    ) -> AdaptationCommand:
        ctype, op = ACTIONS[choice.action]
        slot_id = graph.slot_ids[choice.slot] if choice.slot >= 0 else None
        blueprint_id = graph.blueprint_ids[choice.blueprint] if choice.blueprint >= 0 else None
        fields: dict[str, Any] = {}
        what = ACTION_NAMES[choice.action]
        if op is SeedOperation.GERMINATE:
            schedule = BLEND_SCHEDULES[choice.blend]
            fields = {
                "blueprint_id": blueprint_id,
                "blend_schedule": schedule,
                "blend_epochs": self.heuristic.config.blend_epochs,
            }
            what = f"germinate {blueprint_id} into {slot_id} ({schedule.value} blend)"
        elif op is not None:
            what = f"{op.value} {slot_id}"
        elif ctype is CommandType.OPTIMIZER:
            fields = {"lr_scale": choice.lr_scale}
            what = f"scale the learning rate by {choice.lr_scale:.3g}"
        version = self.policy_version or "untrained"
        mode = "sampled" if self.config.explore else "argmax"
        return AdaptationCommand(
            run_id=run_id,
            epoch=current.epoch,
            command_type=ctype,
            seed_operation=op,
            slot_id=slot_id,
            issued_by=f"gnn:{version}",
            reason=(
                f"{what}: GNN {version} ({mode}) log-prob {choice.log_prob:.3f}, "
                f"value {float(out.value[0]):.3g}, predicted risk {float(out.risk[0]):.2f}"
            ),
            scores={
                **{
                    f"gnn.{n}": p
                    for n, p in zip(ACTION_NAMES, torch.softmax(out.action_logits[0].float(), -1).tolist(), strict=True)
                },
                "gnn.value": float(out.value[0]),
                "gnn.risk": float(out.risk[0]),
                "gnn.log_prob": choice.log_prob,
            },
            **fields,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Scores:
    """One GNN forward as a decision reports it."""

    out: PolicyOutput
    action_probs: dict[str, float]
    value: float
    predicted_risk: float
    latency_ms: float
    compiled: bool


def _annotated(command: AdaptationCommand, update: dict[str, Any]) -> AdaptationCommand:
    """``command`` with the shadow note appended to its reason and the GNN's scores added."""
    return command.model_copy(
        update={"reason": update["reason"].format(command.reason), "scores": {**command.scores, **update["scores"]}}
    )


def _generator(run_id: str, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(decision_seed(run_id, epoch, "gnn"))
