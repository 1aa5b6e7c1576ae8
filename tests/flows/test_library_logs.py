"""Esper's library loggers reach a deployed flow run's logs in the Prefect API.

The flow runs in a fresh process with the environment prefect.yaml gives every flow-run process
(as a worker would start it), against the session's test server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import pytest
import yaml

from esper_core.settings import EsperSettings
from tests.helpers.waiting import poll

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

ROOT = Path(__file__).resolve().parents[2]
RUN = (
    "from flows.morphogenesis import morphogenesis\n"
    "state = morphogenesis(recipe='seed-reference', epochs=1, device='cpu', seed=0, return_state=True)\n"
    "print('FLOW RUN', state.state_details.flow_run_id, state.type.value)\n"
)


def _flow_run_env(home: Path) -> dict[str, str]:
    from prefect.settings import get_current_settings

    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    job_env = config["definitions"]["work_pools"]["esper_process"]["job_variables"]["env"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_LOGGING", "ESPER_LOG"))}
    return {
        **env,
        **job_env,
        "PREFECT_API_URL": str(get_current_settings().api.url),
        "ESPER_HOME": str(home),
        "PYTHONPATH": str(ROOT),
    }


def test_esper_core_log_lines_are_stored_in_the_flow_runs_logs(compiled_home: EsperSettings) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    done = subprocess.run(
        [sys.executable, "-c", RUN],
        cwd=ROOT,
        env=_flow_run_env(compiled_home.home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *_, run_id, state = next(line for line in done.stdout.splitlines() if line.startswith("FLOW RUN")).split()
    assert state == "COMPLETED"
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(run_id)]))

    def found(messages: list[tuple[str, str]]) -> bool:
        return any(
            n == "esper_core._capabilities" and m.startswith("matmul precision 'high'") for n, m in messages
        ) and any(n == "esper_core.tamiyo.build" and m.startswith("Tamiyo policy on cpu") for n, m in messages)

    # The flow-run process sends its logs in batches, which may reach the server after the run's
    # final state: wait until both lines are there (or the deadline), not for the first batch.
    with get_client(sync_client=True) as client:
        library = poll(
            lambda: [log for log in client.read_logs(log_filter=log_filter) if log.name.startswith("esper_core.")],
            lambda logs: found([(log.name, log.message) for log in logs]),
            timeout_s=60,
            interval_s=0.5,
        )
    messages = [(log.name, log.message) for log in library]
    assert found(messages), messages
    assert any(log.task_run_id is not None for log in library)  # attributed to the task that logged it
