"""Does doubling a transformer's width part-way pay? chars-gpt-growth's 4-block network started at
half its width (32, 2 heads) and doubled in place after epoch k (``widen_stream``: 64 wide, 4
heads, the MLPs 256 wide: exactly the final network's shape), against the final network and the
half-width one trained static, on training FLOPs and validation bits per character.

    OMP_NUM_THREADS=1 python -m bench.widen_probe --arms widen-2 widen-4 --seeds 1000 --workers 2 \\
        --out baselines/growth/chars-gpt-growth-width/selection.json
    OMP_NUM_THREADS=1 python -m bench.widen_probe --arms static-final static-start widen-4 --seeds 0 1 2 \\
        --workers 2 --out baselines/growth/chars-gpt-growth-width/evaluation.json

Plain PyTorch with the recipe's data, batch, rate and schedule (Adam 3e-3, constant, then the
last 2 epochs cooling linearly to a tenth), not an Esper run: it measures the operator before the
seed manager carries it. Training FLOPs are counted by ``torch.utils.flop_counter`` on one step
at each width, times the steps taken at it. Seeds from 1000 are selection seeds (to choose the
growth point); the evaluation seeds below 1000 score what was chosen.
"""

from __future__ import annotations

import argparse
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from esper_core.kasmina.stream import widen_stream
from esper_core.models.chars_gpt import CharGPT, next_char_loss
from esper_core.run.recipes import CHARS_GROWTH_LR, VOCAB_SIZE, chars_gpt_growth, chars_growth_splits
from esper_core.studies.depth_growth import flops_to_reach
from esper_core.telemetry.paired import paired_difference

BATCH, WIDTH, DEPTH, HEADS = 32, 64, 4, 4


def arm_shape(arm: str) -> tuple[int, int, int | None]:
    """``(start width, start heads, epoch after which it doubles or None)``."""
    if arm == "static-final":
        return WIDTH, HEADS, None
    if arm == "static-start":
        return WIDTH // 2, HEADS // 2, None
    if arm.startswith("widen-") and arm[6:].isdigit():
        return WIDTH // 2, HEADS // 2, int(arm[6:])
    raise ValueError(f"unknown arm {arm!r}: static-final, static-start or widen-<epoch>")


def step_flops(model: CharGPT, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one training step (forward and backward) on a batch of ``x``'s shape."""
    with FlopCounterMode(display=False) as counter:
        next_char_loss(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


@torch.no_grad()
def val_nats(model: CharGPT, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean validation loss in nats per character."""
    model.eval()
    total = sum(
        float(next_char_loss(model(x[i : i + 256]), y[i : i + 256])) * len(x[i : i + 256])
        for i in range(0, len(x), 256)
    )
    model.train()
    return total / len(x)


def run_arm(arm: str, seed: int, epochs: int) -> dict[str, Any]:
    """One arm on one seed: validation loss and cumulative training FLOPs after every epoch."""
    torch.set_num_threads(1)
    width, heads, grow_after = arm_shape(arm)
    data = chars_growth_splits()
    (x, y), (xv, yv) = data.train.tensors, data.val.tensors
    trainer = chars_gpt_growth().trainer
    torch.manual_seed(seed)
    model = CharGPT(vocab=VOCAB_SIZE, context=x.shape[1], width=width, depth=DEPTH, heads=heads)
    opt = torch.optim.Adam(model.parameters(), lr=CHARS_GROWTH_LR)
    order = torch.Generator().manual_seed(seed)
    per_step = step_flops(model, x[:BATCH], y[:BATCH])
    flops, curve = 0, []
    for epoch in range(epochs):
        for group in opt.param_groups:
            group["lr"] = CHARS_GROWTH_LR * trainer.lr_factor(epoch, epochs)
        perm = torch.randperm(len(x), generator=order)
        for i in range(0, len(x), BATCH):
            idx = perm[i : i + BATCH]
            opt.zero_grad(set_to_none=True)
            next_char_loss(model(x[idx]), y[idx]).backward()
            opt.step()
            flops += per_step * len(idx) // BATCH
        if grow_after is not None and epoch + 1 == grow_after:
            report = widen_stream(model, xv[:64], optimizer=opt, generator=torch.Generator().manual_seed(seed))
            per_step = step_flops(model, x[:BATCH], y[:BATCH])
        curve.append((flops, val_nats(model, xv, yv)))
        print(json.dumps({"arm": arm, "seed": seed, "epoch": epoch, "bits": curve[-1][1] / math.log(2)}), flush=True)
    out = {"arm": arm, "seed": seed, "curve": curve, "params": sum(p.numel() for p in model.parameters())}
    if grow_after is not None:
        out["max_change"] = report.max_change
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: final bits and FLOPs per seed; against static-final where it ran: FLOPs to its
    final validation loss and the paired difference in final bits."""
    arms: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        arms.setdefault(r["arm"], {})[r["seed"]] = r
    out: dict[str, Any] = {}
    final = arms.get("static-final", {})
    for arm, by_seed in arms.items():
        seeds = sorted(by_seed)
        row: dict[str, Any] = {
            "seeds": seeds,
            "final_bits": [by_seed[s]["curve"][-1][1] / math.log(2) for s in seeds],
            "flops": [by_seed[s]["curve"][-1][0] for s in seeds],
            "params": by_seed[seeds[0]]["params"],
        }
        paired = [s for s in seeds if s in final]
        if arm != "static-final" and paired:
            target = [final[s]["curve"][-1][1] / math.log(2) for s in paired]
            mine = [by_seed[s]["curve"][-1][1] / math.log(2) for s in paired]
            diffs = [a - b for a, b in zip(mine, target, strict=True)]
            row["minus_static_final_bits"] = {"per_seed": diffs, "mean": float(np.mean(diffs))}
            if len(paired) >= 2:
                row["minus_static_final_bits"] |= paired_difference(mine, target, higher_is_better=False).as_dict()
            reach = [flops_to_reach(by_seed[s]["curve"], t) for s, t in zip(paired, target, strict=True)]
            row["flops_saving_to_static_final"] = [
                None if f is None else 1.0 - f / final[s]["curve"][-1][0] for f, s in zip(reach, paired, strict=True)
            ]
        out[arm] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["static-final", "static-start", "widen-4"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the result here as JSON")
    args = parser.parse_args()
    for arm in args.arms:
        _, _, grow_after = arm_shape(arm)
        if grow_after is not None and not 1 <= grow_after < args.epochs:
            parser.error(f"{arm}: the growth point must lie in [1, {args.epochs - 1}] for {args.epochs} epochs")
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(run_arm, *zip(*jobs, strict=True), [args.epochs] * len(jobs)))
    result = {
        "bench": "widen-probe",
        "recipe": "chars-gpt-growth",
        "epochs": args.epochs,
        "lr": CHARS_GROWTH_LR,
        "torch": torch.__version__,
        "runs": runs,
        "summary": summarise(runs),
    }
    print(json.dumps(result["summary"], indent=2, default=float))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
