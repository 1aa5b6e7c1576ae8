"""SIGTERM (systemd, Docker, Kubernetes) stops ``esper`` commands as Ctrl-C does, with real processes.

Every command runs in a process group of its own; the test lists its descendants by pid while it
works, sends SIGTERM to the command alone and then waits, bounded, until none of them is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from esper_cli import local_prefect
from esper_cli.local_prefect import LocalPrefect
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl
from tests.helpers.processes import alive, command_line
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow


def _env(home: Path, prefect_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ESPER_"))}
    env.update(ESPER_HOME=str(home), PREFECT_HOME=str(prefect_home), PYTHONPATH=str(local_prefect.PROJECT_DIR))
    return env


def _esper(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        # A group of its own, as a service manager would start it; only the command gets SIGTERM.
        return subprocess.Popen(
            [sys.executable, "-m", "esper_cli", *args],
            env=env,
            cwd=local_prefect.PROJECT_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _gone(processes: list[psutil.Process]) -> bool:
    return not any(alive(p) for p in processes)


def _latest_epoch(run_dir: Path) -> int:
    latest = run_dir / "checkpoints" / "LATEST"
    tag = latest.read_text().strip() if latest.exists() else ""
    return int(tag.split("-")[1]) if tag.startswith("epoch-") else -1


def _terminate(process: subprocess.Popen, children: list[psutil.Process], log: Path) -> None:
    """SIGTERM the command; it must exit like after Ctrl-C and leave none of ``children``."""
    process.send_signal(signal.SIGTERM)
    try:
        rc = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert rc == 128 + signal.SIGTERM, log.read_text(errors="replace")[-4000:]
    wait_for(lambda: _gone(children), what=f"the children {[p.pid for p in children]} to exit", timeout_s=60)


def test_sigterm_stops_a_run_and_its_last_committed_epoch_resumes(compiled_home: EsperSettings, tmp_path: Path) -> None:
    epochs = 60
    env = _env(compiled_home.home, tmp_path / "prefect")
    log = tmp_path / "run.log"
    args = ("run", "--recipe", "seed-reference", "--device", "cpu", "--seed", "3", "--epochs", str(epochs))
    run_dir = compiled_home.home / "runs" / "sigterm"
    process = _esper(*args, "--run-id", "sigterm", env=env, log=log)
    wait_for(
        lambda: _latest_epoch(run_dir) >= 3 or process.poll() is not None,
        what="the run to commit epoch 3",
        timeout_s=300,
    )
    children = _descendants(process.pid)  # the temporary Prefect server among them
    assert children, "the run has no temporary Prefect server"
    _terminate(process, children, log)
    at_stop = _latest_epoch(run_dir)
    assert 3 <= at_stop < epochs - 1, "the run finished before SIGTERM; give it more epochs"
    record = _stop_record(run_dir)
    assert record["reason"] == "SIGTERM to `esper run`" and record["resume"] == ["esper run --run-id sigterm"], record

    again = _esper(*args, "--run-id", "sigterm", env=env, log=tmp_path / "resume.log")
    assert again.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text(errors="replace")[-4000:]
    # Nothing lost, nothing counted twice: one Tolaria packet per epoch, in order.
    packets = read_jsonl(run_dir / "telemetry.jsonl")
    assert [p.epoch for p in packets if p.source == "tolaria"] == list(range(epochs))
    assert not (run_dir / "stopped.json").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STOP_BOUND_S = 10.0
"""Issue 37: after SIGTERM or Cancel, every process of the flow run is gone within this."""


def _start_server(port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    process = _esper("server", "start", "--port", str(port), env=env, log=log)
    wait_for(
        lambda: "Ctrl-C" in log.read_text(errors="replace") or process.poll() is not None,
        what="the server and the worker to start",
        timeout_s=300,
    )
    assert process.poll() is None, log.read_text(errors="replace")[-4000:]
    return process


def _stop_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "stopped.json").read_text())


def test_cancel_and_sigterm_stop_flow_runs_within_seconds_and_both_resume(
    compiled_home: EsperSettings, tmp_path: Path
) -> None:
    """The drill of issue 37 item 5 with real processes: a deployment run is cancelled (what the
    UI's Cancel does), retried from its last commit, then the server is stopped with SIGTERM
    while it runs and started again, and it goes on once more. Each stop: every pid gone within
    ``STOP_BOUND_S``, the run folder says where it stopped and how to go on."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    port = _free_port()
    env = {**_env(compiled_home.home, tmp_path / "unused"), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    log = tmp_path / "server.log"
    local = LocalPrefect(home=compiled_home.home, port=port)
    process = _start_server(port, env, log)
    children: list[psutil.Process] = []
    try:
        local.deploy()
        with temporary_settings({PREFECT_API_URL: local.api_url}):
            flow_run = run_deployment(
                "morphogenesis/default",
                parameters={"recipe": "seed-reference", "device": "cpu", "seed": 3, "epochs": 50000},
                timeout=0,
            )

            def read() -> Any:
                with get_client(sync_client=True) as client:
                    return client.read_flow_run(flow_run.id)

            def run_processes() -> list[psutil.Process]:
                pid = read().infrastructure_pid
                if read().state_type is not StateType.RUNNING or not pid or not pid.isdigit():
                    return []
                worker = next(p for p in _descendants(process.pid) if "worker" in command_line(p))
                return _descendants(worker.pid)

            runs = compiled_home.home / "runs"
            run_dir = wait_for(lambda: next(iter(runs.glob("*")), None), what="the run folder", timeout_s=300)

            # 1. Cancel, as the UI's button does: the flow run's processes are gone within the bound.
            wait_for(lambda: _latest_epoch(run_dir) >= 1, what="the flow run to commit", timeout_s=300)
            flow_run_processes = wait_for(run_processes, what="the flow run's processes", timeout_s=60)
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            wait_for(
                lambda: _gone(flow_run_processes), what="the cancelled flow run's processes", timeout_s=STOP_BOUND_S
            )
            wait_for(lambda: read().state_type is StateType.CANCELLED, what="state Cancelled", timeout_s=60)
            record = _stop_record(run_dir)
            stopped_at = _latest_epoch(run_dir)
            assert record["epochs_done"] <= stopped_at + 1, record
            assert f"prefect flow-run retry {flow_run.id}" in record["resume"], record

            # The deployment goes on with it: the same flow run, retried, resumes the same run.
            local.run_cli("flow-run", "retry", str(flow_run.id))
            wait_for(lambda: _latest_epoch(run_dir) > stopped_at + 2, what="the retried run to go on", timeout_s=300)
            assert not (run_dir / "stopped.json").exists(), "a run that went on still says it is stopped"

            # 2. SIGTERM to the server: the flow run, the worker and the server are gone within the bound.
            flow_run_processes = wait_for(run_processes, what="the flow run's processes", timeout_s=60)
            children = _descendants(process.pid)
            assert {p.pid for p in flow_run_processes} <= {p.pid for p in children}
            command = psutil.Process(process.pid)
            process.send_signal(signal.SIGTERM)
            wait_for(
                lambda: _gone([*children, command]),
                what="the server, the worker and the flow run to exit",
                timeout_s=STOP_BOUND_S,
            )
            assert process.wait(timeout=10) == 128 + signal.SIGTERM, log.read_text(errors="replace")[-4000:]
            assert "resumable at the next start" in log.read_text(), log.read_text(errors="replace")[-4000:]
            stopped_at = _latest_epoch(run_dir)
            assert "SIGTERM" in _stop_record(run_dir)["reason"]

        # 3. The next start picks the run up by itself and it goes on from its last commit.
        process = _start_server(port, env, tmp_path / "server-2.log")
        children = []
        with temporary_settings({PREFECT_API_URL: local.api_url}):
            state = read().state
            assert state is not None and state.type in {StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING}
            wait_for(lambda: _latest_epoch(run_dir) > stopped_at + 2, what="the run to go on", timeout_s=300)
        children = _descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: _gone(children), what="the second server's processes to exit", timeout_s=STOP_BOUND_S)
        packets = read_jsonl(run_dir / "telemetry.jsonl")
        epochs = [p.epoch for p in packets if p.source == "tolaria"]
        assert epochs == list(range(len(epochs))), "an epoch was lost or recorded twice across the stops"
    finally:
        if process.poll() is None:  # the test failed before SIGTERM: leave nothing running
            children = children or _descendants(process.pid)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end between the check and the kill
                child.kill()
