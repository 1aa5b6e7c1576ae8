"""``esper``: run the main job, inspect the catalogue and registry, run benchmarks.

Each command group lives in its own module with a ``register(sub)`` function. Building the
parser imports no library code: a command module imports ``esper_core``, torch and Prefect
inside the function that runs its command, and the values its options offer come from
``esper_cli.choices``. So ``--help``, ``--version`` and an argument error answer at once, and a
command pays only for what it uses (``tests/cli/test_startup_imports.py`` pins it).
"""

from __future__ import annotations

import argparse
import platform
import signal
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import version
from types import FrameType

from esper_cli import bench, catalog, export, policy, recipes, registry, run, runs, server
from esper_cli.progress import configure_logging

COMMAND_GROUPS = (run, runs, export, recipes, policy, catalog, registry, bench, server)


def build_parser() -> argparse.ArgumentParser:
    """The full ``esper`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="esper",
        description="Grow neural networks while they train. Outputs live under $ESPER_HOME (default ./.esper).",
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log Esper's steps on stderr: -v for INFO, -vv for DEBUG (default: warnings only)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def version_text() -> str:
    """``esper 0.1.0 (torch 2.13.0, prefect 3.9.1, Python 3.11.7)``: what a bug report needs.

    Versions come from the installed distributions' metadata, so nothing heavy is imported.
    """
    deps = ", ".join(f"{name} {version(name)}" for name in ("torch", "prefect"))
    return f"esper {version('esper')} ({deps}, Python {platform.python_version()})"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwound like Ctrl-C, so every ``finally`` and ``atexit`` handler runs."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``esper`` console command.

    SIGTERM (what systemd, Docker, Kubernetes and ``kill`` send) stops every command as Ctrl-C
    does: Python's default for SIGTERM ends the process at once, which left the children of
    ``esper server start`` and the temporary Prefect server of ``esper run`` running. Unwound as
    an interrupt, the commands stop their children, a flow run is marked as ended, and a run's
    last committed epoch stays resumable with ``--run-id``.

    Returns:
        The exit status: 0, 2 for a bad input, 130 after Ctrl-C, 143 after SIGTERM.
    """
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args))
    except ValueError as e:
        # Configuration and input errors carry their fix in the message; the traceback (with what
        # caused it, e.g. the user's loss failing) only when asked for with -v.
        if args.verbose:
            traceback.print_exception(e)
        print(f"esper: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        print(f"esper: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
