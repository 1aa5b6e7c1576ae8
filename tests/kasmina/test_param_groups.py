"""Per-seed optimizer groups: adding, removing, and the optimizer state that goes with them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.kasmina.param_groups import SeedParamGroups


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_culling_one_of_two_live_seeds_keeps_the_other(optimizer: type[torch.optim.Optimizer]) -> None:
    # Two seeds of one blueprint: groups with the same keys and same-shaped tensors. Removing the
    # second once compared groups with ==, which compares tensors element-wise and raised.
    host, first, second = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
    opt = optimizer(host.parameters(), lr=0.1)
    groups = SeedParamGroups()
    groups.bind(opt, base_lr=0.1)
    groups.add("a", list(first.parameters()), lr_scale=1.0)
    groups.add("b", list(second.parameters()), lr_scale=1.0)
    loss = sum(m(torch.ones(2, 4)).sum() for m in (host, first, second))
    loss.backward()
    opt.step()
    groups.remove("b")
    assert groups.order() == ["a"] and groups.param_count("b") == 0
    assert all(p not in opt.state for p in second.parameters())
    if optimizer is torch.optim.Adam:
        assert all(p in opt.state for p in first.parameters())
    groups.remove("a")
    assert groups.order() == [] and len(opt.param_groups) == 1
