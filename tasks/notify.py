"""Tell someone when a flow run fails: a JSON POST to ``ESPER_ALERT_WEBHOOK_URL``.

Used as the ``on_failure`` / ``on_crashed`` hook of the benchmark sweeps, so a nightly sweep that
finds a regression (or dies) does not wait for someone to open the UI. The body has a ``text``
field, which Slack and Mattermost incoming webhooks show as the message, and the details as
fields of their own for anything else that reads JSON.
"""

from __future__ import annotations

import httpx
from prefect import Flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.settings import get_current_settings

from tasks._runtime import settings


def failure_payload(flow: Flow, flow_run: FlowRun, state: State) -> dict[str, str]:
    """The JSON body posted for a failed or crashed flow run."""
    ui = get_current_settings().ui_url
    link = f"{ui.rstrip('/')}/runs/flow-run/{flow_run.id}" if ui else ""
    text = f"Esper: flow run {flow_run.name!r} of {flow.name} ended {state.name}: {state.message or ''}"
    return {
        "text": text + (f" ({link})" if link else ""),
        "flow": flow.name,
        "flow_run": flow_run.name,
        "flow_run_id": str(flow_run.id),
        "state": state.name or "",
        "message": state.message or "",
        "url": link,
    }


def notify_failure(flow: Flow, flow_run: FlowRun, state: State) -> None:
    """Post ``failure_payload`` to ``ESPER_ALERT_WEBHOOK_URL``; nothing when it is unset.

    Raises:
        httpx.HTTPError: The webhook refused the message or could not be reached (Prefect logs a
            failing hook in the flow run's logs and leaves the run's state as it is).
    """
    url = settings().alert_webhook_url
    if url is None:
        return
    response = httpx.post(url.get_secret_value(), json=failure_payload(flow, flow_run, state), timeout=10.0)
    response.raise_for_status()
