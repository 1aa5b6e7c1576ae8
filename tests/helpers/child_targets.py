"""Functions that ``esper_core.child`` tests run in a child process (importable by path there)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path


def log_and_double(x: int) -> int:
    """Log one record under ``esper_core`` and return ``2 * x``."""
    logging.getLogger("esper_core.child_test").warning("doubling %d", x)
    return 2 * x


def sleep_in_grandchild(pid_file: Path) -> None:
    """Start a grandchild that writes its pid and sleeps a minute; wait for it."""
    subprocess.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], check=True)
