"""The records Simic learns from, and their JSON forms: what Tamiyo saw and did, and policy versions.

Plain values: ``DecisionState`` and ``CounterfactualOutcome`` round-trip through JSON (the form
the registry database stores), ``DecisionRecord`` is one decision with what it led to, and
``PolicyVersion`` describes stored weights and refuses ones trained on other graph inputs.
``esper_core.simic.records.SimicStore`` writes and reads them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from esper_core.contracts import AdaptationCommand, SystemStatePacket
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.graph import FEATURE_DIMS, FEATURE_NAMES, TREND_WINDOW
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNNConfig
from esper_core.tamiyo.service import Decision

BITS_WORTH = 0.5
"""Validation accuracy (a fraction) that one bit per token of validation loss is worth where a
run's accuracy means nothing (a language model): 0.01 bits for half a point, the exchange rate of
the transfer benchmark's goal. With ``flops_penalty = 0.01`` a doubling of training compute costs
as much as 0.02 bits."""


def validation_quality(*, accuracy: float, loss: float, classifies: bool) -> float:
    """What Simic's rewards and the zoo's selection scores read of a validation split: its
    accuracy (a fraction) for class targets; otherwise (a language model, whose accuracy is 0)
    ``-BITS_WORTH`` times its loss in bits per token (``loss`` in nats). A run with real-valued
    targets is read the same way, its loss in nats taken as bits' worth: the sign is right, the
    scale is its targets' units."""
    return accuracy if classifies else -BITS_WORTH * loss / math.log(2)


_REPORT_NAMESPACE = uuid.UUID("8f5b8f5e-3c3a-4c1e-9a53-5e51c0f1e9a1")


def report_id_for(command: AdaptationCommand) -> str:
    """The id of ``command``'s field report: derived from its command id, so re-judging the same
    command (a retried epoch) yields the same report and the same row."""
    return uuid.uuid5(_REPORT_NAMESPACE, command.command_id).hex


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionState:
    """What Tamiyo saw: enough to rebuild the graph with any later version of the builder.

    Attributes:
        history: The last ``TREND_WINDOW`` packets, oldest first.
        candidates: The blueprint candidates, in node order.
        total_epochs: Length of the run, if known.
        param_budget: Parameters the active seeds could hold (``Decision.param_budget``); None
            in states recorded before it was (the graph's budget feature stays unobserved).
        task: The varied task the run trained on (``EpisodeTask.to_dict()``: width, training
            fraction, label noise, seed), None for the recipe's own task. Provenance, not a
            graph input: the policy must infer the task from what the run shows it.
    """

    history: tuple[SystemStatePacket, ...]
    candidates: tuple[BlueprintCandidate, ...]
    total_epochs: int | None
    param_budget: int | None = None
    task: dict[str, Any] | None = None

    @property
    def current(self) -> SystemStatePacket:
        """The packet of the decided epoch."""
        return self.history[-1]

    def to_json(self) -> str:
        """JSON text ``from_json`` reads back."""
        data: dict[str, Any] = {
            "history": [json.loads(p.to_json()) for p in self.history],
            "candidates": [c.to_dict() for c in self.candidates],
            "total_epochs": self.total_epochs,
            "param_budget": self.param_budget,
        }
        if self.task is not None:  # absent, not null: the recipe's own task writes what it always did
            data["task"] = self.task
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> DecisionState:
        """The state ``to_json`` wrote."""
        data = json.loads(text)
        return cls(
            history=tuple(SystemStatePacket.model_validate(p) for p in data["history"]),
            candidates=tuple(BlueprintCandidate.from_dict(c) for c in data["candidates"]),
            total_epochs=data["total_epochs"],
            param_budget=data.get("param_budget"),
            task=data.get("task"),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CounterfactualOutcome:
    """Two branches of a run forked at a decision, measured ``horizon`` epochs later.

    Branch A carried out the decided command, branch B the ``baseline``'s; both then trained
    under the same lifecycle-only control (``esper_core.studies.counterfactual``), so only the
    decision at the fork differs. The raw measurements are stored, not a reward: lambda is
    Simic's hyperparameter (``SimicConfig.param_penalty``) and may change after recording.

    Attributes:
        baseline: What branch B did at the fork: ``wait`` or ``heuristic``.
        baseline_action: The action branch B carried out (``AdaptationCommand.action``).
        horizon: Epochs each branch trained after the fork.
        val_accuracy: Branch A's validation accuracy after the horizon.
        baseline_val_accuracy: Branch B's.
        val_loss: Branch A's validation loss after the horizon.
        baseline_val_loss: Branch B's.
        params: Branch A's parameters (host plus attached seeds) after the horizon.
        baseline_params: Branch B's.
        host_params: The host's parameters at the fork.
        fork_ms: Wall time of the fork: both branches and the restores.
        classifies: Whether the accuracies mean anything (``SystemStatePacket.classifies``);
            False for a language model, whose branches are compared by their losses.
    """

    baseline: str
    baseline_action: str
    horizon: int
    val_accuracy: float
    baseline_val_accuracy: float
    val_loss: float
    baseline_val_loss: float
    params: int
    baseline_params: int
    host_params: int
    fork_ms: float
    classifies: bool = True

    def reward(self, *, param_penalty: float) -> float:
        """Validation quality gained over the baseline (``validation_quality``: accuracy, or a
        language model's bits) minus lambda times the parameters added over it, in host-sized
        blocks: ``q_A - q_B - lambda * (params_A - params_B) / host_params``."""
        added = (self.params - self.baseline_params) / max(self.host_params, 1)
        a = validation_quality(accuracy=self.val_accuracy, loss=self.val_loss, classifies=self.classifies)
        b = validation_quality(
            accuracy=self.baseline_val_accuracy, loss=self.baseline_val_loss, classifies=self.classifies
        )
        return (a - b) - param_penalty * added

    def to_json(self) -> str:
        """JSON text ``from_json`` reads back."""
        return json.dumps({name: getattr(self, name) for name in self.__slots__}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CounterfactualOutcome:
        """The outcome ``to_json`` wrote."""
        return cls(**json.loads(text))


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionRecord:
    """One applied decision as Simic stores it.

    Attributes:
        command: The executed command (after the risk engine).
        proposal: What the deciding policy proposed.
        policy: Who proposed (``heuristic``, ``gnn``, ``random``, ``none``, ``tamiyo.breaker``).
        policy_version: GNN weights version served, if any.
        state: What Tamiyo saw.
        log_prob: log-probability of the proposal under the GNN (GNN decisions only).
        value: The GNN's value estimate of the state.
        counterfactual: The outcome of forking the run at this decision, if it was forked.
    """

    command: AdaptationCommand
    proposal: AdaptationCommand
    policy: str
    policy_version: str | None
    state: DecisionState
    log_prob: float | None = None
    value: float | None = None
    counterfactual: CounterfactualOutcome | None = None

    @classmethod
    def from_decision(
        cls,
        decision: Decision,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        total_epochs: int | None,
        task: dict[str, Any] | None = None,
    ) -> DecisionRecord:
        """The record of ``decision``, made on ``history`` and ``candidates`` (in a run of ``task``)."""
        return cls(
            command=decision.command,
            proposal=decision.proposal,
            policy=decision.policy,
            policy_version=decision.policy_version,
            state=DecisionState(
                history=tuple(history[-TREND_WINDOW:]),
                candidates=tuple(candidates),
                total_epochs=total_epochs,
                param_budget=decision.param_budget,
                task=task,
            ),
            log_prob=decision.log_prob,
            value=decision.value,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyVersion:
    """One stored policy version (weights in the blob store).

    Attributes:
        version: 1, 2, ... in publication order.
        parent_version: The version training started from, if any.
        method: How it was trained (``imitation``, ``ppo``, ...).
        sha256: Blob of its ``state_dict``.
        size_bytes: Size of that blob.
        gnn: Network size (must match the serving ``TamiyoGNN``).
        feature_dims: Graph feature widths it was trained on.
        provenance: Training data, configuration and metrics.
        created_at: Publication time (UTC).
        signature: HMAC over weights and descriptor (``policy_signing``); None: unsigned.
        signature_key_id: Id of the key that made it.
    """

    version: int
    parent_version: int | None
    method: str
    sha256: str
    size_bytes: int
    gnn: TamiyoGNNConfig
    feature_dims: dict[str, int]
    provenance: dict[str, Any]
    created_at: dt.datetime
    signature: str | None = None
    signature_key_id: str | None = None

    @property
    def label(self) -> str:
        """``v<version>``: how commands and telemetry name it."""
        return f"v{self.version}"

    def require_current_inputs(self) -> None:
        """Refuse a policy trained on other graph inputs or actions than this code builds.

        The GNN's input layers are as wide as the feature tuples of ``tamiyo.graph``; weights
        trained before a feature was added (or removed, or reordered, or changed meaning) would
        read every column after it as a different feature. The format (``POLICY_FORMAT``;
        versions that recorded none are format 1) is checked first, then the widths, then the
        names for versions that recorded them (``provenance["graph_features"]``).

        Raises:
            IncompatiblePolicyError: The format, widths or names differ (one line naming the fix).
        """
        fix = (
            "Retrain with the train_policy flow (prefect deployment run 'train_policy/default', or "
            "train_policy(recipes=[...])) and serve the new version, pin TamiyoConfig.policy_version to a "
            "version trained on the current inputs, or decide with the heuristic (TamiyoConfig.policy='heuristic')"
        )
        stored = self.provenance.get("policy_format", 1)
        if stored != POLICY_FORMAT:
            raise IncompatiblePolicyError(
                f"policy {self.label} has format {stored}, but this Tamiyo reads format {POLICY_FORMAT} (features "
                f"without wall-clock time, layers and slots described by kind): its weights would read the wrong "
                f"features. {fix}"
            )
        widths = {nt: (self.feature_dims.get(nt), dim) for nt, dim in FEATURE_DIMS.items()}
        changed = [f"{nt} {old} -> {new}" for nt, (old, new) in widths.items() if old != new]
        names = self.provenance.get("graph_features")
        if not changed and names is not None:
            changed = [nt for nt, current in FEATURE_NAMES.items() if tuple(names.get(nt, ())) != current]
        if changed:
            raise IncompatiblePolicyError(
                f"policy {self.label} was trained on other graph inputs than Tamiyo builds now "
                f"({', '.join(changed)}): its weights would read the wrong features. {fix}"
            )


class IncompatiblePolicyError(ValueError):
    """A stored policy was trained on graph inputs that differ from the current builder's."""


__all__ = [
    "CounterfactualOutcome",
    "DecisionRecord",
    "DecisionState",
    "IncompatiblePolicyError",
    "PolicyVersion",
    "report_id_for",
]
