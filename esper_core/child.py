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

A child can serve several calls one after another (``reuse=True``): starting an interpreter and
importing torch costs 1-2 s, more than a small kernel's compile. A reused child is one that
finished its last call in time; one that overran or died is never reused.

Protocol: the parent writes requests on the child's stdin (the path for the result, then a
cloudpickle of the target, its arguments and the log level, each after its 8-byte length); the
child writes the result there (atomically) and then one byte on its stdout, which is reserved for
that (the target's prints go to stderr). A request that does not unpickle is answered as an
error; EOF on stdin (or a request cut short) tells the child that its parent is gone.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import queue
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from esper_core.threads import start_daemon

_LOGGER = "esper_core"

IDLE_S = 30.0
"""Seconds a reusable child waits for its next call before it is stopped."""


class ChildTimeoutError(TimeoutError):
    """The child ran past its time limit and was killed with its process group."""


def run_in_child(
    target: str, /, *args: Any, limit_s: float, threads: int | None = None, reuse: bool = False, **kwargs: Any
) -> Any:
    """Call ``target(*args, **kwargs)`` in a child process and return its result.

    Args:
        target: ``package.module:function``, importable in a fresh interpreter with this one's
            ``sys.path``. Arguments and result go through cloudpickle, so a function among them
            (a benchmark workload registered at run time, a closure) travels by value.
        *args: Positional arguments of ``target``.
        limit_s: Seconds the child may run; then it is killed.
        threads: Intra-op threads of the child's torch (``OMP_NUM_THREADS``), for children that
            run beside others: torch takes every core by default, and two such processes on the
            same cores spin against each other (on 2 cores, two concurrent kernel compiles each
            took 30x as long as alone). ``None``, or an ``OMP_NUM_THREADS`` already set in this
            process's environment (Dask's workers set 1), leaves the environment as it is.
        reuse: Run in an idle child that an earlier call with the same environment and
            ``threads`` left (else start one), and keep the child for the next such call for
            ``IDLE_S`` seconds. For many short calls of one kind (kernel compiles), where the
            child's start would cost more than the work; not for work that should start clean
            (a timed benchmark case) or leaves a large process behind.
        **kwargs: Keyword arguments of ``target``.

    Returns:
        What ``target`` returned.

    Raises:
        ChildTimeoutError: The child ran past ``limit_s`` and was stopped.
        RuntimeError: The child died before it returned a result.
        Exception: Whatever ``target`` raised, re-raised here (the child's traceback is a note).
    """
    if limit_s <= 0:
        raise ValueError(f"limit_s must be positive, got {limit_s}; pass the task's time limit in seconds")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 or None (torch's default), got {threads}")
    env = _child_env(threads)
    child = _POOL.take(env) if reuse else _Child.start(env)
    kept = False
    try:
        outcome, value, records = child.call(target, args, kwargs, limit_s)
        # A target that raised may have left its process in a state not worth inheriting (a
        # sticky CUDA error, a compiler's half-built state): only a clean return is kept.
        kept = reuse and outcome == "ok"
    finally:
        if kept:
            _POOL.put(child)
        else:
            child.kill()
    for record in records:
        logging.getLogger(record.name).handle(record)
    if outcome == "error":
        error, child_traceback = value
        error.add_note(f"in the child process:\n{child_traceback}")
        raise error
    return value


def _child_env(threads: int | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if threads is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


@dataclass(kw_only=True, slots=True)
class _Child:
    """A child interpreter serving calls (``python -m esper_core.child``) in its own process group."""

    process: subprocess.Popen
    env: dict[str, str]
    idle_since: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, env: dict[str, str]) -> _Child:
        process = subprocess.Popen(
            [sys.executable, "-m", "esper_core.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # one group: the kill reaches Inductor's compile workers too
        )
        return cls(process=process, env=env)

    def call(
        self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any], limit_s: float
    ) -> tuple[str, Any, list[logging.LogRecord]]:
        """Run one call; returns the child's ``(outcome, value, log records)``."""
        assert self.process.stdin is not None and self.process.stdout is not None
        level = logging.getLogger(_LOGGER).getEffectiveLevel()
        with tempfile.TemporaryDirectory(prefix="esper-child-") as tmp:
            out = Path(tmp) / "result.pkl"
            path, request = os.fsencode(out), cloudpickle.dumps((target, args, kwargs, level))
            try:
                self.process.stdin.write(_framed(path) + _framed(request))
                self.process.stdin.flush()
            except BrokenPipeError:
                self._died(target)
            if not self._answered(limit_s):
                self.kill()  # before the folder goes: a child finishing now would write into it
                raise ChildTimeoutError(f"{target} ran past its time limit of {limit_s:g} s and was stopped")
            if not os.read(self.process.stdout.fileno(), 1) or not out.exists():
                self._died(target)
            outcome, value, records = pickle.loads(out.read_bytes())
        return outcome, value, records

    def _answered(self, limit_s: float) -> bool:
        """Whether the child signalled (a result, or EOF: it died) within ``limit_s`` seconds."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + limit_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                # In pieces: a limit of days (or an unbounded setting) is no valid timeout.
                if selector.select(min(left, 3600.0)):
                    return True
        return False

    def _died(self, target: str) -> None:
        self.kill()
        raise RuntimeError(f"the child process running {target} died with exit code {self.process.returncode}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Stop the child and its process group (also when it has exited: its compile workers may not have)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class _Pool:
    """Idle reusable children, each kept ``IDLE_S`` seconds after its last call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._changed = threading.Event()
        self._reaper: threading.Event | None = None

    def take(self, env: dict[str, str]) -> _Child:
        """An idle child started with ``env`` (same variables, same thread count), or a new one."""
        with self._lock:
            for i, child in enumerate(self._idle):
                if child.env == env and child.alive():
                    return self._idle.pop(i)
        return _Child.start(env)

    def put(self, child: _Child) -> None:
        child.idle_since = time.monotonic()
        with self._lock:
            self._idle.append(child)
            if self._reaper is None:
                self._reaper = start_daemon(self._reap_forever, name="esper-child-reaper")
        self._changed.set()

    def _reap_forever(self) -> None:
        while True:
            self._changed.clear()  # before reading the list: a put after this wakes the wait below
            now = time.monotonic()
            with self._lock:
                expired = [c for c in self._idle if now - c.idle_since >= IDLE_S or not c.alive()]
                self._idle = [c for c in self._idle if c not in expired]
                due = min((c.idle_since + IDLE_S for c in self._idle), default=None)
            for child in expired:
                child.kill()
            self._changed.wait(None if due is None else max(0.0, due - time.monotonic()))

    def stop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()

    def forget(self) -> None:
        """In a forked process: the children are the parent's, not this process's to use or stop."""
        self._lock = threading.Lock()
        self._idle = []
        self._changed = threading.Event()
        self._reaper = None


_POOL = _Pool()
os.register_at_fork(after_in_child=_POOL.forget)


def stop_idle() -> None:
    """Stop every idle reusable child now (they would stop ``IDLE_S`` seconds after their last call)."""
    _POOL.stop_idle()


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


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _read_frame(stream: Any) -> bytes | None:  # noqa: ANN401 - a binary stream
    header = stream.read(8)
    if len(header) < 8:
        return None
    size = int.from_bytes(header, "big")
    data = stream.read(size)
    return data if len(data) == size else None


def _read_requests(requests: queue.SimpleQueue[tuple[Path, bytes]]) -> None:
    stdin = sys.stdin.buffer
    try:
        while (path := _read_frame(stdin)) is not None and (request := _read_frame(stdin)) is not None:
            requests.put((Path(os.fsdecode(path)), request))
    finally:
        # EOF or a request cut short: the parent closed the pipe or died; nothing is left to
        # serve, whatever runs now.
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _serve() -> None:
    ready = os.dup(1)
    os.dup2(2, 1)  # stdout is the parent's signal; the targets' prints go to stderr
    requests: queue.SimpleQueue[tuple[Path, bytes]] = queue.SimpleQueue()
    threading.Thread(target=_read_requests, args=(requests,), daemon=True).start()
    collect = _Collect()
    logger = logging.getLogger(_LOGGER)
    logger.addHandler(collect)
    logger.propagate = False
    while True:  # until the parent closes stdin (``_read_requests`` then stops the process)
        out, request = requests.get()
        collect.records = []
        target = "the request"
        try:
            target, args, kwargs, level = pickle.loads(request)
            logger.setLevel(level)
            module, _, name = target.partition(":")
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
        os.write(ready, b"\n")


if __name__ == "__main__":
    _serve()
