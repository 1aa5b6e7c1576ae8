"""Functions that ``esper_core.child`` tests run in a child process (importable by path there)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path


def log_and_double(x: int) -> int:
    """Log one record under ``esper_core`` and return ``2 * x``."""
    logging.getLogger("esper_core.child_test").warning("doubling %d", x)
    return 2 * x


def sleep_in_grandchild(pid_file: Path) -> None:
    """Start a grandchild that writes its pid and sleeps a minute; wait for it."""
    subprocess.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], check=True)


def pid_and_threads() -> tuple[int, str | None]:
    """This process's id and its ``OMP_NUM_THREADS``."""
    return os.getpid(), os.environ.get("OMP_NUM_THREADS")


def print_and_return(x: int) -> int:
    """Print to stdout (the child's stdout is the parent's signal pipe) and return ``x``."""
    print("a line on stdout", flush=True)
    return x


def exit_at_once(code: int) -> None:
    """Leave the process without a result."""
    os._exit(code)
