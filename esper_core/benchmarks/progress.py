"""Progress: where a benchmark reports its steps, between timed regions."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Protocol


class Progress(Protocol):
    """Where a benchmark reports its steps (the CLI draws a progress bar on stderr from them).

    A benchmark calls it between timed regions, never inside one, and enters ``ticking()`` only
    around waits in which this process times nothing (a child process compiling).
    """

    def __call__(self, description: str, completed: int, total: int | None) -> None:
        """``completed`` of ``total`` steps are done (``total`` None: not known)."""

    def ticking(self) -> AbstractContextManager[None]:
        """Keep the display alive (spinner, elapsed time) until the block ends."""


class NoProgress:
    """The default ``Progress``: reports nothing."""

    def __call__(self, description: str, completed: int, total: int | None) -> None:
        """Report nothing."""

    def ticking(self) -> AbstractContextManager[None]:
        """Nothing to keep alive."""
        return contextlib.nullcontext()


NO_PROGRESS = NoProgress()
