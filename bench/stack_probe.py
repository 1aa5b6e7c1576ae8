"""What stacking costs at once: the 2-block chars-gpt-growth network, and the same network with
its last block or its whole stack copied on top, scored on validation after each epoch.

    OMP_NUM_THREADS=1 nice -n 10 python -m bench.stack_probe --epochs 4 --seed 1000 \\
        --out baselines/growth/chars-gpt-growth-depth/stack_probe.json

Plain PyTorch (the recipe's data, model, batch size and rate; no Esper run), one selection seed:
it tells how far a copied block is from the identity where it is inserted, the measurement behind
depth seeds not training in isolation (``esper_core.kasmina.depth.kind``). The copies are not
trained; the 2-block network trains on alone.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from esper_core.models.chars_gpt import next_char_loss
from esper_core.run.recipes import CHARS_GROWTH_LR, chars_gpt_model, chars_growth_splits

BATCH = 32


@torch.no_grad()
def val_bits(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Validation loss in bits per character."""
    nats = sum(
        float(next_char_loss(model(x[i : i + 256]), y[i : i + 256])) * len(x[i : i + 256])
        for i in range(0, len(x), 256)
    )
    return nats / len(x) / math.log(2)


def run(epochs: int, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    data = chars_growth_splits()
    (x, y), (xv, yv) = data.train.tensors, data.val.tensors
    model = chars_gpt_model(1.0, width=64, depth=2)
    opt = torch.optim.Adam(model.parameters(), lr=CHARS_GROWTH_LR)
    order = torch.Generator().manual_seed(seed)
    rows = []
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=order)
        for i in range(0, len(x), BATCH):
            idx = perm[i : i + BATCH]
            opt.zero_grad(set_to_none=True)
            next_char_loss(model(x[idx]), y[idx]).backward()
            opt.step()
        last, whole = copy.deepcopy(model), copy.deepcopy(model)
        last.blocks.append(copy.deepcopy(model.blocks[-1]))
        whole.blocks.extend(copy.deepcopy(b) for b in model.blocks)
        row = {"epoch": epoch, "two_blocks": val_bits(model, xv, yv)}
        row["last_block_copied"] = val_bits(last, xv, yv)
        row["whole_stack_copied"] = val_bits(whole, xv, yv)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {
        "bench": "stack-probe",
        "recipe": "chars-gpt-growth-start",
        "seed": seed,
        "lr": CHARS_GROWTH_LR,
        "epochs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1000, help="a selection seed (1000 and up)")
    parser.add_argument("--out", type=Path, default=None, help="write the result here as JSON")
    args = parser.parse_args()
    if args.seed < 1000:
        parser.error(f"--seed {args.seed}: this measurement informs a design choice; use a selection seed (>= 1000)")
    result = run(args.epochs, args.seed)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
