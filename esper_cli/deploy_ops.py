"""What ``esper server deploy`` does around ``prefect deploy --all``: keep the operators' schedule
switches and keep the automation that marks zombie flow runs Crashed.

``prefect deploy`` writes each schedule as prefect.yaml has it, so a redeploy would switch the
nightly sweep off again after an operator switched it on in the UI. The switches are read before
deploying and put back after: prefect.yaml's ``active:`` only decides for a schedule that is new.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import DeploymentSchedule
    from prefect.events.schemas.automations import AutomationCore

ZOMBIE_AUTOMATION = "esper: crash zombie flow runs"
"""Name of the automation ``esper server deploy`` keeps (one, updated in place on a redeploy)."""

ZOMBIE_AFTER_S = 90
"""A running flow run without a heartbeat for this long is marked Crashed; three missed
heartbeats at prefect.yaml's ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` of 30 s."""

ZOMBIE_MESSAGE = f"no heartbeat for {ZOMBIE_AFTER_S} s: the flow-run process or its machine died"
"""The Crashed state's message the automation sets (``esper server start`` and ``esper server worker``
reschedule such runs)."""

ScheduleKey = tuple[str, str]
"""(``flow/deployment``, schedule slug, or the schedule itself where it has no slug)."""


def _key(deployment_name: str, schedule: DeploymentSchedule) -> ScheduleKey:
    return deployment_name, schedule.slug or repr(schedule.schedule)


def schedule_switches(client: SyncPrefectClient) -> dict[ScheduleKey, bool]:
    """Whether each schedule of each deployment on the server is switched on."""
    flows = {f.id: f.name for f in client.read_flows()}
    return {
        _key(f"{flows[d.flow_id]}/{d.name}", s): s.active
        for d in client.read_deployments()
        for s in d.schedules
        if d.flow_id in flows
    }


def schedule_lines(client: SyncPrefectClient) -> list[str]:
    """One line per deployment on the server: its schedules, each on or off, or that it has none.

    E.g. ``benchmark_sweep/nightly  nightly (0 3 * * * UTC): off``. What ``esper server status``
    prints, since the Prefect UI's deployments page does not show whether a schedule is on.
    """
    flows = {f.id: f.name for f in client.read_flows()}
    lines = []
    for d in sorted(client.read_deployments(), key=lambda d: (flows.get(d.flow_id, ""), d.name)):
        name = f"{flows.get(d.flow_id, '?')}/{d.name}"
        if not d.schedules:
            lines.append(f"{name:<32} no schedule (runs when asked)")
        for s in d.schedules:
            cron = getattr(s.schedule, "cron", None)
            when = f"{cron} {getattr(s.schedule, 'timezone', None) or 'UTC'}" if cron else repr(s.schedule)
            lines.append(f"{name:<32} {s.slug or 'schedule'} ({when}): {'on' if s.active else 'off'}")
    return lines


def restore_schedule_switches(client: SyncPrefectClient, before: dict[ScheduleKey, bool]) -> list[str]:
    """Switch every schedule that existed ``before`` back to how it was; returns what changed.

    Returns:
        One line per schedule switched back, e.g. ``benchmark_sweep/nightly nightly: on``.
    """
    flows = {f.id: f.name for f in client.read_flows()}
    restored = []
    for d in client.read_deployments():
        if d.flow_id not in flows:
            continue
        for s in d.schedules:
            key = _key(f"{flows[d.flow_id]}/{d.name}", s)
            if key in before and before[key] != s.active:
                client.update_deployment_schedule(d.id, s.id, active=before[key])
                restored.append(f"{key[0]} {key[1]}: {'on' if before[key] else 'off'}")
    return restored


def zombie_automation() -> AutomationCore:
    """Mark a flow run Crashed when its heartbeats stop (its worker or machine died).

    Prefect's recipe for zombie flow runs: a proactive trigger per flow run that expects another
    heartbeat (or a final state) within ``ZOMBIE_AFTER_S`` after each heartbeat. Only flow runs
    whose process sends heartbeats (deployments, see prefect.yaml) can trigger it.
    """
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description="Flow runs whose process stopped sending heartbeats (its worker or machine died) "
        "are marked Crashed. Retry one with `prefect flow-run retry <id>`: it resumes from its "
        "last committed epoch.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=ZOMBIE_AFTER_S),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=ZOMBIE_MESSAGE,
            )
        ],
    )


def ensure_zombie_automation(client: SyncPrefectClient) -> UUID:
    """Create the zombie automation, or update the one a previous deploy made; returns its id."""
    automation = zombie_automation()
    existing = client.read_automations_by_name(ZOMBIE_AUTOMATION)
    if not existing:
        return client.create_automation(automation)
    first, *duplicates = existing
    client.update_automation(first.id, automation)
    for extra in duplicates:
        client.delete_automation(extra.id)
    return first.id
