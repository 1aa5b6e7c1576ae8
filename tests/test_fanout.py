"""Fan-out: jobs come back in their order, on one torch thread, here and on a local Dask cluster."""

from __future__ import annotations

import gc

import pytest
import torch

from esper_core.fanout import LOCAL, FanOut


def _job(item: int) -> tuple[int, int]:
    return item * item, torch.get_num_threads()


def _frozen(_item: int) -> int:
    return gc.get_freeze_count()


def test_local_jobs_run_in_order_on_one_thread_and_the_thread_count_is_restored() -> None:
    before = torch.get_num_threads()
    seen: list[int] = []
    assert LOCAL.map(_job, [3, 1, 2], progress=seen.append) == [(9, 1), (1, 1), (4, 1)]
    assert seen == [1, 2, 3]
    assert torch.get_num_threads() == before
    assert FanOut().local and LOCAL.local
    # Jobs here leave the caller's process as it was: no frozen heap.
    assert LOCAL.map(_frozen, [0]) == [gc.get_freeze_count()] == [0]


def test_bad_worker_counts_are_refused() -> None:
    with pytest.raises(ValueError, match=r"workers must be >= 0 \(0: jobs run one after another here\)"):
        FanOut(workers=-1)


@pytest.mark.slow
def test_a_local_cluster_returns_results_in_the_jobs_order() -> None:
    fan_out = FanOut(workers=2)
    assert not fan_out.local
    with fan_out.open() as pool:
        assert not pool.local
        # Two rounds on one cluster: it starts once for the block.
        assert pool.map(_job, list(range(6))) == [(i * i, 1) for i in range(6)]
        assert pool.map(_job, []) == []
        # A worker's long-lived import-time heap is frozen before its first job: the collector
        # no longer walks it at every full collection.
        assert min(pool.map(_frozen, [0, 1])) > 100_000
