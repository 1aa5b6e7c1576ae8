"""The long-lived local Prefect server and process worker, and the sweep of their orphaned flow runs.

``LocalPrefect`` is the server and worker of ``esper server`` (``make server`` / ``make deploy``)
and of the tests that deploy and run flows against a real server; ``recover_orphans``
reschedules the flow runs whose worker died. Everything binds to 127.0.0.1; the server's
database and logs live under ``$ESPER_HOME/prefect``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import psutil

from esper_cli import deploy_ops
from esper_cli.prefect_processes import answers, descendants, pid_alive, stop, terminate

PROJECT_DIR = Path(__file__).resolve().parents[1]
POOL = "esper"
SHUTDOWN_S = 9.0
"""``esper server start`` stopped: every process it started is gone within this many seconds."""
FLOW_RUNS_STOP_S = 5.0
"""Of ``SHUTDOWN_S``, what the flow runs get after SIGTERM to report how they ended (while the
server still answers) before SIGKILL; the worker and the server share the rest."""
SERVER_MARKER = "server.json"
"""Under ``$ESPER_HOME/prefect``: the API URL and pid of the running ``esper server start``."""
RESUMABLE = "Resumable"
"""Name of the Scheduled state a flow run stopped by ``esper server``'s shutdown is left in."""
WORKER_LABEL = "prefect.worker.name"
"""The label a Prefect worker gives each flow run it executes: its own name (see ``worker_name_prefix``)."""
CANCEL_REPLAY_S = 75.0
"""A flow run rescheduled here starts no sooner than this after its last Cancelling state. A
starting worker's cancellation observer is sent the Cancelling events of the last minute (Prefect's
events subscriber backfills one), and kills a run of that id it has in flight: a run cancelled,
retried and resumed by a new worker within the minute would be stopped again. A minute, plus the
worker's 10 s prefetch and a margin."""
PENDING_GRACE_S = 120.0
"""``recover_orphans`` leaves a Pending flow run alone this long. A worker sets Pending, starts the
flow-run process and only then records its pid, so meanwhile a run that ran before carries the pid
of its previous, dead process; rescheduling it then would run it twice. Recording the pid takes one
API call after the process starts: a run still Pending after this long lost its worker."""


def _prefect(*args: str) -> list[str]:
    """The ``prefect`` CLI of this interpreter's environment."""
    return [sys.executable, "-m", "prefect", *args]


def worker_name_prefix() -> str:
    """How the names of the workers ``LocalPrefect`` starts on this machine begin: ``esper <host> ``.

    A worker labels each flow run it executes with its name (``WORKER_LABEL``), so a run so
    labelled has its ``infrastructure_pid`` on this machine. Prefect's pids name no machine.
    """
    return f"esper {socket.gethostname()} "


@dataclass(kw_only=True)
class LocalPrefect:
    """Where a local Prefect server lives and how to reach it."""

    home: Path
    """``ESPER_HOME``: the server's database and logs go to ``home/prefect``."""
    port: int = 4200
    project_dir: Path = PROJECT_DIR
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Further variables for the server, the worker and the flow runs it starts."""

    @property
    def prefect_home(self) -> Path:
        """``PREFECT_HOME`` of the server, its worker and the CLI calls made through here."""
        return self.home / "prefect"

    @property
    def api_url(self) -> str:
        """``PREFECT_API_URL`` of this server."""
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        """The Prefect UI."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment for the server, the worker and ``prefect`` CLI calls."""
        env = dict(os.environ)
        env.update(
            {
                "ESPER_HOME": str(self.home),
                "PREFECT_HOME": str(self.prefect_home),
                "PREFECT_API_URL": self.api_url,
                "PREFECT_SERVER_API_HOST": "127.0.0.1",
                "PREFECT_SERVER_API_PORT": str(self.port),
                "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{self.prefect_home / 'prefect.db'}",
                # No network here: the analytics call would only log an error.
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            }
        )
        env.update(self.extra_env)
        return env

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        self.prefect_home.mkdir(parents=True, exist_ok=True)
        log = open(self.prefect_home / log_name, "ab")  # noqa: SIM115 - the child keeps it open
        # A session of its own: stop() signals the whole group (uvicorn's and the worker's children).
        return subprocess.Popen(
            args, cwd=self.project_dir, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log_tail(self, log_name: str, lines: int = 30) -> str:
        """The last ``lines`` lines of a log under ``prefect_home``."""
        path = self.prefect_home / log_name
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def start_server(self, *, timeout: float = 180.0) -> subprocess.Popen:
        """Start ``prefect server start`` on 127.0.0.1 and wait until its API answers.

        Not ``prefect server start --background``: that pipes the server's output to the CLI
        process, which exits at once, so nothing keeps ``server.log`` and a server that dies
        leaves no trace; and ``esper server start`` must watch the server it supervises with
        its worker. Here the server is a child process writing ``server.log``, stopped with
        ``stop()``.

        Raises:
            RuntimeError: If the server exits or does not answer within ``timeout`` seconds
                (the message carries the end of ``server.log``).
        """
        process = self._spawn(
            _prefect("server", "start", "--host", "127.0.0.1", "--port", str(self.port)), "server.log"
        )
        try:
            self._wait_until_healthy(process, timeout)
        except BaseException:
            stop(process)  # also on Ctrl-C or SIGTERM during the start: no server left behind
            raise
        return process

    def is_up(self) -> bool:
        """Whether a Prefect server answers its health check at ``api_url`` now."""
        return answers(self.api_url)

    @property
    def marker(self) -> Path:
        """Written by ``esper server start`` while it runs: where its API is, for ``esper run``."""
        return self.prefect_home / SERVER_MARKER

    def announce(self, server: subprocess.Popen) -> None:
        """Say (in ``marker``) that this home's server runs, so that commands use it."""
        self.marker.write_text(json.dumps({"api_url": self.api_url, "pid": server.pid}) + "\n")

    @staticmethod
    def running_api_url(home: Path) -> str | None:
        """The API of ``esper server start`` for ``home`` if it runs and answers now, else None."""
        marker = home / "prefect" / SERVER_MARKER
        if not marker.exists():
            return None
        try:
            announced = json.loads(marker.read_text())
            api_url, pid = str(announced["api_url"]), int(announced["pid"])
        except (ValueError, KeyError, TypeError):
            return None  # a marker torn by a crash: no server to trust
        return api_url if pid_alive(pid) and answers(api_url) else None

    def _wait_until_healthy(self, process: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the Prefect server exited with {process.returncode}; is port {self.port} free? "
                    f"(pick another with --port)\n{self.log_tail('server.log')}"
                )
            if self.is_up():
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Prefect server did not answer within {timeout:.0f} s\n{self.log_tail('server.log')}")

    def run_cli(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
        """Run ``prefect <args>`` against this server in the project directory.

        Raises:
            RuntimeError: If the command fails (the message carries its output).
        """
        done = subprocess.run(
            _prefect(*args), cwd=self.project_dir, env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"`prefect {' '.join(args)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def ensure_pool(self) -> None:
        """Create the ``esper`` process work pool unless it exists."""
        inspect = subprocess.run(
            _prefect("work-pool", "inspect", POOL), env=self.env(), capture_output=True, text=True, timeout=120
        )
        if inspect.returncode != 0:
            self.run_cli("work-pool", "create", POOL, "--type", "process")

    def deploy(self) -> str:
        """Register every deployment of ``prefect.yaml`` and the zombie-run automation.

        Schedules that already existed keep the switch an operator gave them (prefect.yaml's
        ``active:`` only sets new ones); see ``esper_cli.deploy_ops``.

        Returns:
            The CLI's output, then a line per schedule switched back and one for the automation.
        """
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        self.ensure_pool()
        with temporary_settings({PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            switches = deploy_ops.schedule_switches(client)
            out = self.run_cli("--no-prompt", "deploy", "--all").stdout
            restored = deploy_ops.restore_schedule_switches(client, switches)
            lines = [f"kept the schedule switch of {line}" for line in restored]
            automation = deploy_ops.ensure_zombie_automation(client)
            lines.append(f"automation {deploy_ops.ZOMBIE_AUTOMATION!r}: {automation}")
        return "\n".join([out.rstrip(), *lines])

    def status(self) -> str:
        """Where the server is, and each deployment's schedules with their on/off switch.

        Raises:
            ValueError: No server answers at ``api_url`` (start it with ``esper server start``).
        """
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        if not self.is_up():
            raise ValueError(f"no Prefect server answers at {self.api_url}: start one with `esper server start`")
        with temporary_settings({PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            lines = deploy_ops.schedule_lines(client)
        header = f"Prefect server {self.api_url} (UI {self.ui_url})"
        return "\n".join([header, *(lines or ["no deployments: register them with `esper server deploy`"])])

    def shut_down(self, *, server: subprocess.Popen, worker: subprocess.Popen | None) -> list[str]:
        """Stop the worker's flow runs, the worker and the server, all within ``SHUTDOWN_S`` s.

        In that order, so that Prefect hears how each flow run ended: the flow-run processes
        (and everything they started: data-parallel ranks, the policy server) get SIGTERM, which
        stops each run where it is, its last commit intact and its folder saying so
        (``stopped.json``); SIGKILL after ``FLOW_RUNS_STOP_S``. Then the worker. Then each flow
        run that was running is set to a Scheduled state named ``Resumable``, so that the
        next ``esper server start`` (any worker of the pool) picks it up again and it goes on
        from its last commit. Then the server. Whatever is left at the end gets SIGKILL.

        Returns:
            The ids of the flow runs left Resumable.
        """
        deadline = time.monotonic() + SHUTDOWN_S
        self.marker.unlink(missing_ok=True)  # no new command may pick this server now
        resumable: list[str] = []
        if worker is not None:
            flow_runs = descendants(worker)
            for process in flow_runs:  # SIGTERM first, before any API call that could be slow
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.terminate()
            # Which flow runs those processes were, asked while they wind down.
            stopped = self._flow_runs_of({str(p.pid) for p in flow_runs})
            terminate(flow_runs, timeout=deadline - (SHUTDOWN_S - FLOW_RUNS_STOP_S) - time.monotonic())
            stop(worker, timeout=max(0.5, (deadline - time.monotonic()) / 3))
            resumable = self._mark_resumable(stopped)
        stop(server, timeout=max(0.5, deadline - time.monotonic()))
        return resumable

    def _client(self) -> Any:
        from prefect.client.orchestration import get_client

        return get_client(sync_client=True)

    def _flow_runs_of(self, pids: set[str]) -> list[str]:
        """Ids of the pool's unfinished flow runs whose process is one of ``pids`` (none if the API fails)."""
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
            WorkPoolFilter,
            WorkPoolFilterName,
        )
        from prefect.client.schemas.objects import StateType
        from prefect.settings import PREFECT_API_URL, temporary_settings

        if not pids:
            return []
        # Crashed too: a run may already have reported how the SIGTERM ended it.
        states = [StateType.RUNNING, StateType.PENDING, StateType.CRASHED]
        try:
            with temporary_settings({PREFECT_API_URL: self.api_url}), self._client() as client:
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states))),
                    work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[POOL])),
                )
        except Exception as e:  # noqa: BLE001 - a server that no longer answers must not stop the shutdown
            print(
                f"could not list the flow runs in progress ({e}); the next `esper server start` or `esper server "
                "worker` reschedules those left Running, `prefect flow-run retry <id>` the others"
            )
            return []
        return [str(run.id) for run in runs if run.infrastructure_pid in pids]

    def _mark_resumable(self, flow_run_ids: list[str]) -> list[str]:
        from prefect.settings import PREFECT_API_URL, temporary_settings
        from prefect.states import Scheduled

        message = "stopped by esper server's shutdown; goes on from its last commit when a worker of the pool is up"
        done = []
        try:
            with temporary_settings({PREFECT_API_URL: self.api_url}), self._client() as client:
                for run_id in flow_run_ids:
                    when = _resume_time(client, run_id)
                    state = Scheduled(name=RESUMABLE, message=message, scheduled_time=when)
                    client.set_flow_run_state(run_id, state, force=True)
                    done.append(run_id)
        except Exception as e:  # noqa: BLE001 - as above: the shutdown goes on
            left = ", ".join(i for i in flow_run_ids if i not in done)
            print(
                f"could not mark flow runs resumable ({e}): {left}; the next `esper server start` or `esper server "
                "worker` reschedules those left Running, `prefect flow-run retry <id>` the others"
            )
        return done

    def start_worker(self) -> subprocess.Popen:
        """Start a process worker on the pool (``esper server`` sweeps with ``recover_orphans`` beside it)."""
        name = worker_name_prefix() + uuid4().hex[:8]
        return self._spawn(
            _prefect("worker", "start", "--pool", POOL, "--type", "process", "--name", name), "worker.log"
        )

    def recover_orphans(self) -> list[str]:
        """Reschedule the pool's flow runs whose process died with its worker.

        A run left RUNNING or PENDING by a worker of this machine whose flow-run process
        (``infrastructure_pid``) no longer exists is marked Crashed and scheduled again, as
        ``prefect flow-run retry`` would; its next execution resumes from the last committed epoch.
        So is a run the zombie automation marked Crashed (its heartbeats stopped; ``deploy_ops``),
        unless it ran here and its process still does. The pid check is the local fallback, faster
        than the automation's 90 s; a run of another machine is left to the heartbeats.

        Safe beside live workers (``esper server`` calls it every ``server.ORPHAN_SWEEP_S``): a
        run without a pid yet, or whose pid runs here, is not touched, nor one Pending for less
        than ``PENDING_GRACE_S`` (its pid may be its previous execution's), nor one that moved on
        between the listing and the check. A run Crashed for another reason is left to a person.

        Returns:
            The ids of the rescheduled flow runs.
        """
        # Imported here: the other commands of `esper server` must not pay for Prefect's import.
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
            WorkPoolFilter,
            WorkPoolFilterName,
        )
        from prefect.client.schemas.objects import StateType
        from prefect.exceptions import ObjectNotFound
        from prefect.settings import PREFECT_API_URL, temporary_settings
        from prefect.states import Crashed, Scheduled

        rescheduled = []
        with temporary_settings({PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING, StateType.CRASHED])
                    )
                ),
                work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[POOL])),
            )
            now, here = datetime.now(UTC), worker_name_prefix()
            for run in runs:
                if not _orphaned(run, now, here):
                    continue
                # The listing is a moment old: act only on a run still where it was then. Its process
                # is gone and can no longer move it on; a run that ended or restarted meanwhile can.
                try:
                    current = client.read_flow_run(run.id)
                except ObjectNotFound:
                    continue  # deleted meanwhile
                pid = run.infrastructure_pid
                if (current.state_id, current.infrastructure_pid) != (run.state_id, pid):
                    continue
                message = f"flow-run process {pid} is gone (its worker died); rescheduled by esper server"
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                when = _resume_time(client, run.id)
                client.set_flow_run_state(run.id, Scheduled(message=message, scheduled_time=when), force=True)
                rescheduled.append(str(run.id))
        return rescheduled


def _resume_time(client: Any, run_id: Any) -> datetime | None:
    """When a rescheduled flow run may start: ``CANCEL_REPLAY_S`` after its last Cancelling
    state if that is still ahead, else None (now)."""
    from prefect.client.schemas.objects import StateType

    cancels = [s.timestamp for s in client.read_flow_run_states(run_id) if s.type is StateType.CANCELLING]
    if not cancels:
        return None
    when = max(cancels) + timedelta(seconds=CANCEL_REPLAY_S)
    return when if when > datetime.now(UTC) else None


def _orphaned(run: Any, now: datetime, here: str) -> bool:
    """Whether the Running, Pending or Crashed flow run ``run`` lost its process; ``here`` as
    ``worker_name_prefix()``."""
    from prefect.client.schemas.objects import StateType

    state, pid = run.state, run.infrastructure_pid
    if state is None or not pid or not pid.isdigit():
        return False  # no pid: the worker has not started its process yet
    zombie = state.type is StateType.CRASHED
    if zombie and state.message != deploy_ops.ZOMBIE_MESSAGE:
        return False  # crashed for another reason: a person decides whether to retry it
    if state.type is StateType.PENDING and (now - state.timestamp).total_seconds() < PENDING_GRACE_S:
        return False  # being submitted: its pid (and worker) may still be the previous execution's
    if not str(run.labels.get(WORKER_LABEL, "")).startswith(here):
        return zombie  # its pid is another machine's: only the heartbeats can tell
    # A pid reused by another process looks alive: that run is never run twice, only left to the
    # zombie automation and then to a person.
    return not pid_alive(int(pid))
