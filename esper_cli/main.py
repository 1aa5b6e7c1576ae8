"""``esper``: run the main job, inspect the catalogue and registry, run benchmarks.

Each command group lives in its own module with a ``register(sub)`` function. Prefect is
imported only by the commands that run flows, so ``esper --help`` and the inspection commands
start quickly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from esper_cli import bench, catalog, recipes, registry, run, server

COMMAND_GROUPS = (run, recipes, catalog, registry, bench, server)


def build_parser() -> argparse.ArgumentParser:
    """The full ``esper`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="esper",
        description="Grow neural networks while they train. Outputs live under $ESPER_HOME (default ./.esper).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``esper`` console command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as e:
        # Configuration and input errors carry their fix in the message; no traceback needed.
        print(f"esper: error: {e}", file=sys.stderr)
        return 2
