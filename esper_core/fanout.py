"""Run independent jobs on Dask, or one after another here: the same results either way.

Benchmark runs and Simic's episodes are independent of each other once their seeds are fixed, so
they can spread over processes. ``FanOut`` says where: nowhere (``workers=0``, in this process,
in order), a ``LocalCluster`` of single-threaded worker processes on this machine, or a running
Dask scheduler (``address``). ``FanOut.map`` returns the results in the jobs' order whatever
order they finish in, and each job runs on one torch thread (``one_thread``), so a job gives the
same numbers bit for bit in this process, in a local worker or on another machine's worker.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from esper_core._capabilities import one_thread

T = TypeVar("T")
R = TypeVar("R")


def _on_one_thread(fn: Callable[[T], R], item: T) -> R:
    with one_thread():
        return fn(item)


@functools.cache
def _freeze_worker_heap() -> None:
    # A worker holds ~0.5 M objects from its imports (torch, Prefect, SQLAlchemy) that live as
    # long as it does, and every full collection walks them all: ~80 ms, about once per short
    # episode (8 % of a digits-mlp run). Frozen, the collector skips them. Garbage is collected
    # first, so nothing unreachable is frozen. Only on workers: a caller's own process is not
    # ours to tune.
    gc.collect()
    gc.freeze()


def _on_worker(fn: Callable[[T], R], item: T) -> R:
    _freeze_worker_heap()
    return _on_one_thread(fn, item)


@dataclass(frozen=True, kw_only=True, slots=True)
class FanOut:
    """Where independent jobs run.

    Attributes:
        workers: Worker processes (one thread each) of a ``LocalCluster`` on this machine; 0
            runs the jobs one after another in this process.
        address: A running Dask scheduler (``tcp://host:8786``) to use instead of a local
            cluster; its workers must see the same files (ESPER_HOME) and registry.
    """

    workers: int = 0
    address: str | None = None

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0: jobs run one after another here), got {self.workers}")

    @property
    def local(self) -> bool:
        """Whether jobs run in this process (no cluster)."""
        return self.workers == 0 and self.address is None

    @contextlib.contextmanager
    def open(self) -> Iterator[Pool]:
        """A pool to ``map`` on, for as many rounds as the block needs: a local cluster starts once
        (a few seconds) and stops when the block ends."""
        if self.local:
            yield LOCAL
            return
        # Imported here: only a fanned-out caller pays for Dask's import (~0.5 s).
        from distributed import Client, LocalCluster

        with contextlib.ExitStack() as stack:
            if self.address is not None:
                client = stack.enter_context(Client(self.address))
            else:
                cluster = stack.enter_context(
                    LocalCluster(
                        n_workers=self.workers,
                        threads_per_worker=1,
                        processes=True,
                        host="127.0.0.1",
                        dashboard_address="127.0.0.1:0",
                    )
                )
                client = stack.enter_context(Client(cluster))
            yield Pool(client)

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, progress: Callable[[int], None] | None = None
    ) -> list[R]:
        """``Pool.map`` on a pool opened for this call alone."""
        with self.open() as pool:
            return pool.map(fn, items, progress=progress)


class Pool:
    """Runs jobs where a ``FanOut`` says (``FanOut.open``): a Dask client, or None for here."""

    def __init__(self, client: Any) -> None:  # noqa: ANN401 - a distributed.Client, imported lazily
        self._client = client

    @property
    def local(self) -> bool:
        """Whether jobs run in this process, in order."""
        return self._client is None

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, progress: Callable[[int], None] | None = None
    ) -> list[R]:
        """``fn(item)`` for every item, in ``items``' order; ``progress`` hears how many are done.

        ``fn`` and the items travel to the workers by (cloud)pickle: a module-level function and
        plain data are safest.
        """
        done = progress or (lambda _n: None)
        if self._client is None or not items:
            out = []
            for item in items:
                out.append(_on_one_thread(fn, item))
                done(len(out))
            return out
        from distributed import as_completed

        futures = self._client.map(functools.partial(_on_worker, fn), list(items), pure=False)
        for finished, _ in enumerate(as_completed(futures), start=1):
            done(finished)
        return self._client.gather(futures)


LOCAL = Pool(None)
"""Every job in this process, in order."""
