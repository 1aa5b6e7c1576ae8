"""Token seeds (channels-last (B, L, D)): compiled ahead of time with a dynamic batch and a
bounded sequence length, neutral when fresh, and causal when the recipe's model is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.contracts import ArtifactKind, ArtifactStatus
from esper_core.karn.capacity import randomize_
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import GuardMismatchError, check_guard
from esper_core.tezzeret.compiler import compile_blueprint
from esper_core.tezzeret.config import TezzeretConfig
from esper_core.tezzeret.formats import decode_exported

CATALOG = default_catalog()
TOKENS = ShapeProfile(feature_shape=(12, 8), batch_max=16, tokens=True)
CAUSAL = ShapeProfile(feature_shape=(12, 8), batch_max=16, tokens=True, causal=True)
FAST = TezzeretConfig(timing_iters=3, warmup_iters=1)
TOK = ["tok_mlp", "tok_adapter", "tok_attention", "tok_glu", "tok_wide_mlp"]


def _reads_later_positions(module: nn.Module, length: int) -> bool:
    """Whether the output at some position t changes when only the inputs after t change."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, length, 8, generator=gen)
    t = length // 2
    later = x.clone()
    later[:, t + 1 :] = torch.randn(2, length - t - 1, 8, generator=gen)
    with torch.no_grad():
        return not torch.allclose(module(x)[:, : t + 1], module(later)[:, : t + 1], atol=1e-6)


def test_the_catalogue_has_a_token_family_that_only_token_profiles_fit() -> None:
    assert [d.blueprint_id for d in CATALOG.list(host_kind="tok")] == TOK
    for blueprint_id in TOK:
        assert CATALOG.get(blueprint_id).supports(TOKENS) and CATALOG.get(blueprint_id).supports(CAUSAL)
        # The same (8, 12) numbers channels first are a (C, L) sequence: the seq_* seeds' shape.
        assert not CATALOG.get(blueprint_id).supports(ShapeProfile(feature_shape=(12, 8)))
    assert not CATALOG.get("seq_conv_residual").supports(TOKENS)


@pytest.mark.parametrize("blueprint_id", TOK)
def test_a_fresh_token_seed_is_neutral(blueprint_id: str) -> None:
    seed = CATALOG.build(blueprint_id, TOKENS)
    assert torch.count_nonzero(seed(torch.randn(3, 12, 8))) == 0


def test_a_causal_model_gets_a_causal_attention_head() -> None:
    causal = randomize_(CATALOG.build("tok_attention", CAUSAL), torch.Generator().manual_seed(1))
    plain = randomize_(CATALOG.build("tok_attention", TOKENS), torch.Generator().manual_seed(1))
    assert not _reads_later_positions(causal, 12)
    # The check can fail: the bidirectional head, with the same weights, reads later tokens.
    assert _reads_later_positions(plain, 12)
    for blueprint_id in ("tok_mlp", "tok_adapter", "tok_glu"):
        per_token = randomize_(CATALOG.build(blueprint_id, CAUSAL), torch.Generator().manual_seed(1))
        assert not _reads_later_positions(per_token, 12)


@pytest.mark.slow
def test_a_compiled_causal_kernel_takes_any_length_up_to_its_bound_and_never_looks_ahead() -> None:
    kernel = compile_blueprint(CATALOG, "tok_attention", CAUSAL, config=FAST)
    artifact = kernel.artifact
    assert artifact.kind is ArtifactKind.EXPORTED and artifact.status is ArtifactStatus.ACTIVE
    assert artifact.shape_profile == "f12x8-b16-causal"
    assert artifact.guard.length_min == 1 and artifact.guard.describe() == "(batch 1..16, length 1..12, 8) float32"
    module = randomize_(decode_exported(kernel.blob).module(), torch.Generator().manual_seed(2))
    for length in (1, 5, 12):
        assert module(torch.randn(3, length, 8)).shape == (3, length, 8)
    assert not _reads_later_positions(module, 12) and not _reads_later_positions(module, 5)
    with pytest.raises((AssertionError, RuntimeError, ValueError)):
        module(torch.randn(3, 13, 8))  # past the bound
    with pytest.raises((AssertionError, RuntimeError, ValueError)):
        module(torch.randn(17, 12, 8))  # past batch_max
    # Kasmina's own check, before it calls a kernel: a shorter sequence fits, a longer one does not.
    check_guard(artifact.guard, feature_shape=(7, 8), dtype="float32", batch_size=4)
    with pytest.raises(GuardMismatchError, match="length 1..12"):
        check_guard(artifact.guard, feature_shape=(13, 8), dtype="float32")
    with pytest.raises(GuardMismatchError):
        check_guard(artifact.guard, feature_shape=(12, 9), dtype="float32")
