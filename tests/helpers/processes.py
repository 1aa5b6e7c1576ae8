"""Reading other processes' state without racing their exit.

A process can end between any two reads of ``/proc`` (``is_running()`` true, then ``status()``
raises ``NoSuchProcess``). Tests that wait for processes to end must count that as ended, not fail.
"""

from __future__ import annotations

import psutil


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a process that vanishes while being read is not alive."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pid_alive(pid: int) -> bool:
    try:
        return alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def command_line(process: psutil.Process) -> str:
    """The process's command line, or "" once it has ended."""
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""
