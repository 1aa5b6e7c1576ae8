"""Work for the ranks of a real gloo process group in tests (spawned processes import it by name)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from esper_core.tolaria import collective
from esper_core.tolaria.collective import ProcessGroup, RanksDiverged


def exchange(rank: int, store: str, out: str) -> None:
    """Every ``ProcessGroup`` operation on two ranks; each rank writes what it saw to ``out``."""
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        group = ProcessGroup()
        seen: dict[str, object] = {"rank": group.rank, "world": group.world, "leader": group.leader}
        # Gradients: rank r holds r + 1 everywhere, with share 1/4 (rank 0) or 3/4 (rank 1); one
        # parameter has no gradient. Tiny buckets: each parameter travels in a bucket of its own.
        collective.BUCKET_BYTES = 16
        a, b, c = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(1))
        a.grad = torch.full((3,), rank + 1.0)
        b.grad = torch.full((2, 2), 10.0 * (rank + 1))
        group.sum_gradients([a, b, c], weight=(0.25, 0.75)[rank])
        seen["grads"] = [a.grad.tolist(), b.grad.flatten().tolist(), c.grad]
        rows = torch.full((2, 3), rank + 1.0)
        group.sum_rows(rows, weight=0.5)
        seen["rows"] = rows.flatten().tolist()
        seen["sum"] = group.sum_(torch.tensor(rank + 1.0)).item()
        seen["broadcast"] = group.broadcast({"from": rank})
        seen["gather"] = group.gather(rank * 10)
        # Each rank draws its own numbers inside rank_rng, and the shared stream after it.
        torch.manual_seed(7)
        with group.rank_rng(salt=3):
            seen["inside"] = torch.rand(2).tolist()
        seen["after"] = torch.rand(2).tolist()
        norm = nn.BatchNorm1d(2)
        norm.running_mean.fill_(float(rank))
        group.average_buffers(norm)
        seen["running_mean"] = norm.running_mean.tolist()
        model = nn.Linear(2, 2)
        nn.init.constant_(model.weight, 1.0)
        group.check_identical(model, where="same")
        if rank == 1:
            with torch.no_grad():
                model.bias.add_(1e-7)
        try:
            group.check_identical(model, where="after a bad step")
            seen["diverged"] = None
        except RanksDiverged as e:
            seen["diverged"] = str(e)
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()
