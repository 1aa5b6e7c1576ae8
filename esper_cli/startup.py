"""Where the time goes between the command and a run's first epoch (``esper -v run``).

Wall-clock readings for the operator only: nothing here decides anything about the run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil

from esper_cli.temporary_server import TemporaryServer


class StartupPhases:
    """Checkpoints of a command's start-up, timed from the process's own start."""

    def __init__(self) -> None:
        # The process's start, not this call's: the interpreter's and esper_cli's own start-up count.
        self.started = psutil.Process().create_time()
        self.phases: list[tuple[str, float]] = [("interpreter", time.time())]

    def mark(self, phase: str) -> None:
        """``phase`` ended now."""
        self.phases.append((phase, time.time()))

    def describe(self, server: TemporaryServer | None, *, first_epoch_at: float | None) -> str:
        """One line per phase with its seconds, then the temporary server's start and the first epoch."""
        lines = ["start-up (wall seconds since the command):"]
        previous = self.started
        for phase, at in self.phases:
            lines.append(f"  {phase:<18} {at - previous:6.2f} s   (at {at - self.started:6.2f} s)")
            previous = at
        if server is not None and server.ready_s is not None:
            lines.append(
                f"  Prefect's temporary server answered {server.ready_s:.2f} s after it was started, beside "
                f"the work above; the command waited {server.waited_s:.2f} s of it"
            )
        if first_epoch_at is not None:
            lines.append(f"  first epoch committed at {first_epoch_at - self.started:.2f} s")
        return "\n".join(lines)


def first_epoch_time(run_dir: str | Path, *, after: float) -> float | None:
    """When this command's first trained epoch reached the run's telemetry (Unix time), if one did.

    ``after``: the command's start; earlier packets are an earlier command's (a resumed run).
    """
    path = Path(run_dir) / "telemetry.jsonl"
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            packet = json.loads(line)
            if packet.get("source") == "tolaria" and packet.get("epoch") is not None and packet["timestamp"] >= after:
                return float(packet["timestamp"])
    return None
