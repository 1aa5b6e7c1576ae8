"""Gradient aggregation over microbatch tasks: PCGrad (Yu et al. 2020) or a plain sum.

Shape legend: ``K`` tasks (index 0 is the teacher: the host with seeds bypassed; then one per
trainable seed), ``N`` total numel of the shared (host) parameters.

Everything works on a (K, N) matrix of flat task gradients. PCGrad's sequential projections are
linear in the original gradients, so they are tracked as a (K, K) coefficient matrix driven by the
(K, K) Gram matrix: one pass reads the gradients for the Gram, a few dozen ops on K-sized tensors
do the projections, and one matrix-vector product writes the combined gradient. No Python loop runs
over parameters, no branch depends on a tensor value, and nothing syncs with the host: ``pcgrad``
traces as a single graph under ``torch.compile``, and conflict counts and teacher shares stay on
the device until ``AggregationStats.reduce`` once per epoch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from esper_core.tolaria.buffers import GradientBufferPool

AGGREGATION_MODES = ("pcgrad", "sum")

# Telemetry names (unchanged from the prototype's dashboards).
CONFLICT_RATIO = "tolaria.grad_agg.conflict_ratio"
TEACHER_SHARE = "tolaria.grad_agg.teacher_share"
STEPS = "tolaria.grad_agg.steps"


@dataclass(kw_only=True, slots=True)
class AggregationConfig:
    """How a step with several trainable seeds combines its per-task host gradients."""

    mode: str = "pcgrad"
    """``pcgrad`` projects away conflicting components; ``sum`` is the baseline (still counts conflicts)."""
    min_seeds_for_pcgrad: int = 2
    """Fewest trainable seeds for which a step splits into microbatches and aggregates; with fewer the
    step is the plain single backward."""

    def __post_init__(self) -> None:
        if self.mode not in AGGREGATION_MODES:
            raise ValueError(
                f"aggregation mode must be one of {AGGREGATION_MODES}, got {self.mode!r}; "
                "use 'sum' for the plain-sum baseline"
            )
        if self.min_seeds_for_pcgrad < 2:
            raise ValueError(
                f"min_seeds_for_pcgrad must be >= 2, got {self.min_seeds_for_pcgrad}: with one seed or none "
                "the step is the plain single backward; set 2 to aggregate whenever two seeds train"
            )

    def aggregates(self, trainable_seeds: int) -> bool:
        """Whether a step with ``trainable_seeds`` seeds splits into microbatches and aggregates."""
        return trainable_seeds >= self.min_seeds_for_pcgrad


@dataclass(frozen=True, kw_only=True, slots=True)
class AggregationResult:
    """One step's combined gradient and its telemetry, all on the gradients' device."""

    combined: torch.Tensor
    """(N,) the aggregated gradient."""
    conflicts: torch.Tensor
    """() int64: unordered task pairs whose original gradients conflict (negative dot product)."""
    pairs: int
    """Unordered task pairs, K * (K - 1) / 2 (known on the host: no sync)."""
    teacher_share: torch.Tensor
    """() float64: |teacher gradient| / sum of |task gradients|, after projection for PCGrad."""


# ---------------------------------------------------------------------- aggregation


def pcgrad(
    task_grads: Sequence[torch.Tensor] | torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    out: torch.Tensor | None = None,
) -> AggregationResult:
    """PCGrad: project each task gradient off every other it conflicts with, then sum.

    For each task ``i`` and each other task ``j`` in turn: if ``g_i' . g_j < 0`` (``g_i'`` the
    gradient projected so far, ``g_j`` the original) then ``g_i' -= (g_i' . g_j) / |g_j|^2 g_j``.
    The combined gradient is ``sum_i g_i'``.

    Args:
        task_grads: K flat (N,) gradients, or one (K, N) tensor (``GradientBufferPool.stacked()``
            avoids a stack copy). Task 0 is the teacher.
        generator: When given, each task visits the others in a random order drawn from it (the
            paper's shuffle, reproducible; a CPU generator, and one small host-to-device copy per
            call on CUDA); otherwise in ascending task order.
        out: Optional (N,) buffer for the combined gradient.

    Returns:
        The combined gradient and telemetry; no device-to-host sync happens.
    """
    grads = _as_matrix(task_grads)  # (K, N)
    k = grads.shape[0]
    gram, conflicts = _gram(grads)  # (K, K) float64, () int64
    rounds = _fixed_rounds(k, grads.device) if generator is None else _shuffled_rounds(k, grads.device, generator)
    # Row j of unit_gram is g_j . g_* / |g_j|^2, so the projection coefficient of g_i' onto g_j is
    # coef[i] . unit_gram[j]. A zero g_j has an all-zero row: its clamped (huge) inverse multiplies 0.
    unit_gram = gram / gram.diagonal().clamp_min(torch.finfo(gram.dtype).tiny).unsqueeze(1)  # (K, K)
    # Gathered for all rounds at once: row i of unit_r is unit_gram[cols[r, i]], with cols[r, i]
    # the task that task i visits in round r.
    unit_rounds = unit_gram.index_select(0, rounds.cols).view(k - 1, k, k).unbind(0)  # (K-1) x (K, K)
    # coef[i] @ grads is task i's projected gradient; it starts as the identity.
    coef = torch.eye(k, dtype=gram.dtype, device=gram.device)  # (K, K)
    coef_flat = coef.view(-1)  # (K*K,)
    for unit_r, entries_r in zip(unit_rounds, rounds.entries, strict=True):
        # (K,): (g_i' . g_j) / |g_j|^2 where the pair conflicts (dot < 0), else 0.
        scale = (coef * unit_r).sum(1).clamp_(max=0.0)
        coef_flat.index_add_(0, entries_r, scale, alpha=-1)  # coef[i, j] -= scale[i]
    # sum_i coef[i] @ grads is one (N, K) @ (K,) product; |g_i'|^2 = coef[i] G coef[i]^T (clamped:
    # cancellation can dip just below zero).
    combined = _mv(grads, coef.sum(0), out)
    norms = ((coef @ gram) * coef).sum(1).clamp_(min=0.0).sqrt_()  # (K,)
    return _result(combined, conflicts, norms)


def plain_sum(
    task_grads: Sequence[torch.Tensor] | torch.Tensor, *, out: torch.Tensor | None = None
) -> AggregationResult:
    """The baseline: sum the task gradients; conflicts and teacher share are still measured.

    Args:
        task_grads: K flat (N,) gradients or one (K, N) tensor; task 0 is the teacher.
        out: Optional (N,) buffer for the combined gradient.

    Returns:
        The summed gradient and telemetry (teacher share of the unprojected norms); no sync.
    """
    grads = _as_matrix(task_grads)  # (K, N)
    gram, conflicts = _gram(grads)
    _check_out(grads, out)
    combined = torch.sum(grads, 0, out=out) if out is not None else grads.sum(0)
    return _result(combined, conflicts, gram.diagonal().sqrt())


def _as_matrix(task_grads: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    if isinstance(task_grads, torch.Tensor):
        grads = task_grads
    else:
        if not task_grads:
            raise ValueError("no task gradients to aggregate; pass at least the teacher's")
        grads = torch.stack(list(task_grads))
    if grads.dim() != 2 or grads.shape[0] < 1:
        raise ValueError(f"task gradients must be K >= 1 flat vectors, a (K, N) tensor; got shape {tuple(grads.shape)}")
    return grads


def _check_out(grads: torch.Tensor, out: torch.Tensor | None) -> None:
    if out is not None and out.shape != grads.shape[1:]:
        raise ValueError(f"out has shape {tuple(out.shape)}; the combined gradient needs ({grads.shape[1]},)")


def _mv(grads: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    # (N, K) @ (K,) -> (N,); mv rather than matmul, which would resize a 1-D out to (1, N).
    _check_out(grads, out)
    weights = weights.to(grads.dtype)
    return torch.mv(grads.t(), weights, out=out) if out is not None else torch.mv(grads.t(), weights)


def _result(combined: torch.Tensor, conflicts: torch.Tensor, norms: torch.Tensor) -> AggregationResult:
    k = norms.shape[0]
    # All-zero gradients give 0 / tiny = 0 rather than NaN.
    share = norms[0] / norms.sum().clamp_min(torch.finfo(norms.dtype).tiny)
    return AggregationResult(combined=combined, conflicts=conflicts, pairs=k * (k - 1) // 2, teacher_share=share)


@dataclass(frozen=True, slots=True)
class _Pairs:
    """Index plan for the Gram matrix of K tasks: its K diagonal entries first, then i < j."""

    pairs: tuple[tuple[int, int], ...]
    upper: torch.Tensor  # (K(K+1)/2,) flat index of each pair in a row-major (K, K) matrix
    symmetric: torch.Tensor  # (K*K,) index into ``pairs`` of entry (i, j) and of (j, i)


@functools.lru_cache(maxsize=32)
def _pair_plan(k: int, device: torch.device) -> _Pairs:
    # Cached per (K, device): a step does no host-to-device copy.
    pairs = tuple((i, i) for i in range(k)) + tuple((i, j) for i in range(k) for j in range(i + 1, k))
    where = {p: n for n, p in enumerate(pairs)}
    symmetric = [where[(min(i, j), max(i, j))] for i in range(k) for j in range(k)]
    return _Pairs(
        pairs=pairs,
        upper=torch.tensor([i * k + j for i, j in pairs], device=device),
        symmetric=torch.tensor(symmetric, device=device),
    )


def _gram(grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (K, K) float64 Gram matrix of the task gradients and the () count of conflicting pairs.

    The only pass over the gradients besides the combine. On CPU, K(K+1)/2 dot products beat one
    (K, N) x (N, K) sgemm, which MKL handles poorly (3 x 100k: 57 vs 100 us, and tens of ms when
    the cores are contended); on CUDA one matmul is one kernel. Each unordered pair is computed
    once, so the matrix is exactly symmetric. The K x K algebra after this runs in float64: it is
    tiny, and projected norms come from differences of Gram entries.
    """
    k = grads.shape[0]
    plan = _pair_plan(k, grads.device)
    if grads.device.type == "cpu":
        rows = grads.unbind(0)
        upper = torch.stack([torch.dot(rows[i], rows[j]) for i, j in plan.pairs])  # (K(K+1)/2,)
    else:
        upper = torch.mm(grads, grads.t()).view(-1).index_select(0, plan.upper)  # (K(K+1)/2,)
    upper = upper.to(torch.float64)
    gram = upper.index_select(0, plan.symmetric).view(k, k)
    conflicts = (upper[k:] < 0).sum()  # the off-diagonal pairs
    return gram, conflicts


@dataclass(frozen=True, slots=True)
class _Rounds:
    """The order in which each task visits the others, as K - 1 rounds over all tasks at once."""

    cols: torch.Tensor  # ((K-1) * K,) row-major (K-1, K): cols[r, i] is the task i visits in round r
    entries: tuple[torch.Tensor, ...]  # K-1 x (K,): flat index of entry (i, cols[r, i]) of a (K, K) matrix


@functools.lru_cache(maxsize=32)
def _fixed_rounds(k: int, device: torch.device) -> _Rounds:
    # Cached per (K, device). Round r: task i visits the r-th task of range(K) without i.
    cols = torch.tensor([[r if r < i else r + 1 for i in range(k)] for r in range(k - 1)], dtype=torch.long)
    return _rounds(cols.reshape(k - 1, k), device)


def _shuffled_rounds(k: int, device: torch.device, generator: torch.Generator) -> _Rounds:
    others = torch.tensor([[j for j in range(k) if j != i] for i in range(k)], dtype=torch.long)  # (K, K-1)
    perms = torch.stack([torch.randperm(k - 1, generator=generator) for _ in range(k)])  # (K, K-1)
    return _rounds(others.gather(1, perms).t().reshape(k - 1, k), device)


def _rounds(cols: torch.Tensor, device: torch.device) -> _Rounds:
    k = cols.shape[1]
    entries = (torch.arange(k) * k + cols).to(device)  # (K-1, K)
    return _Rounds(cols=cols.reshape(-1).to(device), entries=tuple(entries.unbind(0)))


# ---------------------------------------------------------------------- telemetry


class AggregationStats:
    """Per-epoch aggregation telemetry, accumulated on the device and reduced with one sync.

    ``conflict_ratio`` is conflicting pairs over all pairs across the epoch's aggregated steps;
    ``teacher_share`` is the mean of the per-step shares; ``steps`` counts aggregated steps.
    """

    def __init__(self) -> None:
        self._conflicts: torch.Tensor | None = None  # () int64
        self._share_sum: torch.Tensor | None = None  # () float64
        self._pairs = 0
        self._steps = 0

    def reset(self) -> None:
        """Drop everything accumulated (``reduce`` does this itself)."""
        self._conflicts = self._share_sum = None
        self._pairs = self._steps = 0

    @property
    def steps(self) -> int:
        """Aggregated steps since the last ``reduce`` (host-side count)."""
        return self._steps

    def update(self, result: AggregationResult) -> None:
        """Add one step's result (device ops only)."""
        if self._conflicts is None or self._share_sum is None:
            self._conflicts = result.conflicts.clone()
            self._share_sum = result.teacher_share.to(torch.float64, copy=True)
        else:
            self._conflicts += result.conflicts
            self._share_sum += result.teacher_share
        self._pairs += result.pairs
        self._steps += 1

    def reduce(self) -> dict[str, float]:
        """The epoch's metrics by telemetry name; resets the accumulators.

        Exactly one device-to-host transfer (``tolist``) when steps were aggregated, none
        otherwise (every metric is then 0.0, so the series stays continuous).
        """
        if self._conflicts is None or self._share_sum is None:
            return {CONFLICT_RATIO: 0.0, TEACHER_SHARE: 0.0, STEPS: 0.0}
        # int64 -> float64 is exact for any realistic count.
        conflicts, share_sum = torch.stack([self._conflicts.to(torch.float64), self._share_sum]).tolist()
        metrics = {
            CONFLICT_RATIO: conflicts / self._pairs if self._pairs else 0.0,
            TEACHER_SHARE: share_sum / self._steps,
            STEPS: float(self._steps),
        }
        self.reset()
        return metrics


# ---------------------------------------------------------------------- the step helper


def aggregate_microbatches(
    losses: Sequence[torch.Tensor],
    shared_params: Sequence[nn.Parameter],
    pool: GradientBufferPool,
    config: AggregationConfig,
    stats: AggregationStats,
    *,
    private_params: Sequence[Sequence[nn.Parameter]] | None = None,
    losses_share_graph: bool = False,
    reduce_rows: Callable[[torch.Tensor], None] | None = None,
) -> AggregationResult:
    """Backward each microbatch loss, aggregate the shared gradients, accumulate into ``.grad``.

    Each loss gets one ``torch.autograd.grad`` call over ``shared_params`` (plus its
    ``private_params``); its shared gradient is copied into a pooled row, the K rows are combined
    by PCGrad or a sum (``config.mode``) into the pool's output buffer, and the result is
    accumulated into the shared parameters' ``.grad`` like ``backward`` would: a parameter without
    a gradient gets a view of the pool's grad arena (no copy, no allocation), an existing gradient
    is added to. Call ``optimizer.zero_grad(set_to_none=True)`` first for the zero-copy path.

    Seed parameters are not shared and are never aggregated. Pass each loss's trainable seed
    parameters in ``private_params`` (teacher: ``[]``) to have their gradients accumulated plainly
    from the same backward pass; or leave it ``None`` and run
    ``loss.backward(inputs=seed_params, retain_graph=True)`` yourself before calling this, which
    costs a second backward through the graph.

    Args:
        losses: K scalar losses; index 0 is the teacher microbatch (host, seeds bypassed), then
            one per trainable seed. Scale them as the plain step would (e.g. sum-reduced over the
            microbatch and divided by the full batch size) so ``sum`` mode matches the plain step.
            Under a GradScaler pass ``scaler.scale(loss)``: PCGrad commutes with a common positive
            scale (conflicts and teacher share are unchanged), so ``unscale_`` works as usual.
        shared_params: Host parameters; every loss is differentiated with respect to all of them
            (one that a loss does not reach contributes zeros).
        pool: Buffers for the flat gradients; rebound to ``shared_params`` (free when unchanged).
        config: Aggregation mode.
        stats: Receives this step's conflicts and teacher share (on the device).
        private_params: Optional per-loss parameters whose gradients are accumulated into
            ``.grad`` without aggregation; same length as ``losses``.
        losses_share_graph: True when the losses come from one forward pass (e.g. slices of one
            output); the graph is then retained for every loss but the last. Separate forwards,
            the usual case, need no retained graph.
        reduce_rows: Called on the (K, N) task gradients, in place, before they are combined (a
            data-parallel run sums them over its ranks there).

    Returns:
        The step's result; ``combined`` is pool memory that the parameters' ``.grad`` may alias.

    Raises:
        ValueError: if ``losses`` is empty or ``private_params`` does not match it.
    """
    k = len(losses)
    if k < 1:
        raise ValueError("aggregate_microbatches needs at least one loss (the teacher's)")
    if private_params is not None and len(private_params) != k:
        raise ValueError(f"private_params has {len(private_params)} entries for {k} losses; give [] for the teacher")
    shared = tuple(shared_params)
    n_shared = len(shared)
    pool.bind(shared)
    pool.acquire(k)
    try:
        for i, loss in enumerate(losses):
            private = tuple(private_params[i]) if private_params is not None else ()
            grads = torch.autograd.grad(
                loss,
                (*shared, *private),
                retain_graph=losses_share_graph and i < k - 1,
                allow_unused=True,
            )
            pool.load(i, grads[:n_shared])
            if private:
                _accumulate(private, grads[n_shared:])
        if reduce_rows is not None:
            reduce_rows(pool.stacked())
        out = pool.output()
        if config.mode == "pcgrad":
            result = pcgrad(pool.stacked(), out=out)
        else:
            result = plain_sum(pool.stacked(), out=out)
        pool.store(out)
    finally:
        pool.release()
    stats.update(result)
    return result


def _accumulate(params: Sequence[nn.Parameter], grads: Sequence[torch.Tensor | None]) -> None:
    # autograd's accumulation for parameters outside the aggregation: keep a fresh gradient
    # (autograd.grad returned it to us alone) unless it is an expanded or strided view that a
    # later in-place add could not write, and add to an existing one.
    held_dst: list[torch.Tensor] = []
    held_src: list[torch.Tensor] = []
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g if g.is_contiguous() else g.contiguous()
        else:
            held_dst.append(p.grad)
            held_src.append(g)
    if held_dst:
        torch._foreach_add_(held_dst, held_src)
