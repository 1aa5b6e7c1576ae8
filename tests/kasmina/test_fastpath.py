"""Kasmina drops torch.export's per-call input checks only after verifying the guard itself."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx

from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.fastpath import call_ops_directly, prepare_seed, strip_runtime_guards
from esper_core.kasmina.loader import load_kernel
from esper_core.tezzeret.compiler import compile_blueprint


def test_stripped_exported_kernel_computes_the_same_and_trains() -> None:
    catalog = default_catalog()
    kernel = compile_blueprint(catalog, "residual_mlp", ShapeProfile(feature_shape=(16,), batch_max=64))
    module = load_kernel(kernel.artifact, kernel.blob, catalog=catalog, device="cpu").module
    x = torch.randn(5, 16)
    expected = module(x)
    strip_runtime_guards(module)
    assert torch.equal(module(x), expected)
    assert not [n for n in module.graph.nodes if n.op == "call_module" and n.target == "_guards_fn"]
    # One tensor in, one out: the generated forward no longer flattens through pytree specs.
    assert "pytree" not in module.code and "tree_flatten" not in module.code
    assert not module._forward_pre_hooks and not module._forward_hooks  # every call takes the fast path
    assert torch.equal(module(x), expected) and module(x).shape == (5, 16)
    module(x).sum().backward()
    assert all(p.grad is not None for p in module.parameters())


def test_modules_without_runtime_checks_are_untouched() -> None:
    module = torch.nn.Linear(4, 4)
    assert strip_runtime_guards(module) is module
    assert module(torch.randn(2, 4)).shape == (2, 4)


@pytest.mark.parametrize(
    ("blueprint", "shape"), [("lowrank_adapter", (16,)), ("seq_conv_residual", (8, 10)), ("conv_residual", (4, 6, 6))]
)
def test_ops_called_through_their_bindings_compute_and_train_bit_identically(blueprint: str, shape: tuple) -> None:
    catalog = default_catalog()
    kernel = compile_blueprint(catalog, blueprint, ShapeProfile(feature_shape=shape, batch_max=64))
    module = strip_runtime_guards(load_kernel(kernel.artifact, kernel.blob, catalog=catalog, device="cpu").module)
    reference = copy.deepcopy(module)
    rebound = call_ops_directly(module, torch.randn(2, *shape))
    assert rebound and all(op.startswith("aten.") for op in rebound)
    assert "torch.ops.aten" not in module.code
    x = torch.randn(5, *shape)
    out, expected = module(x), reference(x)
    assert torch.equal(out, expected)
    out.square().sum().backward(), expected.square().sum().backward()
    for p, q in zip(module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_a_binding_that_would_dispatch_another_overload_is_not_used() -> None:
    # torch.add(x, 2.0) dispatches aten.add.Tensor (a wrapped number), not the graph's add.Scalar.
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.add.Scalar, (x, 2.0)))
    module = fx.GraphModule(torch.nn.Module(), graph)
    assert call_ops_directly(module, torch.randn(2, 3)) == ()
    assert "torch.ops.aten.add.Scalar" in module.code
    assert torch.equal(module(torch.ones(1)), torch.full((1,), 3.0))


def test_rebinding_draws_nothing_from_the_random_stream() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.dropout.default, (x, 0.5, True)))
    module = fx.GraphModule(torch.nn.Module(), graph)
    example = torch.randn(8, 8)
    state = torch.get_rng_state()
    # Both runs draw the same dropout mask (the state is restored after each), so the check passes.
    assert call_ops_directly(module, example) == ("aten.dropout.default",)
    assert torch.equal(torch.get_rng_state(), state)


def test_rebinding_leaves_the_seeds_buffers_as_they_were() -> None:
    # An exported batch norm in training mode updates its running statistics on every call.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    module = strip_runtime_guards(torch.export.export(model, (torch.randn(8, 4),)).module())
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert call_ops_directly(module, torch.randn(8, 4))
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


def test_an_example_the_seed_cannot_take_leaves_it_as_it_is() -> None:
    catalog = default_catalog()
    kernel = compile_blueprint(catalog, "lowrank_adapter", ShapeProfile(feature_shape=(16,), batch_max=64))
    module = strip_runtime_guards(load_kernel(kernel.artifact, kernel.blob, catalog=catalog, device="cpu").module)
    code = module.code
    assert call_ops_directly(module, torch.randn(2, 7)) == ()  # 7 features where it takes 16
    assert module.code == code
    assert module(torch.randn(3, 16)).shape == (3, 16)


def test_a_prepared_seed_has_neither_guards_nor_overload_calls_and_draws_no_random_numbers() -> None:
    catalog = default_catalog()
    profile = ShapeProfile(feature_shape=(8, 10), batch_max=64)
    kernel = compile_blueprint(catalog, "seq_conv_residual", profile)
    module = load_kernel(kernel.artifact, kernel.blob, catalog=catalog, device="cpu").module
    state = torch.get_rng_state()
    assert prepare_seed(module, profile) is module
    assert torch.equal(torch.get_rng_state(), state)
    assert "torch.ops.aten" not in module.code and "_guards_fn" not in module.code
