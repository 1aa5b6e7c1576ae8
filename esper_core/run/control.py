"""A run's control: one command from Tamiyo per trained epoch, under her deadline and circuit
breaker, from the blueprints the run can germinate, with the record Simic learns from.

``Run.decide`` asks the ``Controller``; everything it reads and writes is handed to it:
the run's state (history, reports, the outbox of the next commit), its registry link, Tamiyo and
the candidates' sources. In a data-parallel run rank 0 alone asks; the command reaches the other
ranks by broadcast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from esper_core.contracts import AdaptationCommand, MetricPoint, TelemetryEvent, TelemetryLevel, TelemetryPacket
from esper_core.run.candidates import KernelLookup
from esper_core.run.config import RunConfig
from esper_core.run.outage import RegistryLink
from esper_core.run.state import RunState
from esper_core.simic.records import CounterfactualOutcome, DecisionRecord, SimicStore
from esper_core.simic.serving import refresh_policy
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.reporting import command_attributes, decision_metrics
from esper_core.tamiyo.service import Decision, TamiyoService
from esper_core.tolaria.collective import Collective
from esper_core.tolaria.deadlines import decide_within


class Controller:
    """Decides a run's commands: Tamiyo, asked once per trained epoch.

    Args:
        config: The run's configuration (deadlines, epochs, the pinned policy, the task).
        run_id: Named in every packet and decision.
        tamiyo: Who decides.
        state: The run's state: its record (history, reports, outbox) and safety rails.
        registry: Every database call goes through it (an outage is ridden out).
        records: Simic's store, for the newest policy (None without a database).
        collective: The ranks; only rank 0 asks.
        lookup: The registry's kernels for the run's slots (``candidates.kernel_candidates``).
        built: Candidates that need no registry (seeds built from the host), always offered;
            asked each time, so their costs follow the host as it grows.
    """

    def __init__(
        self,
        *,
        config: RunConfig,
        run_id: str,
        tamiyo: TamiyoService,
        state: RunState,
        registry: RegistryLink,
        records: SimicStore | None,
        collective: Collective,
        lookup: Callable[[], KernelLookup],
        built: Callable[[], tuple[BlueprintCandidate, ...]],
    ) -> None:
        self.config = config
        self.run_id = run_id
        self.tamiyo = tamiyo
        self.record = state.record
        self.rails = state.rails
        self.registry = registry
        self.records = records
        self.collective = collective
        self._lookup = lookup
        self._built = built

    def candidates(self) -> list[BlueprintCandidate]:
        """Blueprints of the recipe with an active artifact for at least one slot profile, then
        the seeds built from the host, costed at its current shape.

        Kernels are looked up once per live session (and again after a germination is
        rejected): a kernel quarantined in the meantime is still refused when Kasmina loads it.
        """
        if self.record.candidates is None:
            done, found = self.registry.try_call("look up kernels", self._lookup)
            if not done or found is None:
                # Registry unreachable: no kernel can be loaded, so no branch seed can germinate;
                # seeds built from the host need none. Look again next epoch.
                return list(self._built())
            # Reported with the decision.
            self.record.lookup_ms = found.lookup_ms
            self.record.candidates = found.candidates
        return self.record.candidates + list(self._built())

    def decide(self) -> AdaptationCommand:
        """Ask Tamiyo for this epoch's command within its deadline (does not change the run).

        Tamiyo runs on a worker thread against a snapshot of the history; everything recorded
        here happens on the calling thread, so a late answer can never leak into a commit. A
        missed deadline or an error yields a conservative WAIT and counts against Tamiyo's
        circuit breaker; while the breaker is open she is not asked (WAIT, ``circuit_breaker``).
        The decision is kept for Simic and recorded with the commit that applies it.
        """
        if not self.record.history:
            raise ValueError("decide() needs at least one trained epoch; call train_epoch() first")
        # Its telemetry waits in the outbox for the next commit: until then the live state is not
        # the committed one, and a retry that lands here again must restore rather than emit twice.
        self.record.dirty = True
        if not self.collective.leader:
            # Rank 0 decides, from the same packets every rank computed; the others apply its command.
            command: AdaptationCommand | None = self.collective.broadcast(None)
            assert command is not None, "rank 0 broadcasts a command every epoch"
            return command
        history, candidates, reports = tuple(self.record.history), self.candidates(), tuple(self.record.reports)
        epoch = history[-1].epoch
        # Between epochs: serve the newest (or pinned) Simic policy when the GNN decides.
        if not self.registry.down:
            refresh_policy(self.tamiyo, self.records, pinned=self.config.tamiyo.policy_version)
        breaker = self.tamiyo.breaker
        decision: Decision | None = None
        metrics = [MetricPoint(name="urza.lookup.latency_ms", value=self.record.lookup_ms, unit="ms")]
        if not breaker.allow():
            # The breaker is open after repeated failures: do not ask Tamiyo this epoch.
            decision = self.tamiyo.fallback_decision(
                history, run_id=self.run_id, reason=f"circuit breaker open, last failure: {breaker.last_failure}"
            )
            command = decision.command
        else:
            # The deadline covers the deciding policy only: the GNN's shadow scoring (when the
            # heuristic decides) runs after it, so its timing can never turn into a WAIT.
            safety = self.config.trainer.safety
            outcome = decide_within(
                lambda: self.tamiyo.decide(
                    history,
                    candidates,
                    run_id=self.run_id,
                    reports=reports,
                    total_epochs=self.config.epochs,
                    shadow=False,
                ),
                safety.tamiyo_deadline_ms,
                enforce=safety.enforce_deadlines,
            )
            if not safety.enforce_deadlines and outcome.elapsed_ms > safety.tamiyo_deadline_ms:
                self.rails.overran("tamiyo", elapsed_ms=outcome.elapsed_ms, action="decide")
            metrics.append(MetricPoint(name="tamiyo.decision.latency_ms", value=outcome.elapsed_ms, unit="ms"))
            self.record.timings["decide_ms"].append(outcome.elapsed_ms)
            if outcome.timed_out or outcome.error is not None or outcome.value is None:
                breaker.record_failure("timeout" if outcome.timed_out else f"{type(outcome.error).__name__}")
                command = self.rails.tamiyo_missed(
                    epoch=epoch, run_id=self.run_id, elapsed_ms=outcome.elapsed_ms, error=outcome.error
                )
            else:
                breaker.record_success()
                decision = self.tamiyo.add_shadow(outcome.value, history, candidates, total_epochs=self.config.epochs)
                command = decision.command
                self.record.timings["gnn_ms"].append(decision.gnn_latency_ms)
                metrics += decision_metrics(decision)
        command = self.rails.filter(command)
        fallback_events: tuple[TelemetryEvent, ...] = ()
        if decision is not None and decision.fallback is not None:
            fallback_events = (
                TelemetryEvent(
                    name="tamiyo.policy.fallback",
                    level=TelemetryLevel.ERROR,
                    message=decision.fallback,
                    attributes={"shipped": self.config.tamiyo.shipped},
                ),
            )
        if decision is not None:
            task = self.config.task.to_dict() if self.config.task else None
            record = DecisionRecord.from_decision(
                decision, history, candidates, total_epochs=self.config.epochs, task=task
            )
            self.record.decision_records[command.command_id] = dataclasses.replace(record, command=command)
        rail_metrics, rail_events = self.rails.drain()
        self.record.outbox.append(
            TelemetryPacket(
                source="tamiyo",
                run_id=self.run_id,
                epoch=epoch,
                metrics=(*metrics, *rail_metrics),
                events=(
                    *rail_events,
                    *fallback_events,
                    TelemetryEvent(
                        name="tamiyo.command",
                        message=command.reason,
                        attributes=command_attributes(command, decision, breaker),
                    ),
                ),
            )
        )
        return self.collective.broadcast(command)

    def pending_decision(self, command: AdaptationCommand) -> DecisionRecord | None:
        """The record of ``command`` that the next commit stores, if Tamiyo decided it this step."""
        return self.record.decision_records.get(command.command_id)

    def attach_counterfactual(self, command: AdaptationCommand, outcome: CounterfactualOutcome) -> None:
        """Store ``outcome`` with ``command``'s decision (recorded at the commit that applies it).

        Raises:
            ValueError: ``command`` has no pending decision (see ``pending_decision``).
        """
        record = self.pending_decision(command)
        if record is None:
            raise ValueError(f"no pending decision {command.command_id}: attach right after decide(), before commit")
        self.record.decision_records[command.command_id] = dataclasses.replace(record, counterfactual=outcome)
