"""Flat gradient buffers for multi-task aggregation: a layout, a reusable pool, flatten/unflatten.

Shape legend: ``K`` tasks (teacher + one per seed), ``P`` parameters, ``N`` their total numel.

A layout is computed once per parameter signature (shapes, dtype, device); the pool keeps one
(K, N) task matrix plus two (N,) buffers and the per-parameter views into all of them, so a step
allocates nothing: gradients are copied into cached views with ``torch._foreach_copy_`` and the
combined gradient reaches ``p.grad`` as views of the pool's grad arena (the contract of DDP's
``gradient_as_bucket_view``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# What a layout depends on: per parameter, its shape, dtype and device.
Signature = tuple[tuple[torch.Size, torch.dtype, torch.device], ...]


def signature(params: Sequence[torch.Tensor]) -> Signature:
    """The layout key of ``params``: equal signatures share buffers."""
    return tuple((p.shape, p.dtype, p.device) for p in params)


@dataclass(frozen=True, slots=True)
class GradLayout:
    """Where each parameter's gradient lives in a flat (N,) vector."""

    shapes: tuple[torch.Size, ...]
    numels: tuple[int, ...]
    offsets: tuple[int, ...]
    numel: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, params: Sequence[torch.Tensor]) -> GradLayout:
        """The layout of ``params`` in order.

        Raises:
            ValueError: if ``params`` is empty or mixes dtypes or devices (one flat buffer holds
                one dtype on one device; aggregate each group separately).
        """
        if not params:
            raise ValueError("cannot lay out an empty parameter list; pass the shared (host) parameters")
        dtypes = {p.dtype for p in params}
        devices = {p.device for p in params}
        if len(dtypes) > 1 or len(devices) > 1:
            raise ValueError(
                f"parameters mix dtypes {sorted(map(str, dtypes))} or devices {sorted(map(str, devices))}; "
                "a flat gradient buffer needs one of each: move the model to one device and dtype "
                "(AMP keeps parameters in float32, so autocast is fine)"
            )
        numels = tuple(p.numel() for p in params)
        offsets = tuple(sum(numels[:i]) for i in range(len(numels)))
        return cls(
            shapes=tuple(p.shape for p in params),
            numels=numels,
            offsets=offsets,
            numel=sum(numels),
            dtype=params[0].dtype,
            device=params[0].device,
        )

    def empty(self, *rows: int) -> torch.Tensor:
        """An uninitialised buffer of shape (*rows, N) on the layout's device and dtype."""
        return torch.empty((*rows, self.numel), dtype=self.dtype, device=self.device)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat (N,) tensor shaped like each parameter (no copy)."""
        if flat.shape != (self.numel,):
            raise ValueError(f"flat buffer has shape {tuple(flat.shape)}; this layout needs ({self.numel},)")
        return [chunk.view(shape) for chunk, shape in zip(flat.split(self.numels), self.shapes, strict=True)]


def copy_grads_into(grads: Sequence[torch.Tensor | None], views: Sequence[torch.Tensor]) -> None:
    """Copy ``grads`` into ``views`` with one fused copy; a ``None`` gradient writes zeros."""
    dst = [v for v, g in zip(views, grads, strict=True) if g is not None]
    src = [g for g in grads if g is not None]
    if src:
        torch._foreach_copy_(dst, src)
    if len(src) < len(views):
        torch._foreach_zero_([v for v, g in zip(views, grads, strict=True) if g is None])


def store_grads(
    params: Sequence[torch.Tensor],
    src_views: Sequence[torch.Tensor],
    *,
    alias_views: Sequence[torch.Tensor],
    accumulate: bool,
) -> None:
    """Write per-parameter gradients into ``p.grad`` without allocating.

    A parameter whose ``grad`` is ``None`` gets ``alias_views[i]`` as its gradient (filled from
    ``src_views[i]`` unless they are the same tensors); one with a gradient gets ``src_views[i]``
    added (``accumulate``) or copied over it.
    """
    fresh = [i for i, p in enumerate(params) if p.grad is None]
    held = [i for i, p in enumerate(params) if p.grad is not None]
    if fresh:
        if alias_views is not src_views:
            torch._foreach_copy_([alias_views[i] for i in fresh], [src_views[i] for i in fresh])
        for i in fresh:
            params[i].grad = alias_views[i]
    if held:
        dst = [params[i].grad for i in held]
        src = [src_views[i] for i in held]
        if accumulate:
            torch._foreach_add_(dst, src)
        else:
            torch._foreach_copy_(dst, src)


def flatten_grads_into(params: Sequence[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
    """Copy the gradients of ``params`` into the flat (N,) ``buffer``; ``None`` grads count as 0.

    Args:
        params: Parameters in layout order.
        buffer: (N,) tensor with N the total numel of ``params``, same dtype and device.

    Returns:
        ``buffer``, filled.
    """
    copy_grads_into([p.grad for p in params], GradLayout.of(params).views(buffer))
    return buffer


def unflatten_into_grads(buffer: torch.Tensor, params: Sequence[torch.Tensor], *, accumulate: bool = False) -> None:
    """Write the flat (N,) ``buffer`` back into the ``.grad`` of ``params``.

    A parameter without a gradient gets a view of ``buffer`` as its ``.grad`` (no allocation), so
    ``buffer`` must not be overwritten while those gradients are in use; a parameter with a
    gradient has the slice copied into it, or added when ``accumulate`` is true.

    Args:
        buffer: (N,) flat gradient in the layout of ``params``.
        params: Parameters in layout order.
        accumulate: Add to existing gradients (autograd's semantics) instead of overwriting them.
    """
    views = GradLayout.of(params).views(buffer)
    store_grads(params, views, alias_views=views, accumulate=accumulate)


class GradientBufferPool:
    """Reusable flat gradient buffers for one parameter list.

    Holds a (K, N) task matrix whose rows ``acquire`` hands out, an (N,) grad arena that backs the
    ``.grad`` of parameters written by ``store``, and an (N,) scratch buffer for the combined
    gradient when some parameters already hold a gradient. Buffers and their per-parameter views
    are reallocated only when the bound parameters' signature (shapes, dtype, device) changes or
    more task rows are needed than were ever acquired.

    Example:
        >>> pool = GradientBufferPool(model.host_parameters())
        >>> rows = pool.acquire(3)  # three (N,) rows of one (3, N) matrix
        >>> pool.release()
    """

    def __init__(self, params: Sequence[torch.Tensor] | None = None) -> None:
        self._params: tuple[torch.Tensor, ...] = ()
        self._signature: Signature | None = None
        self._layout: GradLayout | None = None
        self._matrix: torch.Tensor | None = None  # (K_cap, N)
        self._row_views: list[list[torch.Tensor]] = []
        self._arena: torch.Tensor | None = None  # (N,)
        self._arena_views: list[torch.Tensor] = []
        self._scratch: torch.Tensor | None = None  # (N,), allocated on first need
        self._scratch_views: list[torch.Tensor] = []
        self._acquired = 0
        self.allocations = 0
        """How many times buffers were (re)allocated; for tests and telemetry."""
        if params is not None:
            self.bind(params)

    # ------------------------------------------------------------------ binding

    def bind(self, params: Sequence[torch.Tensor]) -> None:
        """Use ``params`` from now on; buffers are kept when their signature is unchanged."""
        if self._acquired:
            raise RuntimeError("cannot rebind a GradientBufferPool while rows are acquired; call release() first")
        self._params = tuple(params)

    @property
    def layout(self) -> GradLayout:
        """The layout of the bound parameters (recomputed only when their signature changed)."""
        self._ensure_layout()
        assert self._layout is not None
        return self._layout

    def _ensure_layout(self) -> None:
        sig = signature(self._params)
        if sig == self._signature:
            return
        # The layout changed (new parameters, or a parameter moved or was resized): drop every
        # buffer; they are reallocated lazily at the new size.
        self._layout = GradLayout.of(self._params)
        self._signature = sig
        self._matrix, self._row_views = None, []
        self._arena, self._arena_views = None, []
        self._scratch, self._scratch_views = None, []

    # ------------------------------------------------------------------ task rows

    def acquire(self, k: int) -> list[torch.Tensor]:
        """``k`` flat (N,) buffers: rows of one contiguous (k, N) matrix (see ``stacked``).

        Contents are stale until written (``load`` or ``flatten_grads_into``).

        Raises:
            ValueError: if ``k < 1``.
            RuntimeError: if rows are already acquired (call ``release()`` first).
        """
        if k < 1:
            raise ValueError(f"acquire needs at least one task row, got k={k}")
        if self._acquired:
            raise RuntimeError(f"{self._acquired} rows are still acquired; call release() before acquiring again")
        self._ensure_layout()
        layout = self._layout
        assert layout is not None
        if self._matrix is None or self._matrix.shape[0] < k:
            self._matrix = layout.empty(k)
            self._row_views = [layout.views(row) for row in self._matrix.unbind(0)]
            self.allocations += 1
        self._acquired = k
        return list(self._matrix[:k].unbind(0))

    def stacked(self) -> torch.Tensor:
        """The acquired rows as one (k, N) tensor (a view: no stack copy)."""
        if not self._acquired:
            raise RuntimeError("no rows are acquired; call acquire(k) first")
        assert self._matrix is not None
        return self._matrix[: self._acquired]

    def load(self, row: int, grads: Sequence[torch.Tensor | None]) -> None:
        """Copy per-parameter ``grads`` (``None`` = zeros) into acquired row ``row``."""
        if not 0 <= row < self._acquired:
            raise IndexError(f"row {row} is not acquired (acquired rows: 0..{self._acquired - 1})")
        copy_grads_into(grads, self._row_views[row])

    def release(self) -> None:
        """Give the task rows back; their storage is kept for the next ``acquire``."""
        self._acquired = 0

    # ------------------------------------------------------------------ combined gradient

    def output(self) -> torch.Tensor:
        """The (N,) buffer the combined gradient should be written to before ``store``.

        The grad arena itself when no bound parameter holds a gradient (then ``store`` only
        aliases, with no copy), otherwise the scratch buffer.
        """
        self._ensure_layout()
        if all(p.grad is None for p in self._params):
            return self._arena_buffer()
        if self._scratch is None:
            assert self._layout is not None
            self._scratch = self._layout.empty()
            self._scratch_views = self._layout.views(self._scratch)
            self.allocations += 1
        return self._scratch

    def store(self, flat: torch.Tensor) -> None:
        """Write ``flat`` (the tensor ``output()`` returned) into the bound parameters' ``.grad``.

        Gradients accumulate like autograd's: a parameter without a gradient gets a view of the
        grad arena as its ``.grad``; an existing gradient has its slice added in place. The arena
        backs those gradients until the caller drops them (``zero_grad(set_to_none=True)``);
        zeroing in place (``set_to_none=False``) is fine too.
        """
        if flat is not self._arena and flat is not self._scratch:
            raise ValueError("store() takes the buffer returned by output(); use unflatten_into_grads for others")
        self._arena_buffer()
        # Same list object for the arena: store_grads then aliases without copying.
        src_views = self._arena_views if flat is self._arena else self._scratch_views
        store_grads(self._params, src_views, alias_views=self._arena_views, accumulate=True)

    def _arena_buffer(self) -> torch.Tensor:
        if self._arena is None:
            assert self._layout is not None
            self._arena = self._layout.empty()
            self._arena_views = self._layout.views(self._arena)
            self.allocations += 1
        return self._arena
