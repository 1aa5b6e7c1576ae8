"""SIGTERM (systemd, Docker, Kubernetes) stops ``esper`` commands as Ctrl-C does, with real processes.

Every command runs in a process group of its own; the test lists its descendants by pid while it
works, sends SIGTERM to the command alone and then waits, bounded, until none of them is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from esper_cli import local_prefect
from esper_cli.local_prefect import LocalPrefect
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl
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
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


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

    again = _esper(*args, "--run-id", "sigterm", env=env, log=tmp_path / "resume.log")
    assert again.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text(errors="replace")[-4000:]
    # Nothing lost, nothing counted twice: one Tolaria packet per epoch, in order.
    packets = read_jsonl(run_dir / "telemetry.jsonl")
    assert [p.epoch for p in packets if p.source == "tolaria"] == list(range(epochs))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_stops_the_server_its_worker_and_their_flow_runs(compiled_home: EsperSettings, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = _free_port()
    env = {**_env(compiled_home.home, tmp_path / "unused"), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    log = tmp_path / "server.log"
    process = _esper("server", "start", "--port", str(port), env=env, log=log)
    local = LocalPrefect(home=compiled_home.home, port=port)
    children: list[psutil.Process] = []
    try:
        wait_for(
            lambda: "Ctrl-C" in log.read_text(errors="replace") or process.poll() is not None,
            what="the server and the worker to start",
            timeout_s=300,
        )
        assert process.poll() is None, log.read_text(errors="replace")[-4000:]
        local.deploy()
        with temporary_settings({PREFECT_API_URL: local.api_url}):
            flow_run = run_deployment(
                "morphogenesis/default",
                parameters={"recipe": "seed-reference", "device": "cpu", "seed": 3, "epochs": 2000},
                timeout=0,
            )

            def flow_run_pid() -> int | None:
                with get_client(sync_client=True) as client:
                    pid = client.read_flow_run(flow_run.id).infrastructure_pid
                return int(pid) if pid and pid.isdigit() else None

            wait_for(lambda: flow_run_pid() is not None, what="the worker to start the flow run", timeout_s=300)
            run_pid = flow_run_pid()
        runs = compiled_home.home / "runs"
        wait_for(
            lambda: any(_latest_epoch(d) >= 1 for d in runs.glob("*")), what="the flow run to commit", timeout_s=300
        )
        children = _descendants(process.pid)
        # The server, the worker and the worker's flow run (in a session of its own) at least.
        assert run_pid in {p.pid for p in children} and len(children) >= 3, children
        _terminate(process, children, log)
    finally:
        if process.poll() is None:  # the test failed before SIGTERM: leave nothing running
            children = children or _descendants(process.pid)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        for child in children:
            if child.is_running():
                child.kill()
