"""Kasmina drops torch.export's per-call input checks only after verifying the guard itself."""

from __future__ import annotations

import torch

from esper_core.karn.catalog import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.fastpath import strip_runtime_guards
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
