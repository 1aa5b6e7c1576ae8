"""Gradient aggregation: PCGrad against its formula and a reference loop, pooled flat buffers,
the microbatch step helper on a real model, epoch telemetry with one sync, config validation."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from esper_core.contracts import SeedStage
from esper_core.hosts import HostConfig, MLPHost
from esper_core.tolaria.aggregation import (
    CONFLICT_RATIO,
    STEPS,
    TEACHER_SHARE,
    AggregationConfig,
    AggregationStats,
    aggregate_microbatches,
    pcgrad,
    plain_sum,
)
from esper_core.tolaria.buffers import GradientBufferPool, flatten_grads_into, unflatten_into_grads
from tests.helpers.runif import devices, requires_cuda

# A resized ``out`` or similar misuse warns; here it fails.
pytestmark = pytest.mark.filterwarnings("error::UserWarning")

# Tensor methods that copy a value to the host (on CUDA: a sync). Counting them on CPU shows
# where a CUDA run would block.
_SYNC_METHODS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def host_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A list that records every host-sync method called on a tensor while the test runs."""
    calls: list[str] = []
    for name in _SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: object, _name: str = name, _orig: object = original) -> object:
            calls.append(_name)
            return _orig(self, *args)  # type: ignore[operator]

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield calls


def reference_pcgrad(
    grads: list[torch.Tensor], generator: torch.Generator | None = None
) -> tuple[torch.Tensor, int, float]:
    """PCGrad as in the paper's code: a Python loop over tasks with torch.dot."""
    k = len(grads)
    projected = []
    for i in range(k):
        order = [j for j in range(k) if j != i]
        if generator is not None:
            order = [order[int(t)] for t in torch.randperm(k - 1, generator=generator)]
        g = grads[i].clone()
        for j in order:
            d = torch.dot(g, grads[j])
            if d < 0:
                g -= d / torch.dot(grads[j], grads[j]) * grads[j]
        projected.append(g)
    conflicts = sum(int(torch.dot(grads[i], grads[j]) < 0) for i in range(k) for j in range(i + 1, k))
    norms = [float(g.norm()) for g in projected]
    return torch.stack(projected).sum(0), conflicts, norms[0] / sum(norms)


# ---------------------------------------------------------------------- pcgrad


def test_conflicting_pair_is_projected_by_the_formula() -> None:
    g1, g2 = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])  # g1 . g2 = -1
    p1 = g1 - (g1 @ g2) / (g2 @ g2) * g2  # (0.5, 0.5)
    p2 = g2 - (g2 @ g1) / (g1 @ g1) * g1  # (0, 1)
    result = pcgrad([g1, g2])
    torch.testing.assert_close(result.combined, p1 + p2)
    assert (p1 @ g2).abs() < 1e-7 and (p2 @ g1).abs() < 1e-7  # each now normal to the other
    assert int(result.conflicts) == 1 and result.pairs == 1
    assert float(result.teacher_share) == pytest.approx(p1.norm().item() / (p1.norm() + p2.norm()).item())


def test_non_conflicting_pair_is_the_plain_sum() -> None:
    g1, g2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])  # dot = 1 > 0
    result = pcgrad([g1, g2])
    assert torch.equal(result.combined, g1 + g2)
    assert int(result.conflicts) == 0
    assert float(result.teacher_share) == pytest.approx((g1.norm() / (g1.norm() + g2.norm())).item())
    baseline = plain_sum([g1, g2])
    assert torch.equal(baseline.combined, g1 + g2) and float(baseline.teacher_share) == float(result.teacher_share)


def test_three_tasks_are_deterministic() -> None:
    grads = torch.tensor([[1.0, 0.0, 0.5], [-1.0, 1.0, 0.0], [0.2, -2.0, 1.0]])
    first = pcgrad(grads)
    for _ in range(3):
        again = pcgrad(grads.clone())
        assert torch.equal(again.combined, first.combined)
        assert torch.equal(again.teacher_share, first.teacher_share)
    expected, conflicts, share = reference_pcgrad(list(grads.double()))
    torch.testing.assert_close(first.combined.double(), expected, rtol=1e-6, atol=1e-6)
    assert int(first.conflicts) == conflicts == 2 and first.pairs == 3
    assert float(first.teacher_share) == pytest.approx(share)
    # A seeded shuffle is reproducible too.
    a = pcgrad(grads, generator=torch.Generator().manual_seed(3))
    b = pcgrad(grads, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.combined, b.combined)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("seed", range(6))
def test_pcgrad_matches_reference_loop(seed: int, device: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    k = 2 + seed % 4
    # Shared component sometimes negated so every run mixes conflicting and aligned pairs.
    base = torch.randn(40, generator=gen, dtype=torch.float64)
    grads = [s * base + torch.randn(40, generator=gen, dtype=torch.float64) for s in (1, -1, 0.5, -0.3, 2)[:k]]
    expected, conflicts, share = reference_pcgrad(grads)
    result = pcgrad([g.to(device) for g in grads])
    torch.testing.assert_close(result.combined.cpu(), expected, rtol=1e-10, atol=1e-10)
    assert int(result.conflicts) == conflicts and result.pairs == k * (k - 1) // 2
    assert float(result.teacher_share) == pytest.approx(share, rel=1e-10)
    # The shuffled order, drawn from the same generator state, matches the shuffled reference.
    expected_shuffled, _, _ = reference_pcgrad(grads, torch.Generator().manual_seed(seed))
    shuffled = pcgrad([g.to(device) for g in grads], generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(shuffled.combined.cpu(), expected_shuffled, rtol=1e-10, atol=1e-10)
    # float32 gradients agree with the float64 reference to float32 accuracy.
    single = pcgrad([g.float().to(device) for g in grads])
    torch.testing.assert_close(single.combined.cpu().double(), expected, rtol=1e-5, atol=1e-5)


def test_pcgrad_and_sum_do_not_sync(host_syncs: list[str]) -> None:
    grads = torch.randn(3, 1000)
    out = torch.empty(1000)
    stats = AggregationStats()
    stats.update(pcgrad(grads, out=out))
    stats.update(plain_sum(grads, out=out))
    assert host_syncs == []


@requires_cuda("checks that pcgrad never blocks the host")
def test_pcgrad_does_not_sync_on_cuda() -> None:
    grads = torch.randn(3, 10_000, device="cuda")
    pcgrad(grads)  # builds the cached round indices (one host-to-device copy)
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        # Setting the mode warns that it is a prototype (which pytest would raise).
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        AggregationStats().update(pcgrad(grads))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_single_task_passes_through() -> None:
    g = torch.tensor([3.0, -4.0])
    result = pcgrad([g])
    assert torch.equal(result.combined, g) and result.pairs == 0 and int(result.conflicts) == 0
    assert float(result.teacher_share) == 1.0
    assert float(pcgrad(torch.zeros(2, 3)).teacher_share) == 0.0  # all-zero gradients: 0, not NaN


def test_pcgrad_traces_as_one_graph() -> None:
    # A graph break would mean a data-dependent branch or a host sync crept in.
    try:
        with warnings.catch_warnings():
            # Dynamo traces through the lru_cache of index plans (they only depend on K): fine.
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
            explained = torch._dynamo.explain(lambda g: pcgrad(g).combined)(torch.randn(3, 64))
    finally:
        torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_invalid_task_gradients_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least the teacher"):
        pcgrad([])
    with pytest.raises(ValueError, match=r"\(K, N\)"):
        pcgrad(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"needs \(3,\)"):
        pcgrad(torch.zeros(2, 3), out=torch.zeros(4))


# ---------------------------------------------------------------------- buffers


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_pool_reuses_storage_and_reallocates_on_layout_change() -> None:
    model = _mlp()
    pool = GradientBufferPool(list(model.parameters()))
    rows = pool.acquire(3)
    ptrs = [r.data_ptr() for r in rows]
    assert [r.shape for r in rows] == [(4 * 8 + 8 + 8 * 3 + 3,)] * 3
    assert pool.stacked().data_ptr() == ptrs[0] and pool.stacked().shape == (3, 67)
    with pytest.raises(RuntimeError, match="release"):
        pool.acquire(1)
    pool.release()
    for _ in range(3):  # later steps, fewer or as many rows: same storage
        assert [r.data_ptr() for r in pool.acquire(3)] == ptrs
        pool.release()
        assert pool.acquire(2)[0].data_ptr() == ptrs[0]
        pool.release()
    assert pool.allocations == 1
    pool.bind(list(_mlp().parameters()))  # other parameters, same layout: buffers kept
    assert pool.acquire(3)[0].data_ptr() == ptrs[0] and pool.allocations == 1
    pool.release()
    pool.bind(list(nn.Linear(4, 5).parameters()))  # new layout
    rows = pool.acquire(3)
    assert rows[0].shape == (25,) and pool.allocations == 2
    pool.release()


def test_flatten_unflatten_round_trip_with_a_none_grad() -> None:
    model = _mlp()
    F.cross_entropy(model(torch.randn(5, 4)), torch.tensor([0, 1, 2, 0, 1])).backward()
    params = list(model.parameters())
    params[1].grad = None  # first bias: no gradient
    flat = flatten_grads_into(params, torch.full((67,), float("nan")))
    assert torch.equal(flat[32:40], torch.zeros(8))  # the None grad is zeros
    assert torch.equal(flat[:32], params[0].grad.flatten()) and torch.equal(flat[40:64], params[2].grad.flatten())
    originals = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    fresh = list(_mlp().parameters())  # no grads: they become views of the buffer
    unflatten_into_grads(flat, fresh)
    for p, g in zip(fresh, originals, strict=True):
        assert torch.equal(p.grad, g)
        assert p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    unflatten_into_grads(flat.clone(), params)  # existing grads: copied over
    assert all(torch.equal(p.grad, g) for p, g in zip(params, originals, strict=True))
    unflatten_into_grads(flat, params, accumulate=True)
    assert all(torch.equal(p.grad, 2 * g) for p, g in zip(params, originals, strict=True))


def test_mixed_dtypes_are_rejected_with_advice() -> None:
    params = [torch.zeros(2), torch.zeros(2, dtype=torch.float64)]
    with pytest.raises(ValueError, match="one device and dtype"):
        flatten_grads_into(params, torch.zeros(4))


# ---------------------------------------------------------------------- the step helper


def _losses(model: nn.Module, seed_mod: nn.Module | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    xa, xb = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)
    ya, yb = torch.randint(0, 3, (6,), generator=gen), torch.randint(0, 3, (6,), generator=gen)
    device = next(model.parameters()).device
    xa, xb, ya, yb = (t.to(device) for t in (xa, xb, ya, yb))
    teacher = F.cross_entropy(model(xa), ya)
    # Mostly the teacher's loss reversed, so the two host gradients conflict.
    hb = xb if seed_mod is None else xb + seed_mod(xb)
    other = -0.5 * F.cross_entropy(model(xa), ya) + 0.2 * F.cross_entropy(model(hb), yb)
    return [teacher, other]


@pytest.mark.parametrize("device", devices())
def test_aggregate_microbatches_pcgrad_matches_manual(device: str) -> None:
    model = _mlp().to(device)
    params = list(model.parameters())
    manual = [torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]) for loss in _losses(model)]
    expected = pcgrad(manual)
    ref_combined, ref_conflicts, _ = reference_pcgrad([g.double() for g in manual])
    assert ref_conflicts == 1  # the projection path is exercised

    pool, stats = GradientBufferPool(), AggregationStats()
    result = aggregate_microbatches(_losses(model), params, pool, AggregationConfig(), stats)
    flat_grad = torch.cat([p.grad.flatten() for p in params])
    assert torch.equal(flat_grad, expected.combined)
    torch.testing.assert_close(flat_grad.double(), ref_combined, rtol=1e-5, atol=1e-6)
    assert stats.steps == 1 and int(result.conflicts) == 1
    # Zero-copy path: the gradients are views of the pool's arena, the same memory every step.
    arena = result.combined.untyped_storage().data_ptr()
    assert all(p.grad.untyped_storage().data_ptr() == arena for p in params)
    model.zero_grad(set_to_none=True)
    again = aggregate_microbatches(_losses(model), params, pool, AggregationConfig(), stats)
    assert again.combined.data_ptr() == result.combined.data_ptr() and pool.allocations == 2  # rows + arena
    assert torch.equal(torch.cat([p.grad.flatten() for p in params]), expected.combined)


def test_sum_mode_equals_the_gradient_of_the_summed_losses() -> None:
    model = _mlp()
    params = list(model.parameters())
    expected = torch.autograd.grad(sum(_losses(model)), params)
    aggregate_microbatches(
        _losses(model), params, GradientBufferPool(), AggregationConfig(mode="sum"), AggregationStats()
    )
    for p, g in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_existing_grads_accumulate_and_private_params_get_plain_grads() -> None:
    model, seed_mod = _mlp(), nn.Linear(4, 4)
    params, seed_params = list(model.parameters()), list(seed_mod.parameters())
    losses = _losses(model, seed_mod)
    shared = [torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=True)]) for loss in losses]
    seed_expected = torch.autograd.grad(losses[1], seed_params)
    for p in params:
        p.grad = torch.ones_like(p)  # accumulated onto, like backward()
    params[1].grad = None  # ...except one without a gradient, which gets the combined slice
    seed_params[0].grad = torch.ones_like(seed_params[0])
    aggregate_microbatches(
        _losses(model, seed_mod),
        params,
        GradientBufferPool(),
        AggregationConfig(),
        AggregationStats(),
        private_params=[[], seed_params],
    )
    offset = torch.ones(67)
    offset[32:40] = 0.0  # params[1], the first layer's bias
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in params]), offset + pcgrad(shared).combined)
    torch.testing.assert_close(seed_params[0].grad, 1 + seed_expected[0])
    torch.testing.assert_close(seed_params[1].grad, seed_expected[1])


def test_losses_from_one_forward_need_losses_share_graph() -> None:
    model = _mlp()
    params = list(model.parameters())
    logits = model(torch.randn(8, 4))
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    losses = [F.cross_entropy(logits[:4], y[:4]), F.cross_entropy(logits[4:], y[4:])]
    expected = pcgrad(
        [torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=True)]) for loss in losses]
    )
    stats = AggregationStats()
    aggregate_microbatches(losses, params, GradientBufferPool(), AggregationConfig(), stats, losses_share_graph=True)
    assert torch.equal(torch.cat([p.grad.flatten() for p in params]), expected.combined)


def test_isolated_training_seeds_on_a_real_host_do_not_conflict() -> None:
    # The documented protocol on a real host: teacher with every seed bypassed, then one loss per
    # seed with only that seed applied. TRAINING seeds add exactly zero to the forward value and
    # send no gradient to the host, so on the same samples every task's host gradient is the
    # teacher's: no conflicts, PCGrad is K times that gradient, teacher share 1/K.
    torch.manual_seed(0)
    host = MLPHost(HostConfig(hidden=(8, 8), slot_inputs=(1, 2)), feature_shape=(4,), num_classes=3)
    slots = host.slots()
    for slot in slots.values():
        slot.seed, slot.stage = nn.Linear(8, 8), SeedStage.TRAINING
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def loss_with(keep: str | None) -> torch.Tensor:
        seeds = {sid: slot.seed for sid, slot in slots.items()}
        for sid, slot in slots.items():
            slot.seed = seeds[sid] if sid == keep else None
        try:
            return F.cross_entropy(host(x), y)
        finally:
            for sid, slot in slots.items():
                slot.seed = seeds[sid]

    params = host.host_parameters()
    teacher = torch.cat([g.flatten() for g in torch.autograd.grad(loss_with(None), params)])
    seed_grads = {sid: torch.autograd.grad(loss_with(sid), list(slots[sid].seed.parameters())) for sid in slots}
    stats = AggregationStats()
    result = aggregate_microbatches(
        [loss_with(None), *(loss_with(sid) for sid in slots)],
        params,
        GradientBufferPool(),
        AggregationConfig(),
        stats,
        private_params=[[], *(list(slots[sid].seed.parameters()) for sid in slots)],
    )
    assert int(result.conflicts) == 0 and result.pairs == 3
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in params]), 3 * teacher)
    for sid, expected in seed_grads.items():
        for p, g in zip(slots[sid].seed.parameters(), expected, strict=True):
            torch.testing.assert_close(p.grad, g)
    assert stats.reduce()[TEACHER_SHARE] == pytest.approx(1 / 3)


def test_aggregate_microbatches_rejects_mismatched_private_params() -> None:
    model = _mlp()
    with pytest.raises(ValueError, match="give \\[\\] for the teacher"):
        aggregate_microbatches(
            _losses(model),
            list(model.parameters()),
            GradientBufferPool(),
            AggregationConfig(),
            AggregationStats(),
            private_params=[[]],
        )


# ---------------------------------------------------------------------- telemetry


def test_stats_reduce_matches_eager_reduction_with_one_sync(host_syncs: list[str]) -> None:
    gen = torch.Generator().manual_seed(7)
    results = [pcgrad(torch.randn(k, 50, generator=gen)) for k in (2, 3, 4, 3, 2)]
    conflicts = pairs = 0
    share_sum = 0.0
    for r in results:  # eager: one sync per step
        conflicts += int(r.conflicts.item())
        pairs += r.pairs
        share_sum += r.teacher_share.item()
    eager = {CONFLICT_RATIO: conflicts / pairs, TEACHER_SHARE: share_sum / len(results), STEPS: float(len(results))}
    assert 0 < conflicts < pairs
    host_syncs.clear()

    stats = AggregationStats()
    for r in results:
        stats.update(r)
    assert host_syncs == []
    assert stats.reduce() == eager  # identical floats, not approximately equal
    assert host_syncs == ["tolist"]
    host_syncs.clear()
    assert stats.reduce() == {CONFLICT_RATIO: 0.0, TEACHER_SHARE: 0.0, STEPS: 0.0}  # reset; no step, no sync
    assert host_syncs == []


# ---------------------------------------------------------------------- config


def test_config_validation_says_how_to_fix() -> None:
    with pytest.raises(ValueError, match=r"one of \('pcgrad', 'sum'\), got 'mgda'; use 'sum'"):
        AggregationConfig(mode="mgda")
    with pytest.raises(ValueError, match="must be >= 2, got 1.*set 2"):
        AggregationConfig(min_seeds_for_pcgrad=1)
    with pytest.raises(TypeError):
        AggregationConfig("sum")  # type: ignore[misc]  # keyword-only
    config = AggregationConfig(min_seeds_for_pcgrad=3)
    assert [config.aggregates(n) for n in (0, 1, 2, 3, 4)] == [False, False, False, True, True]
