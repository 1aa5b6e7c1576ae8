"""``esper server``: a local Prefect server with the UI and a worker for the ``esper`` pool."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from esper_cli.local_prefect import LocalPrefect
from esper_cli.prefect_processes import stop

ORPHAN_SWEEP_S = 30.0
"""While their worker runs, ``esper server start`` and ``esper server worker`` look this often for
flow runs orphaned by a dead worker (one API query). A third of the zombie automation's 90 s: a run
it marks Crashed, or whose process died with a worker that was then restarted, waits at most this
long to be rescheduled, not until a person retries it."""


def _local(args: argparse.Namespace) -> LocalPrefect:
    from esper_core.settings import EsperSettings

    return LocalPrefect(home=EsperSettings().home, port=args.port)


def sweep_orphans(local: LocalPrefect, *, next_in_s: float) -> list[str]:
    """Reschedule the flow runs a dead worker left behind (``LocalPrefect.recover_orphans``), saying so.

    Each rescheduled run is printed. A sweep that fails (the server briefly unreachable) prints
    one line and returns nothing; the next one, ``next_in_s`` later, tries again.

    Returns:
        The ids of the rescheduled flow runs.
    """
    try:
        rescheduled = local.recover_orphans()
    except Exception as e:  # noqa: BLE001 - a failed sweep must not stop the worker or the server; it is printed
        print(
            f"could not look for flow runs orphaned by a dead worker ({type(e).__name__}: {e}); "
            f"trying again in {next_in_s:.0f} s",
            flush=True,
        )
        return []
    if rescheduled:
        print(
            f"rescheduled {len(rescheduled)} flow run(s) orphaned by a dead worker: {', '.join(rescheduled)}",
            flush=True,
        )
    return rescheduled


class Sweeper:
    """Runs ``sweep_orphans`` every ``every_s`` in a daemon thread, one sweep at a time.

    Never on the main thread: SIGTERM and Ctrl-C land there as an exception (``main.Terminated``),
    and one raised inside the API client's pydantic serialisers came back wrapped as a
    ``PydanticSerializationError``, which a failed sweep's handler took for a server error and
    printed, so the stop was lost (a real ``esper server start`` kept running after SIGTERM).
    """

    def __init__(self, local: LocalPrefect, *, every_s: float) -> None:
        self.local, self.every_s = local, every_s
        self._next = 0.0  # the first poll sweeps
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        """Start a sweep if one is due and none is running."""
        if time.monotonic() < self._next or (self._thread is not None and self._thread.is_alive()):
            return
        self._next = time.monotonic() + self.every_s
        self._thread = threading.Thread(
            target=sweep_orphans, args=(self.local,), kwargs={"next_in_s": self.every_s}, daemon=True
        )
        self._thread.start()

    def now(self) -> None:
        """Make the next ``poll`` sweep (the runs a worker that just died was executing)."""
        self._next = 0.0

    def settle(self, timeout_s: float = 2.0) -> None:
        """Wait a little for a running sweep, so that it does not race the shutdown's own state changes."""
        if self._thread is not None:
            self._thread.join(timeout_s)


def _cmd_start(args: argparse.Namespace) -> int:
    local = _local(args)
    # Ctrl-C and SIGTERM (main() turns it into KeyboardInterrupt) end up in the `finally`, from
    # any point: start_server stops its own child when interrupted before it answers.
    server = local.start_server()
    worker = None
    sweeper = Sweeper(local, every_s=ORPHAN_SWEEP_S)
    try:
        local.announce(server)  # `esper run` in this home uses this server from now on
        local.ensure_pool()
        if not args.no_worker:
            sweeper.poll()
            worker = local.start_worker()
        print(f"Prefect UI   {local.ui_url}")
        print(f"API          {local.api_url}  (database and logs in {local.prefect_home})")
        print(f"worker       {'pool esper, log ' + str(local.prefect_home / 'worker.log') if worker else 'none'}")
        print(f"in another shell: export PREFECT_API_URL={local.api_url}; make deploy")
        print(
            "Ctrl-C (or SIGTERM) stops the server, the worker and its flow runs (resumed at the next start).",
            flush=True,
        )
        while server.poll() is None:
            if worker is not None and worker.poll() is not None:
                print(
                    f"the worker exited ({worker.returncode}); restarting it (log: {local.prefect_home / 'worker.log'})",
                    flush=True,
                )
                worker = local.start_worker()
                sweeper.now()  # the runs the dead worker was executing: at once
            if worker is not None:
                sweeper.poll()
            time.sleep(1.0)
        print(f"the Prefect server exited ({server.returncode}); see {local.prefect_home / 'server.log'}")
        return 1
    finally:
        sweeper.settle()
        resumable = local.shut_down(server=server, worker=worker)
        if resumable:
            print(f"{len(resumable)} flow run(s) stopped, resumable at the next start: {', '.join(resumable)}")


def _cmd_deploy(args: argparse.Namespace) -> int:
    print(_local(args).deploy())
    return 0


def run_worker(local: LocalPrefect, *, sweep_every_s: float) -> int:
    """Run a worker on the pool until it exits, sweeping for orphaned flow runs meanwhile.

    One sweep (``sweep_orphans``, in a ``Sweeper`` thread) as the worker starts and one every
    ``sweep_every_s`` while it runs. Ctrl-C or SIGTERM (``KeyboardInterrupt``) stops the worker and
    its flow runs.

    Returns:
        The worker's exit status.
    """
    sweeper = Sweeper(local, every_s=sweep_every_s)
    sweeper.poll()
    worker = local.start_worker()
    print(
        f"worker on pool esper against {local.api_url}; log {local.prefect_home / 'worker.log'}; Ctrl-C stops it",
        flush=True,
    )
    try:
        while worker.poll() is None:
            sweeper.poll()
            time.sleep(min(1.0, sweep_every_s))
        return worker.returncode
    finally:
        sweeper.settle()
        stop(worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    return run_worker(_local(args), sweep_every_s=ORPHAN_SWEEP_S)


def _cmd_status(args: argparse.Namespace) -> int:
    print(_local(args).status())
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    local = _local(args)
    print(f"export PREFECT_API_URL={local.api_url}")
    print(f"export ESPER_HOME={Path(local.home)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``server start|deploy|worker|status|env``."""
    server = sub.add_parser("server", help="local Prefect server, worker and deployments").add_subparsers(
        dest="server_command", required=True, metavar="ACTION"
    )
    commands = (
        ("start", "run the server (UI on 127.0.0.1) and a worker for the esper pool in the foreground", _cmd_start),
        (
            "deploy",
            "register every deployment in prefect.yaml with the running server (keeping each schedule's "
            "on/off switch) and the automation that marks zombie flow runs Crashed",
            _cmd_deploy,
        ),
        (
            "worker",
            "run only a worker, rescheduling the runs a dead worker left behind (at its start and every "
            f"{ORPHAN_SWEEP_S:.0f} s)",
            _cmd_worker,
        ),
        ("status", "the server, its deployments and whether each schedule is switched on", _cmd_status),
        ("env", "print the export lines that point the prefect CLI at the server", _cmd_env),
    )
    for name, text, func in commands:
        p = server.add_parser(name, help=text)
        p.add_argument("--port", type=int, default=4200, help="server port on 127.0.0.1 (default: %(default)s)")
        if name == "start":
            p.add_argument("--no-worker", action="store_true", help="start only the server")
        p.set_defaults(func=func)
