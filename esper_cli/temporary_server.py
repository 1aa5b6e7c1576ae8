"""The temporary Prefect server of one ``esper`` command, and Esper's defaults for Prefect settings.

``TemporaryServer`` brings up the temporary API server of a command without ``PREFECT_API_URL``,
in the background while the command works, one process at a time per ``PREFECT_HOME``. It binds
to 127.0.0.1 and uses the database in ``PREFECT_HOME``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from esper_cli.prefect_processes import answers, free_port

TEMPORARY_SERVER_LOCK = "esper-temporary-server.lock"
"""Lock file under ``PREFECT_HOME`` held while a process starts its temporary server."""
STARTUP_TIMEOUT_S = 120
"""Default wait for a temporary server to answer. Prefect's own default (20 s) is too short on a
busy 2-core machine, where importing the server alone has taken longer than that."""
LOCK_TIMEOUT_S = 900.0
"""How long a process waits for others to finish starting their temporary servers."""


def prefect_defaults() -> None:
    """Esper's defaults for Prefect settings, applied before Prefect is imported.

    The server's usage-analytics call only logs an error without a network, and the temporary
    server gets ``STARTUP_TIMEOUT_S`` to answer. Variables a user has set keep their value.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(STARTUP_TIMEOUT_S))


class TemporaryServer:
    """A command's own temporary Prefect API server, started in the background while the command works.

    A process without ``PREFECT_API_URL`` gets a temporary server from Prefect, but only when its
    first flow asks for one: after ``esper run`` has planned and checked the run (~14 s on 2
    cores), and then its start takes ~20 s more. ``begin`` starts it at once instead, so the two
    overlap; ``wait`` hands over its URL when the first flow needs it. The thread only runs a
    child process and an HTTP health poll (nothing of Prefect is imported here, which would race
    the main thread's imports); the server is the one Prefect itself would start (uvicorn on
    Prefect's app, UI off), on the database in ``PREFECT_HOME``.

    Starts are serialised per ``PREFECT_HOME`` with a file lock beside the database: every
    server migrates the database while it starts, and several ``esper`` commands started together
    on a fresh machine would migrate it at once (Alembic fails with "expected to match one row")
    and, on 2 cores, start too slowly. The first creates and migrates it, the next find it ready;
    the lock is released as soon as a server answers, so the commands' flows then run side by side.
    """

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.api_url: str | None = None
        self.ready_s: float | None = None
        """Seconds from ``begin`` until the server answered."""
        self.waited_s = 0.0
        """Seconds ``wait`` blocked: the part of the start the command's own work did not cover."""
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        # Held while a server process is started and while one is stopped: a stop (the command
        # exiting) never misses a server the thread is starting at that moment.
        self._spawning = threading.Lock()
        self._thread = threading.Thread(target=self._start, name="esper-prefect-start", daemon=True)
        self._began = 0.0

    def begin(self) -> TemporaryServer:
        """Start the server in the background; returns self."""
        self._began = time.perf_counter()
        self._thread.start()
        return self

    def wait(self) -> str:
        """Block until the server answers; returns its API URL.

        Raises:
            RuntimeError: If the lock is not free within ``LOCK_TIMEOUT_S`` (another process hangs
                while starting its server), or the server does not answer within ``STARTUP_TIMEOUT_S``.
        """
        start = time.perf_counter()
        self._thread.join()
        self.waited_s = time.perf_counter() - start
        if self._error is not None:
            self.stop()
            raise self._error
        assert self.api_url is not None
        return self.api_url

    def stop(self) -> None:
        """Stop the server (a start still under way gives up)."""
        with self._spawning:
            self._stopping.set()
            process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _start(self) -> None:
        from filelock import FileLock, Timeout

        home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
        lock_path = home / TEMPORARY_SERVER_LOCK
        try:
            home.mkdir(parents=True, exist_ok=True)
            with FileLock(lock_path, timeout=LOCK_TIMEOUT_S):
                # A port taken between choosing it and the server binding it: choose again.
                for _ in range(3):
                    if self._serve_on(free_port()):
                        self.ready_s = time.perf_counter() - self._began
                        return
                    if self._stopping.is_set():
                        return
                code = self.process.returncode if self.process is not None else None
                raise RuntimeError(f"Prefect's temporary server exited ({code}) three times; its output is above")
        except Timeout:
            self._error = RuntimeError(
                f"another process has been starting its temporary Prefect server for {LOCK_TIMEOUT_S:.0f} s "
                f"(lock {lock_path}); stop the hung `esper` or `python` process, or point every command at one "
                "server with PREFECT_API_URL (see `esper server start`)"
            )
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by wait()
            self._error = e

    def _serve_on(self, port: int) -> bool:
        """Start the server on ``port`` and wait until it answers (True) or exits (False)."""
        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            # What Prefect sets for the temporary server it starts itself (services it does not need).
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        app = ["--factory", "prefect.server.api.server:create_app", "--lifespan", "on", "--log-level", "error"]
        with self._spawning:
            if self._stopping.is_set():
                return False
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", *app, "--host", "127.0.0.1", "--port", str(port)], env=env
            )
        api_url = f"http://127.0.0.1:{port}/api"
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", STARTUP_TIMEOUT_S))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self.process.poll() is not None:
                return False
            if answers(api_url):
                self.api_url = api_url
                return True
            time.sleep(0.1)
        if self._stopping.is_set():
            return False
        self.stop()
        raise RuntimeError(
            f"Prefect's temporary server did not answer within {timeout:.0f} s; "
            "a busy machine may need PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS raised"
        )
