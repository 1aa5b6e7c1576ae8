"""``esper server``: a local Prefect server with the UI and a worker for the ``esper`` pool."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from esper_cli.local_prefect import LocalPrefect, stop


def _local(args: argparse.Namespace) -> LocalPrefect:
    from esper_core.settings import EsperSettings

    return LocalPrefect(home=EsperSettings().home, port=args.port)


def _cmd_start(args: argparse.Namespace) -> int:
    local = _local(args)
    # Ctrl-C and SIGTERM (main() turns it into KeyboardInterrupt) end up in the `finally`, from
    # any point: start_server stops its own child when interrupted before it answers.
    server = local.start_server()
    worker = None
    try:
        local.announce(server)  # `esper run` in this home uses this server from now on
        local.ensure_pool()
        if not args.no_worker:
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
                    f"the worker exited ({worker.returncode}); restarting it (log: {local.prefect_home / 'worker.log'})"
                )
                worker = local.start_worker()
            time.sleep(1.0)
        print(f"the Prefect server exited ({server.returncode}); see {local.prefect_home / 'server.log'}")
        return 1
    finally:
        resumable = local.shut_down(server=server, worker=worker)
        if resumable:
            print(f"{len(resumable)} flow run(s) stopped, resumable at the next start: {', '.join(resumable)}")


def _cmd_deploy(args: argparse.Namespace) -> int:
    print(_local(args).deploy())
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    local = _local(args)
    rescheduled = local.recover_orphans()
    if rescheduled:
        print(f"rescheduled {len(rescheduled)} flow run(s) orphaned by a dead worker: {', '.join(rescheduled)}")
    worker = local.start_worker()
    print(f"worker on pool esper against {local.api_url}; log {local.prefect_home / 'worker.log'}; Ctrl-C stops it")
    try:
        return worker.wait()
    finally:
        stop(worker)


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
        ("worker", "run only a worker (after rescheduling runs a dead worker left behind)", _cmd_worker),
        ("status", "the server, its deployments and whether each schedule is switched on", _cmd_status),
        ("env", "print the export lines that point the prefect CLI at the server", _cmd_env),
    )
    for name, text, func in commands:
        p = server.add_parser(name, help=text)
        p.add_argument("--port", type=int, default=4200, help="server port on 127.0.0.1 (default: %(default)s)")
        if name == "start":
            p.add_argument("--no-worker", action="store_true", help="start only the server")
        p.set_defaults(func=func)
