"""Processes of the Prefect servers Esper starts on this machine, and the API they serve.

A free port, the API's health check, whether a pid lives, and stopping a process with everything
it started. Shared by a command's temporary server (``esper_cli.temporary_server``) and the
long-lived local server and worker (``esper_cli.local_prefect``); nothing of Prefect is imported here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import psutil


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(api_url: str) -> bool:
    """Whether a Prefect API answers its health check at ``api_url`` now."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs here; a zombie (killed, not yet reaped) counts as gone."""
    if Path("/proc/self/stat").exists():  # Linux: read the process state
        try:
            # The state follows the parenthesised command name: "123 (python) Z ...".
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(process: subprocess.Popen, *, timeout: float = 20.0) -> None:
    """Stop ``process``, its process group and every process it started: SIGTERM, then SIGKILL.

    The group covers uvicorn's and the worker's helpers; the descendants outside it are the
    flow-run processes a worker starts in sessions of their own. They are listed before the
    group is signalled and each gets SIGTERM (Prefect marks its run Crashed; the run's last
    committed epoch stays resumable) and then SIGKILL after ``timeout`` s, so nothing outlives
    an ``esper server`` that was stopped.
    """
    if process.poll() is not None:
        return
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
    survivors = [p for p in descendants if _alive(p)]
    for child in survivors:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(survivors, timeout=timeout)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=timeout)


def terminate(processes: list[psutil.Process], *, timeout: float) -> None:
    """SIGTERM each of ``processes``; SIGKILL those still alive after ``timeout`` s."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=max(timeout, 0.0))
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=2.0)


def descendants(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
