"""Run one function in a child process that a time limit can stop (``run_in_child``).

A thread cannot be stopped inside a C call (one ``torch.export``, one Inductor compile), so work
that must obey a time limit while its caller waits runs in a child process instead. When the
limit passes, the child and its own children (Inductor's compile workers) are killed as one
process group. The child also exits when its parent dies: it watches the pipe on its stdin, so an
interrupted or killed caller leaves no process behind.

The child is a fresh interpreter (``python -m esper_core.child``), so it works from any parent:
a flow-run process, a thread of a task runner, or a Dask worker (a daemon process, which
``multiprocessing`` would refuse children). Its ``esper_core`` log records come back with the
result and are handed to the parent's loggers, so they reach the same handlers (a Prefect run's
logs included) as if the work had run in the parent.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

import cloudpickle

_LOGGER = "esper_core"


class ChildTimeoutError(TimeoutError):
    """The child ran past its time limit and was killed with its process group."""


def run_in_child(target: str, /, *args: Any, limit_s: float, **kwargs: Any) -> Any:
    """Call ``target(*args, **kwargs)`` in a child process and return its result.

    Args:
        target: ``package.module:function``, importable in a fresh interpreter with this one's
            ``sys.path``. Arguments and result go through cloudpickle, so a function among them
            (a benchmark workload registered at run time, a closure) travels by value.
        *args: Positional arguments of ``target``.
        limit_s: Seconds the child may run; then it is killed.
        **kwargs: Keyword arguments of ``target``.

    Returns:
        What ``target`` returned.

    Raises:
        ChildTimeoutError: The child ran past ``limit_s`` and was stopped.
        Exception: Whatever ``target`` raised, re-raised here (the child's traceback is a note).
    """
    if limit_s <= 0:
        raise ValueError(f"limit_s must be positive, got {limit_s}; pass the task's time limit in seconds")
    level = logging.getLogger(_LOGGER).getEffectiveLevel()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with tempfile.TemporaryDirectory(prefix="esper-child-") as tmp:
        out = Path(tmp) / "result.pkl"
        child = subprocess.Popen(
            [sys.executable, "-m", "esper_core.child", str(out)],
            stdin=subprocess.PIPE,
            env=env,
            start_new_session=True,  # one group: the kill reaches Inductor's compile workers too
        )
        try:
            assert child.stdin is not None
            child.stdin.write(cloudpickle.dumps((target, args, kwargs, level)))
            child.stdin.flush()  # stdin stays open: its EOF tells the child that this process died
            try:
                child.wait(timeout=limit_s)
            except subprocess.TimeoutExpired as e:
                raise ChildTimeoutError(f"{target} ran past its time limit of {limit_s:g} s and was stopped") from e
        finally:
            _kill_group(child)
        if not out.exists():
            raise RuntimeError(f"the child process running {target} died with exit code {child.returncode}")
        outcome, value, records = pickle.loads(out.read_bytes())
    for record in records:
        logging.getLogger(record.name).handle(record)
    if outcome == "error":
        error, child_traceback = value
        error.add_note(f"in the child process:\n{child_traceback}")
        raise error
    return value


def _kill_group(child: subprocess.Popen) -> None:
    if child.stdin is not None:
        child.stdin.close()
    # The whole group, also when the child has exited: its compile workers may not have.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Formatted here: arguments and exc_info need not pickle.
        record.msg = record.getMessage()
        if record.exc_info:
            record.msg += "\n" + "".join(traceback.format_exception(*record.exc_info))
        record.args, record.exc_info, record.exc_text = None, None, None
        self.records.append(record)


def _die_with_parent() -> None:
    sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _main(out: Path) -> None:
    target, args, kwargs, level = pickle.load(sys.stdin.buffer)
    threading.Thread(target=_die_with_parent, daemon=True).start()
    collect = _Collect()
    logger = logging.getLogger(_LOGGER)
    logger.setLevel(level)
    logger.addHandler(collect)
    logger.propagate = False
    module, _, name = target.partition(":")
    try:
        result: tuple[str, Any] = ("ok", getattr(importlib.import_module(module), name)(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - every failure goes back to the parent, which re-raises it
        result = ("error", (e, traceback.format_exc()))
    try:
        payload = cloudpickle.dumps((*result, collect.records))
    except Exception as e:  # noqa: BLE001 - an unpicklable result or exception becomes a readable one
        payload = pickle.dumps(("error", (RuntimeError(f"{target}: {result[0]} did not pickle: {e}"), ""), []))
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(payload)
    tmp.rename(out)  # the parent sees a whole result or none


if __name__ == "__main__":
    _main(Path(sys.argv[1]))
    # The result is written: skip the interpreter's shutdown, which would wait on threads the
    # work left behind (compile worker pools); the parent kills the process group anyway.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
