"""Tamiyo's risk engine: named rules that can veto or downgrade any policy's proposal.

Rules run in this order; each sees the command the previous ones left, and every rule that
changed it is named in ``AdaptationCommand.risk_rule`` (comma-separated) and explained at the end
of its ``reason``:

0. ``no_epoch_left``: a germination proposed after the run's last epoch is vetoed: the seed
   would join a network that never trains again (a decision is made after every epoch, the
   last included, so that a seed in flight can still be fossilised or culled).
0b. ``growth_window``: a germination at or after ``grow_until`` of the run (epoch >=
   ``ceil(grow_until * total_epochs)``) is vetoed: units added late train for few epochs, while
   the network they make is the one a static network of its shape is compared with. 1.0 (the
   default) leaves every epoch but the last open.
1. ``isolation_violation``: an in-flight seed failed G3 (its host received gradient from it, the
   ``kasmina.isolation.violation`` event): anything but culling it is downgraded to culling it.
2. ``loss_spike``: validation loss jumped above ``(1 + loss_spike_ratio)`` times the best of the
   previous ``spike_window`` epochs: growth (germinate, advance, a learning-rate increase) is
   vetoed.
3. ``repeated_regressions``: the last ``regression_streak`` field reports were all regressions
   and the newest closed less than ``regression_cooldown`` epochs ago: growth is vetoed.
4. ``blueprint_quarantine``: a germination names a blueprint that is quarantined (configured, or
   ``regression_limit`` regressions of its own in this run) or has no active artifact for the
   slot: downgraded to the best allowed alternative for the slot, else vetoed.
5. ``blueprint_tier``: a HIGH_RISK blueprint (unless allowed) or one riskier than
   ``max_blueprint_risk``: downgraded to the best allowed alternative, else vetoed.
6. ``param_budget`` / ``latency_budget``: seeds would exceed ``max_param_growth`` times the
   host's parameters or ``max_seed_params`` in all (downgraded to a cheaper allowed blueprint,
   else vetoed), or the epoch is over ``max_latency_ratio`` times its latency budget (growth
   vetoed).
7. ``predicted_risk``: the GNN's risk head predicts a regression with probability above
   ``max_predicted_risk``: growth is vetoed.

"Best allowed alternative": fits the slot, not quarantined, tier allowed, risk within bounds,
within the parameter budget; SAFE before EXPERIMENTAL, then lowest risk, then fewest parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from esper_core.contracts import (
    AdaptationCommand,
    BlueprintTier,
    CommandType,
    FieldReport,
    GateId,
    Outcome,
    SeedOperation,
    SeedStage,
    SystemStatePacket,
)
from esper_core.tamiyo.candidates import BlueprintCandidate

IN_FLIGHT = frozenset({SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.PROBATIONARY})
_TIER_ORDER = {BlueprintTier.SAFE: 0, BlueprintTier.EXPERIMENTAL: 1, BlueprintTier.HIGH_RISK: 2}


@dataclass(kw_only=True, slots=True)
class RiskConfig:
    """Thresholds of the risk engine's rules (see the module docstring for what each does).

    Attributes:
        loss_spike_ratio: Relative jump of validation loss over the recent best that is a spike.
        spike_window: Previous epochs whose best validation loss the current one is compared to.
        regression_streak: Consecutive regression reports that pause growth.
        regression_cooldown: Epochs after the newest of those reports during which growth stays paused.
        regression_limit: Regression reports of one blueprint in a run that quarantine it.
        quarantined: Blueprint ids never to germinate.
        allow_high_risk: Let HIGH_RISK blueprints be germinated.
        max_blueprint_risk: Largest Karn risk score a germinated blueprint may have.
        max_param_growth: Parameters all active seeds may add, as a multiple of the host's (4x
            lets the seed-reference host's only blueprint in, 2.1x its size, and stops a residual
            MLP of 11x the digits-cnn host).
        max_seed_params: Parameters the run may grow (active seeds plus merged width units), in absolute terms; None
            (default): no absolute cap. The growth benchmark gives a baseline the parameters the
            policy it is compared with grew, so both end at most the same size.
        max_latency_ratio: Epoch latency over its budget above which growth is vetoed; None
            (default) disables the rule: it reads wall-clock time, so a retried epoch on a busy
            machine could decide differently, and the recipes' 18 ms budget is reported against,
            not enforced.
        max_predicted_risk: Largest GNN-predicted regression probability allowed for growth.
        grow_until: Share of the run after which no seed is germinated (``growth_window``): 0.25
            keeps growth to the first quarter of the epochs; 1.0 (default) does not limit it.
            Seeds germinated before it go on through their lifecycle.
    """

    loss_spike_ratio: float = 0.25
    spike_window: int = 3
    regression_streak: int = 3
    regression_cooldown: int = 2
    regression_limit: int = 2
    quarantined: tuple[str, ...] = ()
    allow_high_risk: bool = False
    max_blueprint_risk: float = 0.6
    max_param_growth: float = 4.0
    max_seed_params: int | None = None
    max_latency_ratio: float | None = None
    max_predicted_risk: float = 0.9
    grow_until: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.grow_until <= 1.0:
            raise ValueError(
                f"grow_until must lie in (0, 1], got {self.grow_until}: a share of the run's epochs, e.g. 0.25 "
                "for its first quarter (to forbid growth, set max_seed_params=0)"
            )
        for name in ("spike_window", "regression_streak", "regression_cooldown", "regression_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.loss_spike_ratio <= 0:
            raise ValueError(f"loss_spike_ratio must be > 0, got {self.loss_spike_ratio}: e.g. 0.25 for +25 %")
        if not 0.0 <= self.max_blueprint_risk <= 1.0 or not 0.0 <= self.max_predicted_risk <= 1.0:
            raise ValueError("max_blueprint_risk and max_predicted_risk are probabilities: keep them in [0, 1]")
        if self.max_param_growth <= 0:
            raise ValueError(f"max_param_growth must be > 0, got {self.max_param_growth}")
        if self.max_seed_params is not None and self.max_seed_params < 0:
            raise ValueError(
                f"max_seed_params must be >= 0 (0 forbids growth) or None (no cap), got {self.max_seed_params}"
            )
        if self.max_latency_ratio is not None and self.max_latency_ratio <= 0:
            raise ValueError(f"max_latency_ratio must be > 0 or None (off), got {self.max_latency_ratio}")
        self.quarantined = tuple(self.quarantined)

    def seed_param_limit(self, host_params: int) -> int:
        """Parameters all active seeds may hold together on a host of ``host_params``:
        ``max_param_growth`` times the host, capped by ``max_seed_params`` when set.

        Args:
            host_params: The host's own parameters (``SystemStatePacket.host_params``).

        Returns:
            The limit the ``param_budget`` rule enforces (and Tamiyo's graph shows).
        """
        limit = math.floor(self.max_param_growth * host_params)
        return limit if self.max_seed_params is None else min(limit, self.max_seed_params)


@dataclass(frozen=True, kw_only=True, slots=True)
class RiskContext:
    """What the rules look at besides the proposal.

    Attributes:
        history: The run's packets, oldest first.
        candidates: Blueprints with an active artifact.
        reports: The run's field reports so far (any order).
        predicted_risk: The GNN risk head's output, when the GNN ran.
        total_epochs: The run's length, when known (``no_epoch_left`` needs it).
    """

    history: Sequence[SystemStatePacket]
    candidates: Sequence[BlueprintCandidate]
    reports: Sequence[FieldReport] = ()
    predicted_risk: float | None = None
    total_epochs: int | None = None

    @property
    def current(self) -> SystemStatePacket:
        """The packet of the epoch being decided."""
        return self.history[-1]


@dataclass(frozen=True, kw_only=True, slots=True)
class RiskVerdict:
    """The command after the risk engine, and which rules changed it.

    Attributes:
        command: What to carry out (the proposal itself when no rule fired).
        rules: Names of the rules that vetoed or downgraded, in order.
    """

    command: AdaptationCommand
    rules: tuple[str, ...]


# A rule returns None (no objection) or (name, replacement command, why).
_Rule = Callable[["RiskEngine", RiskContext, AdaptationCommand], tuple[str, AdaptationCommand, str] | None]


class RiskEngine:
    """Applies the rules of the module docstring to a proposal.

    Args:
        config: Thresholds; defaults to ``RiskConfig()``.
    """

    def __init__(self, config: RiskConfig | None = None) -> None:
        self.config = config or RiskConfig()

    def review(self, proposal: AdaptationCommand, ctx: RiskContext) -> RiskVerdict:
        """Veto or downgrade ``proposal``; returns it unchanged when no rule objects.

        Args:
            proposal: The policy's command.
            ctx: State, candidates, field reports and predicted risk.

        Returns:
            The verdict; a changed command carries ``risk_rule`` and an extended ``reason``.
        """
        command, fired, notes = proposal, [], []
        rules: tuple[_Rule, ...] = (
            RiskEngine._no_epoch_left,
            RiskEngine._growth_window,
            RiskEngine._isolation_violation,
            RiskEngine._loss_spike,
            RiskEngine._repeated_regressions,
            RiskEngine._blueprint_quarantine,
            RiskEngine._blueprint_tier,
            RiskEngine._budget,
            RiskEngine._predicted_risk,
        )
        for rule in rules:
            result = rule(self, ctx, command)
            if result is not None:
                name, command, why = result
                fired.append(name)
                notes.append(f"{name}: {why}")
        if not fired:
            return RiskVerdict(command=proposal, rules=())
        reason = f"{command.reason}; risk engine: " + "; ".join(notes)
        command = command.model_copy(update={"risk_rule": ",".join(fired), "reason": reason})
        return RiskVerdict(command=command, rules=tuple(fired))

    def quarantined(self, reports: Sequence[FieldReport]) -> set[str]:
        """Configured quarantine plus blueprints with ``regression_limit`` regressions in ``reports``."""
        counts: dict[str, int] = {}
        for r in reports:
            bp = r.command.blueprint_id
            if r.outcome is Outcome.REGRESSION and r.command.seed_operation is SeedOperation.GERMINATE and bp:
                counts[bp] = counts.get(bp, 0) + 1
        return set(self.config.quarantined) | {bp for bp, n in counts.items() if n >= self.config.regression_limit}

    # ------------------------------------------------------------------ rules

    def _no_epoch_left(self, ctx: RiskContext, command: AdaptationCommand) -> tuple[str, AdaptationCommand, str] | None:
        if ctx.total_epochs is None or command.seed_operation is not SeedOperation.GERMINATE:
            return None
        if ctx.current.epoch < ctx.total_epochs - 1:
            return None
        why = f"epoch {ctx.current.epoch} is the run's last of {ctx.total_epochs}: the seed would never train"
        return "no_epoch_left", _wait(command), f"{why}; {command.action} vetoed"

    def _growth_window(self, ctx: RiskContext, command: AdaptationCommand) -> tuple[str, AdaptationCommand, str] | None:
        if ctx.total_epochs is None or command.seed_operation is not SeedOperation.GERMINATE:
            return None
        closes = math.ceil(self.config.grow_until * ctx.total_epochs)
        if ctx.current.epoch < closes:
            return None
        why = f"epoch {ctx.current.epoch} >= {closes}: growth stops at grow_until={self.config.grow_until:g} of the run's {ctx.total_epochs} epochs"
        return "growth_window", _wait(command), f"{why}; {command.action} vetoed"

    def _isolation_violation(
        self, ctx: RiskContext, command: AdaptationCommand
    ) -> tuple[str, AdaptationCommand, str] | None:
        for seed in ctx.current.seeds:
            gate = seed.last_gate
            if seed.stage in IN_FLIGHT and gate is not None and gate.gate is GateId.G3_INTERFACE and not gate.passed:
                if command.seed_operation is SeedOperation.CULL and command.slot_id == seed.slot_id:
                    return None
                cull = _replace(
                    command,
                    command_type=CommandType.SEED,
                    seed_operation=SeedOperation.CULL,
                    slot_id=seed.slot_id,
                )
                return (
                    "isolation_violation",
                    cull,
                    f"{seed.slot_id} failed G3 ({gate.reason}): culled instead of {command.action}",
                )
        return None

    def _loss_spike(self, ctx: RiskContext, command: AdaptationCommand) -> tuple[str, AdaptationCommand, str] | None:
        previous = ctx.history[-1 - self.config.spike_window : -1]
        if not previous or not _is_growth(command):
            return None
        best = min(p.val_loss for p in previous)
        limit = best * (1.0 + self.config.loss_spike_ratio)
        if ctx.current.val_loss <= limit:
            return None
        why = f"val_loss {ctx.current.val_loss:.4g} > {limit:.4g} = best {best:.4g} of the last {len(previous)} epoch(s) x {1 + self.config.loss_spike_ratio:g}"
        return "loss_spike", _wait(command), f"{why}: {command.action} vetoed"

    def _repeated_regressions(
        self, ctx: RiskContext, command: AdaptationCommand
    ) -> tuple[str, AdaptationCommand, str] | None:
        streak = self.config.regression_streak
        ordered = sorted(ctx.reports, key=lambda r: (r.command.epoch + r.observation_epochs, r.command.epoch))
        recent = ordered[-streak:]
        if not _is_growth(command) or len(recent) < streak or any(r.outcome is not Outcome.REGRESSION for r in recent):
            return None
        closed = recent[-1].command.epoch + recent[-1].observation_epochs
        if ctx.current.epoch - closed >= self.config.regression_cooldown:
            return None
        why = f"the last {streak} field reports are regressions (newest closed at epoch {closed}, cooldown {self.config.regression_cooldown})"
        return "repeated_regressions", _wait(command), f"{why}: {command.action} vetoed"

    def _blueprint_quarantine(
        self, ctx: RiskContext, command: AdaptationCommand
    ) -> tuple[str, AdaptationCommand, str] | None:
        if command.seed_operation is not SeedOperation.GERMINATE:
            return None
        quarantined = self.quarantined(ctx.reports)
        candidate = _find(ctx, command.blueprint_id)
        profile = _profile(ctx, command.slot_id)
        if command.blueprint_id in quarantined:
            why = f"{command.blueprint_id} is quarantined"
        elif candidate is None or profile is None or not candidate.fits(profile):
            why = f"{command.blueprint_id} has no active artifact for {command.slot_id}'s profile {profile!r}"
        else:
            return None
        return self._downgrade_or_veto("blueprint_quarantine", ctx, command, why)

    def _blueprint_tier(
        self, ctx: RiskContext, command: AdaptationCommand
    ) -> tuple[str, AdaptationCommand, str] | None:
        if command.seed_operation is not SeedOperation.GERMINATE:
            return None
        candidate = _find(ctx, command.blueprint_id)
        if candidate is None or self._tier_ok(candidate):
            return None
        desc = candidate.descriptor
        why = f"{desc.blueprint_id} is {desc.tier.value} with risk {desc.risk:.2g} (max {self.config.max_blueprint_risk:.2g}, high-risk {'allowed' if self.config.allow_high_risk else 'not allowed'})"
        return self._downgrade_or_veto("blueprint_tier", ctx, command, why)

    def _budget(self, ctx: RiskContext, command: AdaptationCommand) -> tuple[str, AdaptationCommand, str] | None:
        cfg, current = self.config, ctx.current
        if cfg.max_latency_ratio is not None and _is_growth(command):
            ratio = current.epoch_latency_ms / current.latency_budget_ms
            if ratio > cfg.max_latency_ratio:
                why = f"epoch latency {current.epoch_latency_ms:.1f} ms is {ratio:.2f}x its budget (max {cfg.max_latency_ratio:g}x)"
                return "latency_budget", _wait(command), f"{why}: {command.action} vetoed"
        candidate = _find(ctx, command.blueprint_id)
        if command.seed_operation is not SeedOperation.GERMINATE or candidate is None:
            return None
        if self._within_budget(ctx, candidate):
            return None
        total = _seed_params(ctx) + candidate.param_cost
        limit = f"{cfg.max_param_growth:g} x host {ctx.history[0].host_params} at the start"
        if cfg.max_seed_params is not None:
            limit = f"min({limit}, max_seed_params {cfg.max_seed_params})"
        why = f"{candidate.blueprint_id} adds {candidate.param_cost} parameters; seeds would hold {total} > {limit}"
        return self._downgrade_or_veto("param_budget", ctx, command, why)

    def _predicted_risk(
        self, ctx: RiskContext, command: AdaptationCommand
    ) -> tuple[str, AdaptationCommand, str] | None:
        risk = ctx.predicted_risk
        if risk is None or risk <= self.config.max_predicted_risk or not _is_growth(command):
            return None
        return (
            "predicted_risk",
            _wait(command),
            f"predicted regression probability {risk:.2f} > {self.config.max_predicted_risk:.2f}: {command.action} vetoed",
        )

    # ------------------------------------------------------------------ helpers

    def _tier_ok(self, candidate: BlueprintCandidate) -> bool:
        desc = candidate.descriptor
        if desc.tier is BlueprintTier.HIGH_RISK and not self.config.allow_high_risk:
            return False
        return desc.risk <= self.config.max_blueprint_risk

    def _within_budget(self, ctx: RiskContext, candidate: BlueprintCandidate) -> bool:
        # Against the host the run started with: a merged width seed grows the host, and the
        # budget must not grow with it.
        return _seed_params(ctx) + candidate.param_cost <= self.config.seed_param_limit(ctx.history[0].host_params)

    def _downgrade_or_veto(
        self, name: str, ctx: RiskContext, command: AdaptationCommand, why: str
    ) -> tuple[str, AdaptationCommand, str]:
        profile = _profile(ctx, command.slot_id)
        quarantined = self.quarantined(ctx.reports)
        allowed = [
            c
            for c in ctx.candidates
            if profile is not None
            and c.fits(profile)
            and c.blueprint_id not in quarantined
            and self._tier_ok(c)
            and self._within_budget(ctx, c)
        ]
        if not allowed:
            return name, _wait(command), f"{why}; no allowed alternative fits {command.slot_id}: germination vetoed"
        best = min(allowed, key=lambda c: (_TIER_ORDER[c.descriptor.tier], c.descriptor.risk, c.param_cost))
        # Parameters were chosen for the original blueprint: the alternative uses its defaults.
        swapped = command.model_copy(update={"blueprint_id": best.blueprint_id, "parameters": {}})
        return name, swapped, f"{why}; downgraded to {best.blueprint_id}"


def _is_growth(command: AdaptationCommand) -> bool:
    if command.seed_operation in (SeedOperation.GERMINATE, SeedOperation.ADVANCE):
        return True
    return command.command_type is CommandType.OPTIMIZER and command.lr_scale > 1.0


def _find(ctx: RiskContext, blueprint_id: str | None) -> BlueprintCandidate | None:
    return next((c for c in ctx.candidates if c.blueprint_id == blueprint_id), None)


def _profile(ctx: RiskContext, slot_id: str | None) -> str | None:
    return next((s.shape_profile for s in ctx.current.seeds if s.slot_id == slot_id), None)


def _seed_params(ctx: RiskContext) -> int:
    """Parameters the run has grown so far: its active seeds', plus what merged width seeds added
    to the host (``merged_growth``), which no seed holds any more."""
    return sum(s.param_count for s in ctx.current.seeds if s.stage.is_active) + merged_growth(ctx.history)


def merged_growth(history: Sequence[SystemStatePacket]) -> int:
    """Parameters the host gained since the run's first epoch: merged width seeds (0 for a run
    that grows by branch seeds only, whose host keeps its size)."""
    return max(0, history[-1].host_params - history[0].host_params) if history else 0


def _replace(command: AdaptationCommand, **fields: object) -> AdaptationCommand:
    """A validated copy of ``command`` with ``fields`` changed (model_copy would not validate)."""
    data = command.model_dump()
    data.update(fields)
    if data["seed_operation"] is not SeedOperation.GERMINATE:
        data["blueprint_id"] = None
        data["parameters"] = {}
    return AdaptationCommand.model_validate(data)


def _wait(command: AdaptationCommand) -> AdaptationCommand:
    return _replace(command, command_type=CommandType.WAIT, seed_operation=None, slot_id=None, lr_scale=1.0)
