"""A morphogenesis run as a sequence of committed steps that Prefect tasks can retry exactly.

Each mutating step (train an epoch, apply a command) ends with ``commit(tag)``: the run's state
(``esper_core.run.state``: trainer, seed manager, RNG, rails, history and pending field reports)
goes to an atomic checkpoint, and only then are the step's telemetry packets and field reports
written out. A retried step first restores the last commit, so nothing is lost or counted twice.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from esper_core.contracts import (
    AdaptationCommand,
    CommandType,
    FieldReport,
    KernelArtifact,
    MetricPoint,
    SeedOperation,
    SeedStage,
    SystemStatePacket,
    TelemetryEvent,
    TelemetryLevel,
    TelemetryPacket,
    new_id,
)
from esper_core.determinism import capture_rng, restore_rng
from esper_core.interrupts import deferred_interrupts
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import LoadedKernel, load_for_slot, load_kernel
from esper_core.run.actuation import Actuator
from esper_core.run.build import build_trainer, load_run_data
from esper_core.run.candidates import kernel_candidates
from esper_core.run.commits import (
    CHECKPOINTS_DIR,
    START_TAG,
    epoch_tag,
    epochs_applied,
    fall_back,
    lost_epochs,
    tag_order,
)
from esper_core.run.config import RunConfig
from esper_core.run.control import Controller
from esper_core.run.outage import PendingRecords, RegistryLink, open_registry
from esper_core.run.plan import RunPlan, built_candidates, plan_run
from esper_core.run.spec import PlannedRun, RunSpec, check_same_controller, resolve
from esper_core.run.spec_file import SPEC_FILE
from esper_core.run.state import RunRecord, RunState, Unsent
from esper_core.run.stops import clear_stop
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.tamiyo.service import TamiyoService
from esper_core.telemetry import FanoutSink, JsonlSink, NullSink, TelemetrySink
from esper_core.tolaria.checkpoint import CheckpointCorruptError, CheckpointNotFoundError, CheckpointStore
from esper_core.tolaria.collective import Collective, Solo
from esper_core.tolaria.loop import count_parameters
from esper_core.tolaria.rails import SafetyRails
from esper_core.tolaria.rollback import RollbackTiers
from esper_core.tolaria.safety import EmergencyLevel, EpochFailed, TrainingHalted
from esper_core.urza.errors import RegistryError, RegistryUnavailableError
from esper_core.urza.service import Urza


class CommitLost(TrainingHalted):
    """A commit the live run stood on was damaged: set aside, LATEST moved back to an older one.

    The step cannot go on from an older commit (its epoch would be wrong), so the run halts; a
    resume (``Run.resume``) continues from the newest intact commit.
    """


def new_run_id() -> str:
    """A fresh run id: the time it starts and a random suffix, e.g. ``20261125-093012-3fa2b1``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{new_id()[:6]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunHandle:
    """What tasks pass around instead of the session: small and JSON-serialisable."""

    run_id: str
    run_dir: str


class Run:
    """One training run: host, seeds, controller, checkpoints and telemetry.

    Two constructors: ``start`` (a spec: a new run, or the existing run of that id reopened; or
    a configuration built in code: a study's episode, a data-parallel rank) and ``resume`` (a run
    folder, at its last commit).

    Its control (``control.Controller``: Tamiyo's decisions) and actuation
    (``actuation.Actuator``: commands applied to the trainer and seeds) are components with the
    run's parts handed to them; the session composes them with the commits around each step.
    """

    def __init__(
        self,
        *,
        config: RunConfig,
        settings: EsperSettings,
        run_id: str,
        urza: Urza,
        catalog: KarnCatalog | None = None,
        extra_sink: TelemetrySink | None = None,
        tamiyo: TamiyoService | None = None,
        collective: Collective | None = None,
        planned: PlannedRun | None = None,
    ) -> None:
        """``tamiyo``: a running Tamiyo to decide with (e.g. one shared by many runs of a
        benchmark, already compiled); default: a new one from ``config.tamiyo``.

        ``collective``: this process's place among the ranks of a data-parallel run
        (``esper_core.run.ranks`` launches them). Every rank trains and applies every command;
        rank 0 alone decides (and sends the command to the others), writes checkpoints,
        telemetry and Simic's records. Default: a single process.

        ``planned``: ``config`` as already planned in this process (``esper_core.run.spec``):
        its plan and data are used instead of planning and loading them again."""
        assert planned is None or planned.config is config, "planned must be the plan of config"
        self.config = config
        self.collective: Collective = collective or Solo()
        leader = self.collective.leader
        self.settings = settings
        self.run_id = run_id
        self.run_dir = settings.runs_dir / run_id
        self.urza = urza
        self.catalog = catalog or default_catalog()
        if planned is None:
            data = load_run_data(config)
            self.plan: RunPlan = plan_run(config, catalog=self.catalog, data=data, approved=config.approved_blueprints)
        else:
            data, self.plan = planned.data, planned.plan
        # Field reports and decisions for Simic, in the registry database (None without SQL).
        self.records = SimicStore.for_urza(urza)
        self.trainer = build_trainer(
            config,
            catalog=self.catalog,
            run_id=run_id,
            home=settings.home,
            data=data,
            recorded=self.records is not None,
            collective=self.collective,
        )
        self.manager = self.trainer.manager
        self.device = self.trainer.device
        if tamiyo is None:
            # The other ranks of a data-parallel run never decide: no compile of the policy there.
            tamiyo_config = config.tamiyo
            if not leader:
                tamiyo_config = dataclasses.replace(
                    tamiyo_config, compile=dataclasses.replace(tamiyo_config.compile, enabled=False)
                )
            tamiyo = TamiyoService(tamiyo_config, cache_dir=settings.home / "cache" / "inductor")
        self.tamiyo = tamiyo
        self.profiles = self.plan.profiles
        self.checkpoints = CheckpointStore(self.run_dir / CHECKPOINTS_DIR, retention=config.checkpoints)
        self.rails = SafetyRails(config.trainer.safety, RollbackTiers(self.checkpoints, persist=leader))
        self.sink: TelemetrySink = NullSink()
        if leader:
            jsonl = JsonlSink(self.run_dir / "telemetry.jsonl")
            self.sink = jsonl if extra_sink is None else FanoutSink(jsonl, extra_sink)
        # Every database call of the run goes through it: an outage is ridden out, not fatal.
        self.registry = RegistryLink(limit_s=settings.registry_outage_limit_s, emit=self._emit_event)
        self._unrecorded = PendingRecords(
            self.records if leader else None, self.registry, self.run_dir / "unrecorded.json"
        )
        # Everything a step changes; commit, restore and a counterfactual fork go through it.
        self.state = RunState(trainer=self.trainer, rails=self.rails, load_kernel=self._load_kernel)
        self.record: RunRecord = self.state.record
        self.control = Controller(
            config=config,
            run_id=run_id,
            tamiyo=self.tamiyo,
            state=self.state,
            registry=self.registry,
            records=self.records,
            collective=self.collective,
            lookup=lambda: kernel_candidates(plan=self.plan, catalog=self.catalog, urza=self.urza, device=self.device),
            built=lambda: built_candidates(s for s in self.manager.slots.values() if not s.kind.compiled),
        )
        self.actuator = Actuator(trainer=self.trainer, fetch=self._fetch_kernel)

    # ------------------------------------------------------------------ construction

    @classmethod
    def start(
        cls,
        run: RunSpec | RunConfig,
        *,
        settings: EsperSettings,
        run_id: str | None = None,
        extra_sink: TelemetrySink | None = None,
        tamiyo: TamiyoService | None = None,
        collective: Collective | None = None,
        planned: PlannedRun | None = None,
    ) -> Run:
        """Start ``run`` as ``run_id`` on the settings' registry and commit its start.

        A ``RunSpec`` (``esper run``, the flow, a notebook) is a run that can be resumed: its
        ``run_id`` defaults to ``spec.run_id``, else a new id; if a run of that id exists it is
        reopened at its last commit (``resume``, a partly trained epoch rewound), else the spec
        is written to the run folder's ``run.json`` and the run built from ``planned`` (the
        spec's ``plan_spec``, made in this process) or, without one, from the spec resolved
        here (a flow run executed again in a new process).

        A ``RunConfig`` built in code (a study's episode, a data-parallel rank) is always a new
        run (default id: a new one), built from ``planned`` when given (its ``config`` must be
        this one); no ``run.json`` is written and no existing run looked for, so it has nothing
        to resume from. Every rank of a data-parallel run starts its own: they build the same
        model from the same seed.

        Args:
            run: What to run: a spec, or a configuration built in code.
            settings: Where the registry and the run folders are.
            run_id: The run's id (see above for its default).
            extra_sink: Telemetry beside the run's ``telemetry.jsonl``.
            tamiyo: A running Tamiyo to decide with (see ``Run``).
            collective: This process's place among a data-parallel run's ranks (see ``Run``).
            planned: ``run``'s plan, configuration and data, already made in this process.
        """
        if isinstance(run, RunSpec):
            assert planned is None or planned.spec.key == run.key, "planned must be the plan of the spec"
            run_id = run_id or run.run_id or new_run_id()
            if (settings.runs_dir / run_id / SPEC_FILE).exists():
                session = cls.resume(
                    settings=settings,
                    run_id=run_id,
                    extra_sink=extra_sink,
                    tamiyo=tamiyo,
                    collective=collective,
                    planned=planned,
                )
                session.rewind_partial_epoch()
                return session
            planned = planned or resolve(run)
            run.save(settings.runs_dir / run_id, config=planned.config)
            config = planned.config
        else:
            run_id, config = run_id or new_run_id(), run
        session = cls(
            config=config,
            settings=settings,
            run_id=run_id,
            urza=open_registry(settings),
            extra_sink=extra_sink,
            tamiyo=tamiyo,
            collective=collective,
            planned=planned,
        )
        # Every rank goes on from rank 0's random state: building a run may draw differently on
        # each (a policy compiled on rank 0 only), and the ranks must draw alike from here.
        restore_rng(session.collective.broadcast(capture_rng()))
        session.commit(START_TAG)
        return session

    @classmethod
    def resume(
        cls,
        *,
        settings: EsperSettings,
        run_id: str,
        extra_sink: TelemetrySink | None = None,
        tamiyo: TamiyoService | None = None,
        collective: Collective | None = None,
        planned: PlannedRun | None = None,
    ) -> Run:
        """Reopen an existing run at its last committed step (e.g. in a new worker process, or on
        every rank of a data-parallel resume, whatever the number of ranks it had before).

        ``extra_sink``, ``tamiyo``, ``collective``: as for ``start``. ``planned``: the run's
        request as planned in this process (``esper run --run-id`` and the flow plan before they
        start the run); used instead of resolving, loading and planning the saved ``run.json``
        again when it asks for the same configuration, else ignored."""
        saved = RunSpec.load(settings.runs_dir / run_id)
        if planned is None or planned.spec.key != saved.key:
            planned = None
            config = saved.config()
        else:
            config = planned.config
        check_same_controller(settings.runs_dir / run_id, config)
        session = cls(
            config=config,
            settings=settings,
            run_id=run_id,
            urza=open_registry(settings),
            extra_sink=extra_sink,
            tamiyo=tamiyo,
            collective=collective,
            planned=planned,
        )
        session.restore()
        if session.collective.leader:
            clear_stop(session.run_dir)  # it goes on: no longer stopped
        return session

    @property
    def handle(self) -> RunHandle:
        """The serialisable handle of this run."""
        return RunHandle(run_id=self.run_id, run_dir=str(self.run_dir))

    @property
    def epoch(self) -> int:
        """Number of epochs trained so far (the index of the next epoch)."""
        return self.trainer.epoch

    @property
    def history(self) -> list[SystemStatePacket]:
        """Every trained epoch's state packet, in order."""
        return self.record.history

    @property
    def commands(self) -> list[AdaptationCommand]:
        """Every command applied (or rejected), in order."""
        return self.record.commands

    @property
    def reports(self) -> list[FieldReport]:
        """Field reports judged so far."""
        return self.record.reports

    @property
    def timings(self) -> dict[str, list[float]]:
        """Per-epoch timing series in milliseconds (``esper_core.run.state.TIMINGS``)."""
        return self.record.timings

    @property
    def committed_tag(self) -> str | None:
        """The tag of the last commit the live state started from."""
        return self.record.committed_tag

    # ------------------------------------------------------------------ steps

    def decide(self) -> AdaptationCommand:
        """This epoch's command from Tamiyo (``Controller.decide``); the run does not change."""
        return self.control.decide()

    def train_epoch(self) -> SystemStatePacket:
        """Train one epoch and gate the seeds; returns the state packet for Tamiyo.

        A failed epoch (non-finite or exploding loss) is rolled back to the last commit, the
        likely cause is remediated (the youngest in-flight seed culled, else the learning rate
        halved) and the epoch retried; past the failure budget the run halts.

        Raises:
            TrainingHalted: after ``max_failed_epochs`` consecutive failures.
        """
        self.record.dirty = True
        while True:
            try:
                result = self.trainer.train_epoch()
                break
            except EpochFailed as e:
                if self.rails.epoch_failed(str(e)) is EmergencyLevel.HALT:
                    self.rails.note("tolaria.emergency.halt", f"halting after repeated failed epochs: {e}")
                    self._emit_now(epoch=self.trainer.epoch)
                    raise TrainingHalted(
                        f"run {self.run_id} halted: {self.config.trainer.safety.max_failed_epochs} consecutive "
                        f"failed epochs, the last: {e}. Resume from the last commit with a lower learning rate."
                    ) from e
                self._rollback(why=str(e))
                self._remediate()
        self.rails.epoch_ok()
        packet = result.packet
        self.history.append(packet)
        self.timings["train_ms"].append(result.train_ms)
        self.timings["epoch_ms"].append(result.total_ms)
        self.record.judge(packet, run_id=self.run_id)
        rail_metrics, rail_events = self.rails.drain()
        self.record.outbox.append(
            TelemetryPacket(
                source="tolaria",
                run_id=self.run_id,
                epoch=packet.epoch,
                metrics=(*result.metrics, *rail_metrics),
                events=(*rail_events, *result.events),
            )
        )
        return packet

    def apply(self, command: AdaptationCommand) -> str:
        """Carry out ``command``; a command that cannot be applied is rejected, not fatal.

        Returns:
            ``applied`` or ``rejected: <reason>``.
        """
        self.record.dirty = True
        self.commands.append(command)
        events: list[TelemetryEvent] = []
        metrics: list[MetricPoint] = []
        start = time.perf_counter()
        try:
            self.actuator.carry_out(command, metrics)
            outcome = "applied"
            elapsed = (time.perf_counter() - start) * 1e3
            calls_kasmina = command.command_type not in (CommandType.WAIT, CommandType.PAUSE)
            safety = self.config.trainer.safety
            if calls_kasmina and elapsed > safety.kasmina_deadline_ms and not safety.enforce_deadlines:
                self.rails.overran("kasmina", elapsed_ms=elapsed, action=command.action)
            elif calls_kasmina and elapsed > safety.kasmina_deadline_ms:
                reason = self.rails.kasmina_missed(elapsed_ms=elapsed, action=command.action)
                self._rollback(why=reason)
                self.commands.append(command)
                outcome = f"rejected: {reason}"
            if outcome == "applied" and (cap := self._over_cap(command)) is not None:
                self._rollback(why=cap)
                self.commands.append(command)
                outcome = f"rejected: {cap}"
                events.append(
                    TelemetryEvent(
                        name="kasmina.command.rejected",
                        level=TelemetryLevel.WARNING,
                        message=cap,
                        attributes={"action": command.action, "slot_id": command.slot_id or "", "blocked": False},
                    )
                )
        except (ValueError, LookupError, RegistryError) as e:
            # A command that cannot be carried out (unknown slot, no kernel, a corrupt blob, a
            # refused gate) is rejected and reported; the run goes on without it.
            outcome = f"rejected: {e}"
            self.record.candidates = None  # the registry may have changed under the run: look again
            if isinstance(e, RegistryUnavailableError):
                self.registry.failed("load a kernel", e)
            # A gate's refusal is the lifecycle working; a kernel the registry could not give
            # (refused signature, corrupt or missing blob, an outage) blocked growth the run
            # wanted: counted, so the run's summary and its Prefect state say it was degraded.
            blocked = isinstance(e, RegistryError)
            if blocked:
                metrics.append(MetricPoint(name="kasmina.growth.blocked_total", value=1.0))
            events.append(
                TelemetryEvent(
                    name="kasmina.command.rejected",
                    level=TelemetryLevel.WARNING,
                    message=str(e),
                    attributes={"action": command.action, "slot_id": command.slot_id or "", "blocked": blocked},
                )
            )
        outcome = self._agree(command, outcome, events)
        if outcome == "applied" and command.command_type is not CommandType.WAIT and self.history:
            last = self.history[-1]
            self.record.pending.append((command, last.val_loss, last.val_accuracy))
        events.extend(self.manager.drain_events())
        events.extend(self.urza.drain_events())
        rail_metrics, rail_events = self.rails.drain()
        self.record.outbox.append(
            TelemetryPacket(
                source="kasmina",
                run_id=self.run_id,
                epoch=command.epoch,
                metrics=(*metrics, *rail_metrics),
                events=(*rail_events, *events),
            )
        )
        return outcome

    def _over_cap(self, command: AdaptationCommand) -> str | None:
        """Why the germination just applied passes the user's growth cap; None when it does not.

        Measured on the network itself after germinating (a seed's size depends on its kind, the
        slot and, for a width seed, the layer's current width), and undone by the caller: a
        rollback to the last commit leaves the run as if the command had never come.
        """
        kasmina = self.config.kasmina
        if command.seed_operation is not SeedOperation.GERMINATE:
            return None
        what = f"growth cap: germinating {command.blueprint_id} in {command.slot_id} makes the network"
        if kasmina.max_params is not None and (params := count_parameters(self.trainer.model)) > kasmina.max_params:
            return f"{what} {params} parameters, over KasminaConfig.max_params={kasmina.max_params} (esper run --max-params)"
        if kasmina.max_flops is not None and (flops := self.trainer.grown_flops()) > kasmina.max_flops:
            return (
                f"{what} {flops} FLOPs a sample (forward, every seed at full weight), over "
                f"KasminaConfig.max_flops={kasmina.max_flops} (esper run --max-flops)"
            )
        return None

    def _agree(self, command: AdaptationCommand, outcome: str, events: list[TelemetryEvent]) -> str:
        """The command's outcome on every rank: applied where it applied everywhere, else rejected
        (with the first refusing rank's reason) and undone where it had applied, so the ranks
        never hold different networks. A rank can refuse alone: past Kasmina's deadline on a
        slower core, or when its registry connection fails."""
        outcomes = self.collective.gather(outcome)
        refused = [(rank, o) for rank, o in enumerate(outcomes) if o != "applied"]
        if not refused or len(refused) == len(outcomes):
            return outcome
        rank, reason = refused[0]
        if outcome == "applied":
            self._rollback(why=f"rank {rank} could not apply {command.action}")
            self.commands.append(command)
        agreed = f"rejected: rank {rank}: {reason.removeprefix('rejected: ')}"
        events.append(
            TelemetryEvent(
                name="kasmina.command.rejected",
                level=TelemetryLevel.WARNING,
                message=agreed,
                attributes={"action": command.action, "slot_id": command.slot_id or "", "rank": str(rank)},
            )
        )
        return agreed

    def _fetch_kernel(self, blueprint_id: str, profile: ShapeProfile) -> LoadedKernel:
        # Tier policy, newest active artifact, guards against the slot before any bytes load,
        # SHA-256 on read; the seed manager pre-warms once it is attached.
        return load_for_slot(
            self.urza,
            blueprint_id,
            profile,
            catalog=self.catalog,
            device=self.device,
            approved=self.config.approved_blueprints,
            params=self.catalog.resolve_params(blueprint_id),
            prewarm=False,
        )

    def _load_kernel(self, artifact: KernelArtifact) -> LoadedKernel:
        # Kasmina loads, never compiles: the blob is verified against its SHA-256 on read.
        return load_kernel(artifact, self.urza.fetch_blob(artifact), catalog=self.catalog, device=self.device)

    # ------------------------------------------------------------------ commits

    def commit(self, tag: str) -> None:
        """Checkpoint everything under ``tag``, then release the step's telemetry and reports.

        Field reports and applied decisions go to the registry database first (idempotent by id),
        so whatever a checkpoint holds is already recorded when the run dies right after it;
        during a registry outage they are queued in order and written when it ends
        (``esper_core.run.outage``).
        """
        # Every rank must commit the same network: a data-parallel run checks it at every commit.
        self.collective.check_identical(self.trainer.model, where=tag)
        if not self.collective.leader:
            # Rank 0 writes the checkpoint, telemetry and records; this rank keeps the commit in
            # memory for a rollback and drops the step's outputs (rank 0 has the same ones).
            self.state.commit(tag)
            self.record.decision_records.clear()
            self.record.outbox.clear()
            self.record.report_outbox.clear()
            return
        self._record_for_simic(final=epochs_applied(tag) >= self.config.epochs)
        # A checkpoint whose packets were never written would lose them for good (a resume starts
        # after it): an interrupt waits until both are out.
        with deferred_interrupts():
            self.state.commit(tag)
            self.checkpoints.prune(best=self.record.best_tag(), order=tag_order)
            self._send(Unsent(packets=tuple(self.record.outbox), reports=tuple(self.record.report_outbox)))
            self.record.outbox.clear()
            self.record.report_outbox.clear()

    def _send(self, unsent: Unsent) -> None:
        for packet in unsent.packets:
            self.sink.emit(packet)
        if unsent.reports:
            with open(self.run_dir / "field_reports.jsonl", "a", encoding="utf-8") as f:
                f.writelines(r.to_json() + "\n" for r in unsent.reports)

    def _record_for_simic(self, *, final: bool) -> None:
        applied = {c.command_id for c in self.commands}
        decisions = [r for command_id, r in self.record.decision_records.items() if command_id in applied]
        self._unrecorded.add(self.record.report_outbox, decisions)
        # Decisions never applied (their task was retried) are dropped with the rest.
        self.record.decision_records.clear()
        # During an outage they stay queued; the run's last commit waits for the database.
        self._unrecorded.flush(wait=final)

    def restore(self, tag: str | None = None) -> str:
        """Return to the committed state ``tag`` (default: the latest commit), escalation included.

        A damaged checkpoint is never loaded: it is set aside (``checkpoints/damaged/``) and the
        newest intact commit before it is restored instead, LATEST then pointing at it.

        Returns:
            The tag restored: ``tag``, or the older commit the run went back to.

        Raises:
            CheckpointCorruptError: a damaged checkpoint and no intact commit before it (or, on a
                rank other than 0 of a data-parallel run, any damaged checkpoint: rank 0 alone
                moves the run's files).
        """
        tag = tag or self.checkpoints.latest()
        if tag is None:
            raise CheckpointNotFoundError(f"run {self.run_id} has no commit to restore under {self.checkpoints.root}")
        while True:
            try:
                unsent = self.state.restore(tag, deadline_ms=self.config.trainer.safety.rollback_deadline_ms)
                break
            except CheckpointCorruptError as e:
                tag = self._fall_back(e)
        if self.collective.leader:
            # A process killed right after the commit never sent its telemetry: send it now.
            self._send(unsent.missing_from(self.run_dir))
        return tag

    def _fall_back(self, damaged: CheckpointCorruptError) -> str:
        # Rank 0 alone moves the run's files; another rank stops at the damage.
        if not self.collective.leader:
            raise damaged
        kept = fall_back(self.checkpoints, damaged, run_id=self.run_id)
        # Sent at once: an operator's alert, not a line in the next epoch's packet.
        event = TelemetryEvent(
            name="tolaria.checkpoint.damaged",
            level=TelemetryLevel.WARNING,
            message=f"checkpoint {damaged.tag} is damaged ({damaged.problem}); set aside, {lost_epochs(kept, damaged.tag)}",
            attributes={"damaged": damaged.tag, "kept": kept},
        )
        self.sink.emit(TelemetryPacket(source="tolaria", run_id=self.run_id, epoch=self.trainer.epoch, events=(event,)))
        return kept

    def _rollback(self, *, why: str) -> None:
        """Back to the last commit after a failure; the live escalation state is kept.

        Raises:
            CommitLost: the last commit's checkpoint is damaged (only the disk held it).
        """
        try:
            self.state.rollback(deadline_ms=self.config.trainer.safety.rollback_deadline_ms, why=why)
        except CheckpointCorruptError as e:
            kept = self._fall_back(e)
            raise CommitLost(
                f"run {self.run_id}: a rollback ({why}) found commit {e.tag} damaged; it was not restored. "
                f"Resume the run (`esper run --run-id {self.run_id}`) to go on from {kept}."
            ) from e

    def _remediate(self) -> None:
        """Undo the likely cause of a failed epoch before retrying it."""
        in_flight = [
            s for s in self.manager.export_seed_states() if s.stage.is_active and s.stage is not SeedStage.FOSSILIZED
        ]
        if in_flight:
            youngest = min(in_flight, key=lambda s: s.age_epochs)
            self.manager.cull(youngest.slot_id, reason="emergency: failed epoch after its germination")
            self.rails.note(
                "tolaria.remediation", f"culled {youngest.slot_id}", action="cull", slot_id=youngest.slot_id
            )
            return
        for group in self.trainer.optimizer.param_groups:
            group["lr"] *= 0.5
        self.rails.note("tolaria.remediation", "halved the learning rate", action="halve_lr")

    def _emit_now(self, *, epoch: int) -> None:
        """Send the rails' pending telemetry immediately (the run is stopping; no commit follows)."""
        metrics, events = self.rails.drain()
        self.sink.emit(
            TelemetryPacket(
                source="tolaria", run_id=self.run_id, epoch=epoch, metrics=tuple(metrics), events=tuple(events)
            )
        )

    def _emit_event(self, event: TelemetryEvent) -> None:
        """Send one event at once (an outage is news now, not at the next commit)."""
        self.sink.emit(TelemetryPacket(source="urza", run_id=self.run_id, epoch=self.trainer.epoch, events=(event,)))

    def rewind_partial_epoch(self) -> None:
        """If the last commit is a trained-but-not-applied epoch, go back to before it.

        Resuming then re-runs that epoch, which reproduces it exactly, followed by its decision.
        """
        # A loop: the commit before it may be damaged, and the run fall back to another trained one.
        while (tag := self.committed_tag or "").endswith("-trained"):
            epoch = int(tag.split("-")[1])
            self.restore(START_TAG if epoch == 0 else epoch_tag(epoch - 1, "applied"))

    def ensure_at(self, tag: str) -> None:
        """Make the live state equal to commit ``tag`` (restoring if a step ran past it or failed).

        Raises:
            CommitLost: ``tag``'s checkpoint is damaged; the run went back to an older commit.
        """
        if self.committed_tag != tag or self.record.dirty:
            restored = self.restore(tag)
            if restored != tag:
                raise CommitLost(
                    f"run {self.run_id}: commit {tag} is damaged and was set aside; the run's newest intact commit "
                    f"is {restored}. Resume the run (`esper run --run-id {self.run_id}`) to go on from it."
                )

    def close(self) -> None:
        """Release files, database connections and Tamiyo's background compile."""
        self.tamiyo.close()
        self.sink.close()
        self.urza.close()
