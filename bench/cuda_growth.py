"""cuda_growth: growth events under CUDA graphs, one call on a GPU machine (issue 38).

A captured CUDA graph bakes the model's structure in, so a seed that germinates, blends or merges
must cost one re-capture, and an epoch without such a change none. This trains two growing runs
on CUDA, each twice with the same seed and schedule, eager and with the step replayed as a CUDA
graph, and reports per epoch: the seeds' stages, the graph captures the epoch made
(``tolaria.graph.captures_total``), whether its structure changed, its training time and its
validation loss. The cases:

- ``width``: ``mnist1d-cnn-grown`` (two width seeds, after epochs 1 and 3, initialised by TINY's
  least squares: the germination that failed on CUDA on the 2026-11-27 lease);
- ``depth``: ``chars-gpt-growth-start`` with its whole stack copied after epoch 1 (the depth
  benchmark's ``stack-all-1`` arm).

The check, per graphed run: captures = 1 + the epochs whose structure changed (never one per
epoch). The graphed run's validation losses beside the eager run's show that replays train what
eager steps train. ``--device cpu --quick`` runs the same code without graphs on a cut of the data
(what CI can check); on CUDA the full recipes run.

    python -m bench.cuda_growth --out DIR [--cases width depth] [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._output import save_json
from esper_core.run import RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.settings import EsperSettings
from esper_core.studies.depth_growth import DepthGrowthConfig, arm_config
from esper_core.studies.growth import fresh_run_id

CASES = ("width", "depth")
SEED = 0


def case_config(case: str, *, device: str, quick: bool, graphs: bool) -> RunConfig:
    """The run of ``case``: on ``device``, its step replayed as a CUDA graph when ``graphs``."""
    if case == "width":
        config = get_recipe("mnist1d-cnn-grown", epochs=5 if quick else 8, seed=SEED)
    elif case == "depth":
        depth = DepthGrowthConfig(plan="smoke" if quick else "default", epochs=6)
        config = arm_config(depth, arm="stack-all-1", seed=SEED)
    else:
        raise ValueError(f"unknown case {case!r}; choose from {CASES}")
    step = dataclasses.replace(config.trainer.step, compile="off", enable_graphs=graphs)
    trainer = dataclasses.replace(config.trainer, device=device, step=step)
    return dataclasses.replace(config, trainer=trainer)


def train(config: RunConfig, *, home: Path) -> list[dict[str, Any]]:
    """Every epoch of ``config``'s run with Tamiyo deciding after each: one row per epoch."""
    settings = EsperSettings(home=home)
    run_id = fresh_run_id(settings, f"{config.recipe}-graphs{int(config.trainer.step.enable_graphs)}")
    (settings.runs_dir / run_id).mkdir(parents=True)
    session = Run.start(config, settings=settings, run_id=run_id)
    rows: list[dict[str, Any]] = []
    previous = None
    try:
        for epoch in range(config.epochs):
            session.manager.start_epoch()  # promotes last decision's germination, as the trainer would
            structure = session.manager.structure_signature()
            start = time.perf_counter()
            packet = session.train_epoch()
            wall_ms = (time.perf_counter() - start) * 1e3
            packet_out = session.record.outbox[-1]
            metrics = {m.name: m.value for m in packet_out.metrics}
            rows.append(
                {
                    "epoch": epoch,
                    "stages": {sid: stage for sid, stage, _seed, _arch in structure if stage != "dormant"},
                    "structure_changed": previous is not None and structure != previous,
                    "captures": int(metrics.get("tolaria.graph.captures_total", 0)),
                    "replays": int(metrics.get("tolaria.graph.replays_total", 0)),
                    "train_ms": session.timings["train_ms"][-1],
                    "wall_ms": wall_ms,
                    "val_loss": packet.val_loss,
                    # Why a seed moved or was culled, and any graph fallback: what a lease must see.
                    "events": [
                        f"{e.name}: {e.message}"[:300]
                        for e in packet_out.events
                        if e.name.startswith(("kasmina.gate", "kasmina.seed", "tolaria.graph"))
                    ],
                }
            )
            previous = structure
            session.commit(f"epoch-{epoch}-trained")
            session.apply(session.decide())
            session.commit(f"epoch-{epoch}-applied")
    finally:
        session.tamiyo.close()
        session.close()
    return rows


def measure(case: str, *, device: str, quick: bool, home: Path) -> dict[str, Any]:
    """``case`` eager and graphed, with the capture check (CUDA only: elsewhere nothing captures)."""
    eager = train(case_config(case, device=device, quick=quick, graphs=False), home=home)
    graphed = train(case_config(case, device=device, quick=quick, graphs=True), home=home)
    changes = sum(r["structure_changed"] for r in graphed)
    captures = sum(r["captures"] for r in graphed)
    expected = 1 + changes if device.startswith("cuda") else 0
    per_epoch = [b["val_loss"] - a["val_loss"] for a, b in zip(eager, graphed, strict=True)]
    return {
        "case": case,
        "structure_changes": changes,
        "captures": captures,
        "captures_expected": expected,
        "ok": captures == expected,
        "max_val_loss_diff": max(abs(d) for d in per_epoch),
        "train_ms_eager": sum(r["train_ms"] for r in eager),
        "train_ms_graphed": sum(r["train_ms"] for r in graphed),
        "eager": eager,
        "graphed": graphed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for cuda_growth.json")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to check the plumbing")
    parser.add_argument("--quick", action="store_true", help="fewer epochs on a cut of the data (CI)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(
            f"torch {torch.__version__} sees no CUDA device: run this on a GPU machine (or --device cpu --quick)"
        )
    results = []
    with tempfile.TemporaryDirectory(prefix="esper-cuda-growth-") as home:
        for case in args.cases:
            result = measure(case, device=args.device, quick=args.quick, home=Path(home))
            results.append(result)
            print(
                f"{case:<6} captures {result['captures']} (expected {result['captures_expected']}: 1 + "
                f"{result['structure_changes']} structure changes) {'ok' if result['ok'] else 'MISMATCH'}; "
                f"train {result['train_ms_eager']:.0f} ms eager, {result['train_ms_graphed']:.0f} ms graphed; "
                f"max |val loss graphed - eager| {result['max_val_loss_diff']:.2e}",
                flush=True,
            )
            for row in result["graphed"]:
                print(
                    f"    epoch {row['epoch']}: captures {row['captures']} replays {row['replays']} "
                    f"changed {row['structure_changed']} {row['stages']} train {row['train_ms']:.0f} ms",
                    flush=True,
                )
                for event in row["events"]:
                    print(f"        {event}", flush=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    save_json(
        {"bench": "cuda_growth", "device": device, "quick": args.quick, "cases": results}, args.out / "cuda_growth.json"
    )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
