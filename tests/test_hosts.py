"""Host networks: shapes, slot placement and the activation kind each slot exposes."""

from __future__ import annotations

import pytest
import torch

from esper_core.contracts import BlendSchedule
from esper_core.hosts import CNNHost, HostConfig, MLPHost, build_host_from_config
from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from tests.helpers.kernels import given, kernel_from_registry
from tests.helpers.recipes import eager_recipe


def test_mlp_host_places_slots_on_layer_inputs() -> None:
    host = build_host_from_config(HostConfig(hidden=(32, 16), slot_inputs=(0, 2)), feature_shape=(8,), num_classes=3)
    assert isinstance(host, MLPHost)
    assert {k: s.profile.name for k, s in host.slots().items()} == {"slot0": "f8-b512", "slot2": "f16-b512"}
    assert host(torch.randn(5, 8)).shape == (5, 3)


def test_cnn_host_exposes_map_and_vector_slots() -> None:
    host = build_host_from_config(
        HostConfig(kind="cnn", hidden=(4, 8), slot_inputs=(1, 2)), feature_shape=(1, 8, 8), num_classes=10
    )
    assert isinstance(host, CNNHost)
    slots = host.slots()
    assert slots["slot1"].profile.feature_shape == (4, 8, 8) and slots["slot1"].profile.kind == "cnn"
    assert slots["slot2"].profile.feature_shape == (32,) and slots["slot2"].profile.kind == "mlp"
    assert host(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_host_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="slot_inputs \\[5\\] out of range"):
        HostConfig(hidden=(4,), slot_inputs=(5,))
    with pytest.raises(ValueError, match="load the data with image=True"):
        build_host_from_config(HostConfig(kind="cnn", hidden=(4,), slot_inputs=()), feature_shape=(64,), num_classes=10)
    with pytest.raises(ValueError, match="host kind must be one of"):
        HostConfig(kind="transformer")


def test_vector_blueprint_fits_the_cnn_classifier_slot_but_not_a_feature_map(compiled_home: EsperSettings) -> None:
    trainer = build_trainer(eager_recipe("digits-cnn"), catalog=default_catalog(), run_id="t")
    kernel = kernel_from_registry(compiled_home, "residual_mlp", "f128-b512")
    args = dict(params={}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=1, lr_scale=1.0)
    refused = trainer.manager.germinate("slot1", kernel.artifact.blueprint_id, kernels=given(kernel), **args)
    assert not refused.passed and "(batch *, 16, 8, 8)" in refused.reason
    assert trainer.manager.germinate("slot2", kernel.artifact.blueprint_id, kernels=given(kernel), **args).passed
    trainer.train_epoch()


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_a_host_skips_an_idle_slot_until_a_hook_or_a_seed_is_on_it(kind: str) -> None:
    shape = (8,) if kind == "mlp" else (1, 4, 4)
    host = build_host_from_config(
        HostConfig(kind=kind, hidden=(4,), slot_inputs=(1,)), feature_shape=shape, num_classes=3
    )
    slot = host.slots()["slot1"]
    calls: list[torch.Tensor] = []
    slot.forward = lambda x: calls.append(x) or x  # type: ignore[method-assign]
    x = torch.randn(2, *shape)
    expected = host(x)
    assert slot.idle and calls == []
    seen: list[torch.Tensor] = []
    handle = slot.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    assert not slot.idle
    assert torch.equal(host(x), expected) and len(calls) == len(seen) == 1  # a hook sees what passes
    handle.remove()
    assert slot.idle
    slot.seed = torch.nn.Identity()
    assert not slot.idle
    host(x)
    assert len(calls) == 2
