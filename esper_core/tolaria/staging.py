"""Where training batches come from and how they reach the device (seed 001 WP-99 Phase 1).

Three paths, all yielding the same batches in the same order for a given ``(seed, epoch)``:
- resident (default, the seeds' ``--gpu-dataset``): the split lives on the device; batches are
  index slices, no copies;
- host: the split stays in (pinned) host memory and each batch is copied with
  ``non_blocking=True``; with ``enable_gpu_prefetch`` the next batch is staged on a dedicated
  CUDA stream while the current one trains, and the copy time is reported as ``h2d_copy_ms``;
- DataLoader workers (``num_workers > 0``) with ``persistent_workers``, ``prefetch_factor`` and
  ``pin_memory_device``, fed by a batch sampler that reproduces the resident order exactly.

A user's data set (``DatasetSplit``, any map-style ``torch.utils.data.Dataset``) always takes the
DataLoader path (in the main process when ``num_workers`` is 0): it need not fit in memory, and
the batch sampler gives it the same ``(seed, epoch)`` order, so a retried or resumed epoch sees
exactly the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from esper_core.contracts import TelemetryEvent, TelemetryLevel
from esper_core.data import AnySplit, DatasetSplit, Split, epoch_order

Batch = tuple[torch.Tensor, torch.Tensor]
Shard = tuple[int, int]
"""``(rank, world)``: in a data-parallel run each rank reads every ``world``-th sample of every
global batch, from ``rank`` on; ``(0, 1)`` reads whole batches."""


@dataclass(kw_only=True, slots=True)
class LoaderConfig:
    """How training batches are staged."""

    gpu_dataset: bool = True
    """Keep the training split on the device (CUDA); False keeps it in pinned host memory. With
    ``num_workers > 0`` the split stays on the host either way: workers read host memory."""
    enable_gpu_prefetch: bool = False
    """Host-resident data on CUDA: copy the next batch on a dedicated stream during this step."""
    num_workers: int = 0
    """DataLoader worker processes; 0 uses no DataLoader."""
    persistent_workers: bool = False
    """Keep DataLoader workers alive between epochs (needs num_workers > 0)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (needs num_workers > 0)."""
    pin_memory_device: str = ""
    """Device DataLoader pins for, e.g. ``cuda`` (empty: the training device when it is CUDA)."""
    multiprocessing_context: str = "forkserver"
    """How DataLoader workers start (``forkserver``, ``spawn`` or ``fork``). Not ``fork`` by
    default: a worker forked from a process whose other threads hold locks (a Prefect flow run's
    API client and event threads) can die at start, seen as "DataLoader worker exited
    unexpectedly". The data set must then be picklable, as on macOS and Windows."""

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            raise ValueError(
                "persistent_workers and prefetch_factor need num_workers > 0; set num_workers or drop them"
            )
        if self.multiprocessing_context not in ("forkserver", "spawn", "fork"):
            raise ValueError(
                f"multiprocessing_context must be forkserver, spawn or fork, got {self.multiprocessing_context!r}"
            )
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")

    def resident_on(self, device: torch.device) -> bool:
        """Whether an in-memory training split lives on ``device`` rather than in host memory:
        always off CUDA; on CUDA with ``gpu_dataset`` unless DataLoader workers read it (worker
        processes index host tensors, and the loader pins what they return)."""
        return device.type != "cuda" or (self.gpu_dataset and self.num_workers == 0)


class _EpochBatchSampler(Sampler[list[int]]):
    """Index batches of one epoch in the resident path's order."""

    def __init__(self, n: int, *, batch_size: int, seed: int, shard: Shard) -> None:
        self.n, self.batch_size, self.seed, self.epoch = n, batch_size, seed, 0
        self.rank, self.world = shard

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.n, seed=self.seed, epoch=self.epoch).tolist()
        for start in range(0, self.n, self.batch_size):
            batch = order[start : start + self.batch_size]
            yield batch[self.rank :: self.world] if self.world > 1 else batch

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)


class BatchSource:
    """Yields an epoch's training batches on ``device`` by the configured path."""

    def __init__(
        self,
        split: AnySplit,
        *,
        device: torch.device,
        batch_size: int,
        seed: int,
        config: LoaderConfig,
        shard: Shard = (0, 1),
    ) -> None:
        """``batch_size`` is the global batch; ``shard`` says which part of each this rank reads
        (the batches of one epoch are the same for every world size, only split among ranks)."""
        self.device = device
        self.shard = shard
        self.batch_size = batch_size
        self.seed = seed
        self.config = config
        self.events: list[TelemetryEvent] = []
        self.h2d_copy_ms = 0.0
        cuda = device.type == "cuda"
        if not cuda and (config.enable_gpu_prefetch or config.pin_memory_device):
            self._event("GPU prefetch and pinned-memory staging need CUDA; batches come from host memory directly")
        streamed = isinstance(split, DatasetSplit)
        self.resident = not streamed and config.resident_on(device)
        self.prefetch = (
            cuda and not streamed and not self.resident and config.enable_gpu_prefetch and config.num_workers == 0
        )
        self.split: Split | None = None
        if isinstance(split, Split):
            # Host-resident data is pinned so that the per-batch copies can overlap compute.
            self.split = split.to(device) if self.resident else Split(x=split.x.pin_memory(), y=split.y.pin_memory())
        self.loader: DataLoader | None = None
        self._sampler: _EpochBatchSampler | None = None
        # The loader's own generator, re-seeded per epoch: creating an iterator draws the workers'
        # base seed from it, never from the global RNG that dropout and initialisation use.
        self._generator = torch.Generator()
        if config.num_workers > 0 or streamed:
            self._sampler = _EpochBatchSampler(len(split), batch_size=batch_size, seed=seed, shard=shard)
            self.loader = DataLoader(
                split.dataset if isinstance(split, DatasetSplit) else TensorDataset(split.x, split.y),
                batch_sampler=self._sampler,
                num_workers=config.num_workers,
                persistent_workers=config.persistent_workers,
                prefetch_factor=config.prefetch_factor,
                pin_memory=cuda,
                pin_memory_device=(config.pin_memory_device or str(device)) if cuda else "",
                generator=self._generator,
                multiprocessing_context=config.multiprocessing_context if config.num_workers > 0 else None,
            )
        self._stream = torch.cuda.Stream(device) if self.prefetch else None

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The batches of ``epoch``, on the device."""
        if self.loader is not None:
            assert self._sampler is not None
            self._sampler.epoch = epoch
            # Workers draw their seeds from this when the epoch's iterator starts (every epoch
            # unless persistent_workers: then a resumed run's workers are seeded at the resume).
            self._generator.manual_seed(self.seed * 1_000_003 + epoch)
            return (self._to_device(x, y) for x, y in self.loader)
        if self.resident:
            return self._slices(epoch)
        if self.prefetch:
            return self._prefetched(epoch)
        return (self._to_device(x, y) for x, y in self._slices(epoch))

    def _slices(self, epoch: int) -> Iterator[Batch]:
        assert self.split is not None, "in-memory splits only; a user's data set is read by the loader"
        order = epoch_order(len(self.split), seed=self.seed, epoch=epoch).to(self.split.x.device)
        rank, world = self.shard
        for start in range(0, len(self.split), self.batch_size):
            index = order[start : start + self.batch_size]
            if world > 1:
                index = index[rank::world]
            yield self.split.x[index], self.split.y[index]

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        if x.device == self.device:
            return x, y
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _prefetched(self, epoch: int) -> Iterator[Batch]:
        stream = self._stream
        assert stream is not None
        timings: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

        def stage(batch: Batch) -> Batch:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                begin.record(stream)
                staged = (
                    batch[0].pin_memory().to(self.device, non_blocking=True),
                    batch[1].pin_memory().to(self.device, non_blocking=True),
                )
                end.record(stream)
            timings.append((begin, end))
            return staged

        host = self._slices(epoch)
        nxt = next(host, None)
        staged = stage(nxt) if nxt is not None else None
        while staged is not None:
            torch.cuda.current_stream().wait_stream(stream)
            for t in staged:
                t.record_stream(torch.cuda.current_stream())  # the copy's memory is used on this stream
            current = staged
            nxt = next(host, None)
            staged = stage(nxt) if nxt is not None else None  # overlaps the step on `current`
            yield current
        torch.cuda.synchronize(self.device)
        self.h2d_copy_ms += sum(b.elapsed_time(e) for b, e in timings)

    def drain(self) -> tuple[float, list[TelemetryEvent]]:
        """Copy time since the last drain (ms) and pending events."""
        copy_ms, self.h2d_copy_ms = self.h2d_copy_ms, 0.0
        events, self.events = self.events, []
        return copy_ms, events

    def _event(self, message: str) -> None:
        self.events.append(
            TelemetryEvent(
                name="tolaria.staging.fallback",
                level=TelemetryLevel.INFO,
                message=message,
                attributes={"reason": "no_cuda"},
            )
        )
