"""Calls under a deadline: run on a worker thread, waited for at most so long.

The workers are daemon threads kept for the life of the process and reused call after call, not
a thread started per call: each start is a moment in which a Prefect task timeout can be lost to
the new thread on Python 3.11 (``esper_core.threads``). A thread per decision turned a grow
task's 1 s limit into a hang (reproduced: 5 hangs in 40 timeouts of a loop of deadline calls).
Reused workers start once a process, and again only while a call that overran its deadline still
holds its worker; they start without waiting (``start_daemon``), so if that rare start meets the
race the caller sees a missed deadline instead of a hang, and the next call starts another.
``concurrent.futures.ThreadPoolExecutor`` would reuse threads too, but it starts them with
``Thread.start()``, caps them (calls queue behind overrun ones) and is lost in a forked child.
"""

from __future__ import annotations

import contextvars
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from esper_core.threads import start_daemon

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadlineResult(Generic[T]):
    """What a call under a deadline produced."""

    value: T | None
    elapsed_ms: float
    timed_out: bool
    error: BaseException | None = None


_Job = Callable[[], None]


class _Workers:
    """Idle worker threads, each waiting on its own job queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job]] = []

    def submit(self, job: Callable[[Callable[[], None]], None]) -> None:
        """Run ``job(release)`` on an idle worker (a new one if none is idle); the job calls
        ``release`` once it is done with the worker, before it tells its caller it is done."""
        with self._lock:
            jobs = self._idle.pop() if self._idle else None
        if jobs is None:
            jobs = queue.SimpleQueue()
            start_daemon(functools.partial(_serve, jobs), name="esper-deadline")

        def release() -> None:
            with self._lock:
                self._idle.append(jobs)

        jobs.put(lambda: job(release))

    def forget(self) -> None:
        """Drop every idle worker (a forked child has none of its parent's threads)."""
        self._lock = threading.Lock()
        self._idle = []


def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
    while True:
        job = jobs.get()
        # Each call runs in a context of its own, as it would on a thread of its own: context
        # variables one call sets do not reach the next.
        contextvars.Context().run(job)


_WORKERS = _Workers()
os.register_at_fork(after_in_child=_WORKERS.forget)


def call_with_deadline(fn: Callable[[], T], deadline_ms: float) -> DeadlineResult[T]:
    """Run ``fn`` on a worker thread and wait at most ``deadline_ms``.

    A call that overruns keeps running on its worker, but its result is dropped: ``fn`` must not
    change shared state (the caller records results on its own thread). Its worker serves other
    calls once it returns. A result is on time only if it is there within ``deadline_ms`` as this
    thread measures it: one that the worker finished before this thread came to wait, but later
    than the deadline, is a miss too. Otherwise a deadline no call can meet would be met whenever
    the worker happened to run first. (Near a reachable deadline the scheduler still decides, as
    it decides how long any call takes.)
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def job(release: Callable[[], None]) -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which decides
            box["error"] = e
        finally:
            # Idle again before the caller hears of it, so its next call reuses this worker.
            release()
            done.set()

    start = time.perf_counter()
    _WORKERS.submit(job)
    finished = done.wait(deadline_ms / 1e3)
    elapsed = (time.perf_counter() - start) * 1e3
    if not finished or elapsed > deadline_ms:
        return DeadlineResult(value=None, elapsed_ms=elapsed, timed_out=True)
    return DeadlineResult(value=box.get("value"), elapsed_ms=elapsed, timed_out=False, error=box.get("error"))


def decide_within(fn: Callable[[], T], deadline_ms: float, *, enforce: bool) -> DeadlineResult[T]:
    """``fn`` under ``deadline_ms`` when ``enforce``, else on this thread, timed and never cut
    short (``SafetyConfig.enforce_deadlines``); an exception is returned either way."""
    if enforce:
        return call_with_deadline(fn, deadline_ms)
    start = time.perf_counter()
    try:
        value, error = fn(), None
    except Exception as e:  # noqa: BLE001 - handed to the caller, as call_with_deadline hands it
        value, error = None, e
    return DeadlineResult(value=value, elapsed_ms=(time.perf_counter() - start) * 1e3, timed_out=False, error=error)
