"""``esper runs``: the runs under $ESPER_HOME/runs (list, show, verify their checkpoints)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict


def _unknown_run(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """An unknown run id: its message (where it looked, how to list runs) and exit 2, no traceback."""

    def run(args: argparse.Namespace) -> int:
        from esper_core.run.inventory import UnknownRunError

        try:
            return command(args)
        except UnknownRunError as e:
            print(f"esper: error: {e}", file=sys.stderr)
            return 2

    return run


def _runs_dir():  # noqa: ANN202 - a Path; settings imported lazily so `esper --help` stays fast
    from esper_core.settings import EsperSettings

    return EsperSettings().runs_dir


def _cmd_list(args: argparse.Namespace) -> int:
    from esper_core.run.inventory import list_runs

    runs = list_runs(_runs_dir())
    if args.json:
        print(json.dumps([asdict(r) for r in runs], indent=2, default=str))
        return 0
    if not runs:
        print(f"no runs under {_runs_dir()}; start one with `esper run`")
        return 0
    print(f"{'run id':<28} {'recipe':<24} {'epochs':>7} {'last commit':<22} status")
    for r in runs:
        epochs = f"{r.epochs_done}/{r.epochs if r.epochs is not None else '?'}"
        print(f"{r.run_id:<28} {r.recipe:<24} {epochs:>7} {r.last_commit or '-':<22} {r.status}")
    return 0


@_unknown_run
def _cmd_show(args: argparse.Namespace) -> int:
    from esper_core.run.inventory import run_info, set_aside, verify_run
    from esper_core.run.spec_file import SPEC_FILE

    runs_dir = _runs_dir()
    info = run_info(runs_dir, args.run_id)
    checks = verify_run(runs_dir, args.run_id)
    aside = set_aside(runs_dir, args.run_id)
    spec = json.loads((info.run_dir / SPEC_FILE).read_text())
    if args.json:
        out = {
            **asdict(info),
            "spec": spec,
            "checkpoints": [asdict(c) for c in checks],
            "set_aside": [str(p) for p in aside],
        }
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"run      {info.run_id} ({info.status}) in {info.run_dir}")
    print(f"spec     {json.dumps(spec)}")
    print(f"epochs   {info.epochs_done}/{info.epochs if info.epochs is not None else '?'} applied")
    print(f"latest   {info.last_commit or '-'}")
    if info.stop is not None:
        print(
            f"stopped  {info.stop.stopped_at}: {info.stop.reason}; goes on from {info.stop.last_commit or 'its start'}"
        )
        for command in info.stop.resume:
            print(f"resume   {command}")
    print("checkpoints")
    for c in checks:
        print(f"  {c.tag:<22} {c.status:<10} {c.problem}")
    for path in aside:
        print(f"  set aside: {path}")
    return 0


@_unknown_run
def _cmd_verify(args: argparse.Namespace) -> int:
    from esper_core.run.inventory import verify_run

    checks = verify_run(_runs_dir(), args.run_id)
    damaged = [c for c in checks if c.status == "damaged"]
    for c in checks:
        if c.status != "intact":
            print(f"{c.status}: {c.path}: {c.problem}", file=sys.stderr if c.status == "damaged" else sys.stdout)
    if damaged:
        print(
            f"{len(damaged)} of {len(checks)} checkpoint(s) of run {args.run_id} damaged; resuming it "
            f"(`esper run --run-id {args.run_id}`) sets them aside and goes on from the newest intact commit",
            file=sys.stderr,
        )
        return 1
    print(f"run {args.run_id}: {len(checks)} checkpoint(s) intact")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``runs list|show|verify``."""
    runs = sub.add_parser("runs", help="the runs under $ESPER_HOME/runs and their checkpoints").add_subparsers(
        dest="runs_command", required=True, metavar="ACTION"
    )
    r_list = runs.add_parser("list", help="every run: recipe, epochs applied / asked, last commit, status")
    r_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r_list.set_defaults(func=_cmd_list)
    r_show = runs.add_parser("show", help="one run: its spec and its checkpoints, each verified")
    r_show.add_argument("run_id", metavar="RUN_ID", help="run id (see `esper runs list`)")
    r_show.add_argument("--json", action="store_true", help="print JSON")
    r_show.set_defaults(func=_cmd_show)
    r_verify = runs.add_parser(
        "verify", help="check every checkpoint of a run against its digest (exit 1 if any is damaged)"
    )
    r_verify.add_argument("run_id", metavar="RUN_ID", help="run id (see `esper runs list`)")
    r_verify.set_defaults(func=_cmd_verify)
