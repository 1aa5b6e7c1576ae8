"""CUDA Graph capture and replay of the steady-state training step (seed 001 WP-99 2.2/2A,
seed 004).

The captured region is forward + loss + backward on static input/target buffers; the optimizer
step, Kasmina's attribution and per-seed metrics stay outside it (they read the static ``.grad``
tensors after each replay). Keeping ``optimizer.step`` out also keeps learning-rate changes live:
a captured SGD step would bake the learning rate in.

Capture is keyed by batch shape: a batch of another shape (the epoch's last, short batch) runs
the eager step and is counted as a fallback with its reason. All trainers of a process share one
graph memory pool when ``enable_graph_pool_reuse`` is set (seed 004: ~5 s -> ~63 ms per capture).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator

import torch

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_SHARED_POOL: tuple[int, int] | None = None
# A one-node graph captured into the shared pool when it is made, held for the process's life.
# PyTorch closes a graph pool when the last graph captured into it is destroyed (a failed capture
# counts), and a capture into its handle after that trips the allocator's internal assert
# ``use_count > 0``: on the 2026-11-28 lease every re-capture after a growth event, and every
# trainer after the first in a process, fell back to eager on it. One device per process (a
# data-parallel rank owns one GPU), so one keeper on the current device; the pool's memory stays
# with the process, which is what sharing it is for.
_POOL_KEEPER: torch.cuda.CUDAGraph | None = None
_WARMUP_ITERS = 3  # side-stream iterations before capture, as the CUDA Graphs docs prescribe


def shared_pool() -> tuple[int, int]:
    """The process-wide graph memory pool handle, created (and kept open) on first use."""
    global _SHARED_POOL, _POOL_KEEPER
    if _SHARED_POOL is None:
        handle = torch.cuda.graph_pool_handle()
        keeper = torch.cuda.CUDAGraph()
        with torch.cuda.graph(keeper, pool=handle):
            torch.zeros(1, device="cuda")  # one node: an empty capture is warned about
        _SHARED_POOL, _POOL_KEEPER = handle, keeper
    return _SHARED_POOL


@contextlib.contextmanager
def _generator_restored_on_failure() -> Iterator[None]:
    """Put the current device's default CUDA generator back as it was if the block raises.

    A capture registers that generator and marks its state as capturing; only a capture that ends
    cleanly unmarks it. When a capture fails (a host sync inside the step, say), PyTorch raises
    from ``capture_end`` before that, and every later random op on the device fails with "Offset
    increment outside graph capture encountered unexpectedly": on the first GPU lease, after a
    capture fell back to eager, a width seed's initialisation and Inductor's seeds both did. The
    failed capture executed nothing, so the state from before it (a clone: seed and offset, not
    capturing) is the right one to continue from.
    """
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    before = generator.clone_state()
    try:
        yield
    except BaseException:
        generator.graphsafe_set_state(before)
        raise


class GraphRunner:
    """Captures ``step_fn`` once per batch shape and replays it.

    Args:
        step_fn: forward + loss + backward on ``(x, y)``, returning the batch's detached
            statistics (any tensor; it is read from a static buffer after each replay).
        parameters: the parameters the step computes gradients for.
        reuse_pool: share the process-wide memory pool instead of a private one per capture.
    """

    def __init__(self, step_fn: StepFn, *, parameters: Callable[[], Iterable[torch.Tensor]], reuse_pool: bool) -> None:
        self.step_fn = step_fn
        self.parameters = parameters
        self.reuse_pool = reuse_pool
        self.shape: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static_x: torch.Tensor | None = None
        self._static_y: torch.Tensor | None = None
        self._static_loss: torch.Tensor | None = None
        # Each parameter's gradient tensor as captured: replays write there, whatever ``.grad``
        # holds by then.
        self._grads: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.capture_ms = 0.0
        # Captures since the last epoch's metrics: one per structure change, never one per epoch.
        self.captures = 0
        self.stage_copy_ms = 0.0
        self.replays = 0
        # Replay time from CUDA events, read once per epoch (no host sync per step).
        self._replay_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def captured(self) -> bool:
        """True once a graph is ready to replay."""
        return self._graph is not None

    def reset(self) -> None:
        """Drop the captured graph (the model's structure or constants changed)."""
        self._graph = None
        self.shape = None
        self._static_x = self._static_y = self._static_loss = None
        self._grads = []

    def capture(self, x: torch.Tensor, y: torch.Tensor, zero_grad: Callable[[], None]) -> torch.Tensor:
        """Warm up on a side stream, capture on ``x``/``y``'s shapes, and return this batch's loss.

        The warm-up iterations are real training steps' forward/backward on this batch (their
        gradients are discarded by the capture's own backward), so the step's result equals an
        eager step's.
        """
        start = time.perf_counter()
        self._static_x = x.clone()
        self._static_y = y.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_ITERS):
                zero_grad()
                self.step_fn(self._static_x, self._static_y)
        torch.cuda.current_stream().wait_stream(side)
        zero_grad()  # grads are (re)allocated inside the graph's pool and stay static
        graph = torch.cuda.CUDAGraph()
        # One guard for both captures: the pool keeper's (made on first use) and the step's.
        with _generator_restored_on_failure():
            pool = shared_pool() if self.reuse_pool else None
            with torch.cuda.graph(graph, pool=pool):
                self._static_loss = self.step_fn(self._static_x, self._static_y)
        graph.replay()  # the capture itself does not execute: run this batch's step once
        self._grads = [(p, p.grad) for p in self.parameters() if p.grad is not None]
        torch.cuda.synchronize()
        self._graph = graph
        self.shape = (tuple(x.shape), tuple(y.shape))
        self.capture_ms = (time.perf_counter() - start) * 1e3
        self.captures += 1
        assert self._static_loss is not None
        return self._static_loss.clone()

    def drain_replay_ms(self) -> float:
        """Mean replay time (ms) since the last call; one device sync."""
        if not self._replay_events:
            return 0.0
        torch.cuda.synchronize()
        total = sum(b.elapsed_time(e) for b, e in self._replay_events)
        mean = total / len(self._replay_events)
        self._replay_events = []
        return mean

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Copy the batch into the static buffers and replay; returns the step's statistics (a copy)."""
        assert self._graph is not None and self._static_x is not None and self._static_y is not None
        start = time.perf_counter()
        self._static_x.copy_(x, non_blocking=True)
        self._static_y.copy_(y, non_blocking=True)
        self.stage_copy_ms += (time.perf_counter() - start) * 1e3
        # An eager step since the capture (the short last batch, say) cleared the gradients to
        # None and made new ones; the optimizer reads ``.grad``, so point it back at the tensors
        # the graph writes. Without this every replay after an eager step trained nothing (seen
        # on the first GPU run: the second epoch's loss 2.21 where eager reached 2.03).
        for p, g in self._grads:
            if p.grad is not g:
                p.grad = g
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        self._graph.replay()
        end.record()
        self._replay_events.append((begin, end))
        self.replays += 1
        assert self._static_loss is not None
        return self._static_loss.clone()
