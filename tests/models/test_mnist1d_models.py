"""The MNIST-1D reference models: the paper's shapes, meaningful names, input checks, they learn."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from esper_core.models import MNIST1DCNN, MNIST1DMLP, MNIST1DLogistic


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_defaults_are_the_papers_models() -> None:
    # greydanus/mnist1d notebooks/models.py: ConvBase 5,210 and MLPBase 15,210 parameters.
    assert _params(MNIST1DCNN()) == 5210
    assert _params(MNIST1DMLP()) == 15210
    assert _params(MNIST1DLogistic()) == 410


def test_submodules_have_names_a_user_can_attach_slots_to() -> None:
    assert [n for n, _ in MNIST1DCNN().named_children()] == [
        "conv1",
        "act1",
        "conv2",
        "act2",
        "conv3",
        "act3",
        "flatten",
        "fc",
    ]
    assert [n for n, _ in MNIST1DMLP(depth=3).named_children()] == [
        "fc1",
        "act1",
        "fc2",
        "act2",
        "fc3",
        "act3",
        "out",
    ]
    assert [n for n, _ in MNIST1DLogistic().named_children()] == ["fc"]


def test_cnn_halves_the_length_three_times_and_takes_either_input_layout() -> None:
    model = MNIST1DCNN(channels=8)
    assert model.out_length == 5 and model.fc.in_features == 8 * 5
    x = torch.randn(4, 40)
    assert torch.equal(model(x), model(x.unsqueeze(1)))
    assert model(x).shape == (4, 10)
    seen: dict[str, torch.Size] = {}

    def record(name: str) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def hook(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
            seen[name] = output.shape

        return hook

    for name in ("conv1", "conv2", "conv3"):
        model.get_submodule(name).register_forward_hook(record(name))
    model(x)
    assert seen == {"conv1": (4, 8, 19), "conv2": (4, 8, 10), "conv3": (4, 8, 5)}


def test_width_sets_the_capacity() -> None:
    assert _params(MNIST1DCNN(channels=8)) < _params(MNIST1DCNN(channels=16)) < _params(MNIST1DCNN())
    assert _params(MNIST1DMLP(width=32)) < _params(MNIST1DMLP(width=64)) < _params(MNIST1DMLP())
    assert MNIST1DMLP(width=32, depth=1).fc1.out_features == 32


def test_a_layer_replaced_by_name_is_the_one_that_runs() -> None:
    model = MNIST1DMLP(width=16)
    model.fc2 = nn.Sequential(model.fc2, nn.Identity())  # how an outside wrapper would attach
    calls = []
    model.fc2.register_forward_hook(lambda *_: calls.append(1))
    model(torch.randn(2, 40))
    assert calls == [1]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: MNIST1DCNN(channels=0), "channels=0: must be >= 1"),
        (lambda: MNIST1DCNN(in_length=2), "in_length=2 is too short"),
        (lambda: MNIST1DMLP(width=0, depth=0), "width=0, depth=0: must be >= 1"),
        (lambda: MNIST1DLogistic(num_classes=0), "num_classes=0"),
    ],
)
def test_bad_sizes_are_refused(build: Callable[[], nn.Module], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_cnn_refuses_inputs_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"takes \(B, 40\) or \(B, 1, 40\) inputs, got \(2, 2, 40\)"):
        MNIST1DCNN()(torch.randn(2, 2, 40))
    with pytest.raises(ValueError, match=r"got \(2, 41\)"):
        MNIST1DCNN()(torch.randn(2, 41))


@pytest.mark.parametrize("make", [lambda: MNIST1DCNN(channels=8), lambda: MNIST1DMLP(width=32)], ids=["cnn", "mlp"])
def test_models_fit_a_small_labelled_set(make: Callable[[], nn.Module]) -> None:
    # Random signals with random labels: only a model that trains end to end memorises them.
    torch.manual_seed(0)
    x, y = torch.randn(32, 40), torch.randint(0, 10, (32,))
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert (model(x).argmax(1) == y).float().mean() > 0.9
