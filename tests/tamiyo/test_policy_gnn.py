"""Tamiyo's hetero-GNN policy: output shapes, determinism, trainability, CUDA compile budget."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from bench.policy import pyg_layer
from esper_core.contracts import BlendSchedule
from esper_core.tamiyo.build import PreparedPolicy, autocast_dtype
from esper_core.tamiyo.config import PolicyCompileConfig
from esper_core.tamiyo.graph import EDGE_TYPES, TamiyoGraph, build_graph
from esper_core.tamiyo.model import ACTIONS, HeteroSAGELayer, PolicyOutput, TamiyoGNN, TamiyoGNNConfig, _mean_edges
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from tests.helpers.runif import requires_cuda

CPU = torch.device("cpu")


def _small_graph() -> TamiyoGraph:
    return build_graph(synthetic_history(num_layers=3, num_slots=2), synthetic_candidates(3))


def _policy_graph() -> TamiyoGraph:
    """The ``policy-graph`` workload: 1 global + 40 layers + 6 slots + 4 blueprints = 51 nodes."""
    return build_graph(synthetic_history(num_layers=40, num_slots=6), synthetic_candidates(4))


def _model(seed: int = 0) -> TamiyoGNN:
    torch.manual_seed(seed)
    return TamiyoGNN(TamiyoGNNConfig())


def _assert_shapes(out: PolicyOutput, num_slots: int, num_blueprints: int) -> None:
    assert out.action_logits.shape == (1, len(ACTIONS))
    assert out.slot_scores.shape == (num_slots,)
    assert out.blueprint_scores.shape == (num_blueprints,)
    assert out.blend_logits.shape == (1, len(BlendSchedule))
    assert out.lr_adjust.shape == out.value.shape == out.risk.shape == (1,)
    assert (out.lr_adjust.abs() < 1).all() and ((out.risk > 0) & (out.risk < 1)).all()
    assert all(torch.isfinite(t).all() for t in out)


@pytest.mark.parametrize(("graph_fn", "num_slots", "num_blueprints"), [(_small_graph, 2, 3), (_policy_graph, 6, 4)])
def test_forward_shapes(graph_fn: Callable[[], TamiyoGraph], num_slots: int, num_blueprints: int) -> None:
    graph = graph_fn()
    with torch.inference_mode():
        out = _model().eval()(*graph.inputs(CPU))
    _assert_shapes(out, num_slots, num_blueprints)


def test_forward_under_bf16_autocast_follows_full_precision() -> None:
    """Tamiyo serves under bf16 autocast on CUDA (``PreparedPolicy``); CPU autocast takes the same
    mixed-dtype path: bf16 embeddings, fp32 degrees. The first CUDA run found the message sum
    refusing the mix ("scatter(): Expected self.dtype to be equal to src.dtype")."""
    x_dict, edge_index_dict = _policy_graph().inputs(CPU)
    model = _model().eval()
    with torch.inference_mode():
        full = model(x_dict, edge_index_dict)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(x_dict, edge_index_dict)
    _assert_shapes(half, 6, 4)
    for a, b in zip(full, half, strict=True):
        torch.testing.assert_close(b.float(), a, atol=0.05, rtol=0.05)


def test_forward_without_slots_or_blueprints_gives_empty_scores() -> None:
    model = _model().eval()
    with torch.inference_mode():
        no_slots = model(*build_graph(synthetic_history(num_slots=0), synthetic_candidates(3)).inputs(CPU))
        nothing = model(*build_graph(synthetic_history(num_slots=0), []).inputs(CPU))
    _assert_shapes(no_slots, 0, 3)
    _assert_shapes(nothing, 0, 0)


def test_deterministic_under_a_fixed_seed() -> None:
    x_dict, edge_index_dict = _policy_graph().inputs(CPU)
    with torch.inference_mode():
        first = _model(seed=7).eval()(x_dict, edge_index_dict)
        second = _model(seed=7).eval()(x_dict, edge_index_dict)
        other = _model(seed=8).eval()(x_dict, edge_index_dict)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.action_logits, other.action_logits)


def test_gradients_reach_every_parameter() -> None:
    model = _model().train()
    out = model(*_small_graph().inputs(CPU))
    sum(t.sum() for t in out).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize(
    ("field", "value"), [("hidden_dim", 0), ("num_layers", 0), ("dropout", 1.0), ("dropout", -0.1)]
)
def test_config_rejects_bad_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TamiyoGNNConfig(**{field: value})  # type: ignore[arg-type]


def _p95_ms(
    policy: Callable[..., PolicyOutput],
    x_dict: dict[str, Tensor],
    edge_index_dict: dict[tuple[str, str, str], Tensor],
    iters: int = 50,
) -> float:
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        policy(x_dict, edge_index_dict)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[int(0.95 * (len(times) - 1))]


@pytest.mark.cuda
@pytest.mark.slow
@requires_cuda("Tamiyo compile perf budget (seed 002)")
def test_policy_inference_perf_budget_cuda_compile() -> None:
    """Seed 002: compiled p95 <= max(45 ms, eager p95 * 1.10) on the policy-graph workload.

    Both paths are Tamiyo's serving path (``PreparedPolicy``: inference mode, bf16 autocast,
    pinned inputs); the compiled one is compiled before timing (not in the background).
    """
    device = torch.device("cuda")
    model = _model().to(device).eval()
    dtype = autocast_dtype(device)
    eager = PreparedPolicy(model, device=device, compile_config=None, dtype=dtype)
    compiled = PreparedPolicy(model, device=device, compile_config=PolicyCompileConfig(background=False), dtype=dtype)
    x_dict, edge_index_dict = eager.inputs(_policy_graph())
    for _ in range(10):
        eager_out = eager(x_dict, edge_index_dict)
    eager_p95 = _p95_ms(eager, x_dict, edge_index_dict)
    compiled.warm(x_dict, edge_index_dict)
    # On a CUDA machine the compiled path is the product's (Triton is part of the CUDA build): a
    # fallback there is a failure to see, not a reason to skip.
    assert compiled.compile_enabled, f"torch.compile fell back during warm-up: {compiled.fallback_reason}"
    for _ in range(10):
        compiled_out = compiled(x_dict, edge_index_dict)
    torch.cuda.synchronize()
    assert compiled.last_call_compiled, (
        f"the compiled path did not serve the call: {compiled.fallback_reason or 'recompile'}"
    )
    # Both round to bf16, in different places (Inductor keeps fused pointwise work in fp32), so
    # each is held to the full-precision forward: the compiled one no farther from it than the
    # eager one's own rounding allows. (Held to eager at 0.02 instead, the first GPU run saw 0.12.)
    with torch.inference_mode():
        full = model(x_dict, edge_index_dict)
    for name, ref, a, b in zip(PolicyOutput._fields, full, eager_out, compiled_out, strict=True):
        eager_err = (a.float() - ref).abs().max().item() if ref.numel() else 0.0
        compiled_err = (b.float() - ref).abs().max().item() if ref.numel() else 0.0
        print(f"{name}: max |eager - fp32| {eager_err:.4f}, max |compiled - fp32| {compiled_err:.4f}")
        assert compiled_err <= 2 * eager_err + 2e-2, f"{name}: compiled {compiled_err:.4f} vs eager {eager_err:.4f}"
    compiled_p95 = _p95_ms(compiled, x_dict, edge_index_dict)

    budget_ms = max(45.0, eager_p95 * 1.10)
    assert compiled_p95 <= budget_ms, (
        f"compiled p95 {compiled_p95:.2f} ms exceeds budget {budget_ms:.2f} ms "
        f"(eager p95 {eager_p95:.2f} ms); try TORCH_LOGS=recompiles"
    )


def test_fused_layers_compute_what_pyg_heteroconv_sage_computes() -> None:
    """``HeteroSAGELayer`` is ``HeteroConv({r: SAGEConv((H, H), H)}, aggr="sum")`` in fused form."""
    hidden = 8
    graph = _small_graph()
    torch.manual_seed(0)
    h = {nt: torch.randn(graph.x_dict[nt].shape[0], hidden) for nt in graph.x_dict}
    edge_index_dict = graph.edge_index_dict
    for last in (False, True):
        ours = HeteroSAGELayer(hidden, last=last)
        pyg = pyg_layer(ours, hidden)
        edges = {et: _mean_edges(edge_index_dict[et], h[et[2]]) for et in EDGE_TYPES}
        with torch.no_grad():
            expected = pyg(h, {et: edge_index_dict[et] for rels in ours.relations.values() for et in rels})
            got = ours(h, edges)
        assert set(got) == set(expected)
        for nt in got:
            torch.testing.assert_close(got[nt], expected[nt], rtol=1e-5, atol=1e-5)
