"""Several ``esper`` commands at once on a fresh machine, as real processes.

Each command without ``PREFECT_API_URL`` starts a temporary Prefect server on the database in
``PREFECT_HOME``; on a fresh ``PREFECT_HOME`` those servers used to migrate it at once and fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from esper_cli import temporary_server
from esper_cli.local_prefect import PROJECT_DIR

COMMANDS = 3
_HOLD = "import sys, time, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(120)"


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~40 s on 2 quiet cores; minutes when other jobs share them
def test_three_commands_at_once_on_a_fresh_machine(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ESPER_"))}
    env.update(
        ESPER_HOME=str(tmp_path / "esper"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PYTHONPATH=str(PROJECT_DIR),
    )
    # The smallest flow there is: one torch.export of a 16-wide low-rank adapter.
    command = [sys.executable, "-m", "esper_cli", "catalog", "compile", "lowrank_adapter"]
    command += ["--recipe", "seed-reference", "--device", "cpu"]
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(COMMANDS)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-4000:]
        assert "lowrank_adapter f16-b64" in output and "active" in output, output[-4000:]
    assert (tmp_path / "prefect" / "prefect.db").exists()  # the servers shared the fresh PREFECT_HOME


def test_a_hung_start_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(temporary_server, "LOCK_TIMEOUT_S", 0.2)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    # Another process is starting its server (and hangs): it holds the lock, then says so.
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path / temporary_server.TEMPORARY_SERVER_LOCK)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        server = temporary_server.TemporaryServer().begin()
        with pytest.raises(RuntimeError, match="starting its temporary Prefect server.*PREFECT_API_URL"):
            server.wait()
        assert server.process is None  # it never started a server of its own
    finally:
        holder.kill()
        holder.wait()
