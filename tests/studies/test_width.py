"""The width study's arms on a tiny model (its accuracies belong to the bench run, not to tests)."""

from __future__ import annotations

import pytest
from torch import nn

from esper_core.run import DataSpec, ModelSpec, RunConfig, TrainerConfig
from esper_core.studies.width import run_arm
from tests.helpers.user_model import blobs


class Tower(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem, self.act, self.mid = nn.Linear(12, width), nn.ReLU(), nn.Linear(width, width)
        self.act2, self.head = nn.Tanh(), nn.Linear(width, 3)

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.head(self.act2(self.mid(self.act(self.stem(x)))))


def _recipe() -> RunConfig:
    return RunConfig(
        epochs=3,
        host=ModelSpec(build=Tower, build_scaled=lambda f: Tower(round(8 * f)), slots=("act",)),
        data=DataSpec(load=blobs, batch_size=32, name="blobs"),
        trainer=TrainerConfig(optimizer="adam", lr=1e-2),
    )


@pytest.mark.slow
@pytest.mark.parametrize("init", ["random", "gradmax", "tiny"])
def test_a_grown_arm_ends_at_the_static_architecture_with_less_compute(init: str) -> None:
    kw = {"factor": 1.5, "grow_at": 1, "epochs": 3, "layers": ["stem", "mid"]}
    grown = run_arm(_recipe(), f"grown-{init}", 0, **kw)
    static = run_arm(_recipe(), "static-x1.5", 0, **kw)
    assert grown["params"] == static["params"] == sum(p.numel() for p in Tower(12).parameters())
    assert grown["train_flops"] < static["train_flops"]
    assert 0.0 <= grown["test_acc"] <= 100.0
