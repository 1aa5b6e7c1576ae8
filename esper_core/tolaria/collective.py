"""What a data-parallel run's ranks exchange, in one place: gradients, sums, commands, RNG, checks.

A run trains on ``world`` processes (ranks). Every rank holds the whole model and reads its share
of every global batch (``BatchSource``'s shard); after each backward, ``sum_gradients`` makes every
rank's gradient the gradient of the whole global batch, so every rank takes the same optimizer
step and the ranks stay identical without ever sending weights.

Why not ``DistributedDataParallel``: DDP registers its reducer on the parameters present when it
wraps the model and expects one backward per forward. A growing run breaks both, by design: a
germination or a merge changes the parameter set between epochs, the aggregated step (PCGrad)
differentiates several losses with ``autograd.grad``, and the gates' probes run extra backward
passes on one batch. Here the gradients are read from the optimizer's parameter groups at every
step, so a parameter that growth added is all-reduced from its first step (nothing to re-wrap),
and the reduction sits outside the step closure, so eager, compiled and captured steps all work.
What DDP adds over this, overlapping the reduction with the backward pass, matters on large models
across GPUs; on the hosts here one coalesced all-reduce per step is the whole cost (docs/data-parallel.md,
"Measured", has the measurement).

``Solo`` is the single-process collective: every method is free, so the trainer calls them
unconditionally (no ``if distributed`` in the loop).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from esper_core.determinism import capture_rng, restore_rng

T = TypeVar("T")

BUCKET_BYTES = 25 * 2**20
"""Largest all-reduce: gradients are packed into flat buckets of at most this size (DDP's default),
so a big model is reduced in a few calls rather than one per parameter or one giant copy."""


class RanksDiverged(RuntimeError):
    """The ranks of a data-parallel run no longer hold the same model (a bug, never a user error)."""


class Collective(Protocol):
    """The operations a run's ranks perform together; every rank calls each one in the same order."""

    rank: int
    world: int

    @property
    def leader(self) -> bool:
        """Whether this rank decides, commits and reports for the run (rank 0)."""

    def sum_gradients(self, params: Sequence[nn.Parameter], *, weight: float) -> None:
        """Replace each parameter's ``.grad`` by ``sum over ranks of weight_r * grad_r``."""

    def sum_rows(self, matrix: torch.Tensor, *, weight: float) -> None:
        """The same for a (K, N) matrix of flat gradients, in place."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce ``tensor`` by sum, in place; returns it."""

    def broadcast(self, obj: T) -> T:
        """The leader's ``obj`` on every rank (picklable)."""

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""

    def rank_rng(self, salt: int) -> contextlib.AbstractContextManager[None]:
        """A random stream of this rank's own for the block (dropout masks differ between ranks);
        on exit every rank's RNG is back where it was, so the ranks stay in step."""

    def average_buffers(self, module: nn.Module) -> None:
        """Average every floating-point buffer (BatchNorm's running statistics) over the ranks."""

    def check_identical(self, module: nn.Module, *, where: str) -> None:
        """Raise ``RanksDiverged`` unless every rank's parameters and buffers are bit-identical."""

    def drain_exchange_ms(self) -> float:
        """Milliseconds spent in ``sum_gradients`` and ``sum_rows`` since the last drain."""


class Solo:
    """One process: nothing to exchange."""

    rank = 0
    world = 1

    @property
    def leader(self) -> bool:
        """Always: the only rank."""
        return True

    def sum_gradients(self, params: Sequence[nn.Parameter], *, weight: float) -> None:
        """Nothing to sum (the weight of the only rank is 1)."""

    def sum_rows(self, matrix: torch.Tensor, *, weight: float) -> None:
        """Nothing to sum."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` itself."""
        return tensor

    def broadcast(self, obj: T) -> T:
        """``obj`` itself."""
        return obj

    def gather(self, obj: T) -> list[T]:
        """``[obj]``."""
        return [obj]

    def rank_rng(self, salt: int) -> contextlib.AbstractContextManager[None]:
        """The run's own stream: a single-process run draws exactly what it always did."""
        return contextlib.nullcontext()

    def average_buffers(self, module: nn.Module) -> None:
        """The only rank's buffers are the average."""

    def check_identical(self, module: nn.Module, *, where: str) -> None:
        """One rank is always identical to itself."""

    def drain_exchange_ms(self) -> float:
        """Nothing is exchanged."""
        return 0.0


class ProcessGroup:
    """The ranks of an initialised ``torch.distributed`` default group (gloo on CPU, NCCL on CUDA)."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "ProcessGroup needs torch.distributed initialised first (esper_core.run.ranks does it); "
                "use Solo for a single-process run"
            )
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self._exchange_s = 0.0

    @property
    def leader(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    def sum_gradients(self, params: Sequence[nn.Parameter], *, weight: float) -> None:
        """Weighted sum of every rank's gradients, packed into buckets.

        Every rank passes the same parameters in the same order; a parameter without a gradient
        is skipped on every rank alike (same model, same stages). ``weight`` is this rank's share
        of the global batch, so the result is the gradient a single process would get on it.
        """
        start = time.perf_counter()
        grads = [p.grad for p in params if p.grad is not None]
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            flat.mul_(weight)
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n
        self._exchange_s += time.perf_counter() - start

    def sum_rows(self, matrix: torch.Tensor, *, weight: float) -> None:
        """Weighted all-reduce of a (K, N) gradient matrix, in place."""
        start = time.perf_counter()
        matrix.mul_(weight)
        dist.all_reduce(matrix)
        self._exchange_s += time.perf_counter() - start

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce by sum, in place."""
        dist.all_reduce(tensor)
        return tensor

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        box: list[Any] = [obj if self.leader else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    @contextlib.contextmanager
    def rank_rng(self, salt: int) -> Iterator[None]:
        """Draw from a stream seeded by (``salt``, rank) inside the block, then return to the shared one."""
        if self.world == 1:
            yield
            return
        saved = capture_rng()
        try:
            torch.manual_seed((salt * 1_000_003 + self.rank) % 2**63)
            yield
        finally:
            restore_rng(saved)

    def average_buffers(self, module: nn.Module) -> None:
        """Running statistics are per rank during an epoch (each rank normalises its own shard,
        as DDP does without SyncBatchNorm); averaged once an epoch, every rank validates with
        the same ones."""
        buffers = [b for b in module.buffers() if b.is_floating_point()]
        if not buffers:
            return
        flat = torch.cat([b.reshape(-1) for b in buffers])
        dist.all_reduce(flat)
        flat.div_(self.world)
        offset = 0
        for b in buffers:
            b.copy_(flat[offset : offset + b.numel()].view_as(b))
            offset += b.numel()

    def check_identical(self, module: nn.Module, *, where: str) -> None:
        """Compare a digest of every parameter and buffer across ranks."""
        digests = self.gather(state_digest(module))
        if len(set(digests)) != 1:
            odd = [r for r, d in enumerate(digests) if d != digests[0]]
            raise RanksDiverged(
                f"ranks {odd} hold a different model from rank 0 at {where}; this is a bug in Esper's "
                "data-parallel path (every rank must take the same steps): report it with the run's telemetry"
            )

    def drain_exchange_ms(self) -> float:
        """Wall time of the gradient sums since the last drain (gloo's are synchronous; NCCL's
        count their launch only, the wait lands on the next synchronising call)."""
        spent, self._exchange_s = self._exchange_s, 0.0
        return spent * 1e3


def state_digest(module: nn.Module) -> str:
    """SHA-256 over every parameter and buffer, names and bytes (what ``check_identical`` compares)."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        if not isinstance(t, torch.Tensor):
            continue
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _buckets(grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive gradients of one dtype and device, at most ``BUCKET_BYTES`` a bucket."""
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if bucket and (size + nbytes > BUCKET_BYTES or g.dtype != bucket[0].dtype or g.device != bucket[0].device):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += nbytes
    if bucket:
        yield bucket
