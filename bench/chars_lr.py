"""chars-gpt-growth: the static network's learning rate, chosen on validation with selection seeds.

    OMP_NUM_THREADS=1 nice -n 10 python -m bench.chars_lr --lrs 1.5e-3 3e-3 6e-3 --seeds 1000 \\
        --out baselines/growth/chars-gpt-growth

Each run is a whole episode (``run_episode``) of the recipe with no growth (policy ``none``): the
static 4-block network at its final size, on the recipe's schedule (constant rate, then a
cooldown), one rate each. Seeds 1000 and up are selection seeds, never used by a benchmark's
evaluation arms (seeds 0, 1, 2, ...), so choosing the rate on them does not favour the static arm
on the seeds that are scored. Only validation is read; the test split stays unseen.

A run that already finished in ``--home`` (all its epochs in its telemetry) is read back rather
than trained again, so a grid can be widened (a rate added at its edge) without retraining the
rates it already has: the runs are deterministic in (rate, seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.studies.growth import compile_kernels, fresh_run_id, in_home

RECIPE = "chars-gpt-growth"


def run(lrs: list[float], seeds: list[int], home: Path | None) -> dict[str, Any]:
    """Train the static network at every rate on every selection seed; returns each run's
    validation bits per character and the rate with the lowest mean."""
    recipe = get_recipe(RECIPE)
    runs: list[dict[str, Any]] = []
    with in_home(home, prefix="esper-chars-lr-") as root:
        settings = EsperSettings(home=root)
        compile_kernels(settings, (RECIPE,), "cpu")
        for seed in seeds:
            for lr in lrs:
                run_id = f"lr{lr:g}-s{seed}"
                done = _finished(settings.runs_dir / run_id, recipe.epochs)
                if done is None:
                    config = episode_config(RECIPE, seed=seed, policy="none")
                    config.trainer = dataclasses.replace(config.trainer, lr=lr)
                    result = run_episode(config, settings=settings, run_id=fresh_run_id(settings, run_id))
                    done = {"val_loss": result.val_loss, "train_s": result.wall_s, "reused": False}
                bits = done["val_loss"] / math.log(2)
                runs.append(
                    {"lr": lr, "seed": seed, "val_bits": bits, "seconds": done["train_s"], "reused": done["reused"]}
                )
                print(f"lr {lr:g} seed {seed}: val {bits:.4f} bits/char, {done['train_s']:.0f} s", flush=True)
    mean = {lr: sum(r["val_bits"] for r in runs if r["lr"] == lr) / len(seeds) for lr in lrs}
    params = sum(p.numel() for p in recipe.host.build().parameters())
    tokens = recipe.epochs * len(recipe.data.load().train) * recipe.host.build().position.num_embeddings
    return {
        "bench": "chars-lr",
        "recipe": RECIPE,
        "metric": "validation bits per character after the last epoch (lower is better)",
        "seconds": "each run's wall time (a run read back from --home: its epochs' time), on 2 shared CPU cores",
        "selection_seeds": seeds,
        "epochs": recipe.epochs,
        "schedule": {
            "name": recipe.trainer.lr_schedule,
            "cooldown_epochs": recipe.trainer.lr_cooldown_epochs,
            "final_factor": recipe.trainer.lr_final_factor,
        },
        "parameters": params,
        "training_tokens": tokens,
        "tokens_per_parameter": tokens / params,
        "seconds_total": sum(r["seconds"] for r in runs),
        "val_bits_mean": {f"{lr:g}": b for lr, b in mean.items()},
        "chosen_lr": min(mean, key=mean.__getitem__),
        "runs": runs,
    }


def _finished(run_dir: Path, epochs: int) -> dict[str, Any] | None:
    """A finished run's last validation loss and its epochs' time, read from its telemetry;
    None when the run is absent or stopped early."""
    path = run_dir / "telemetry.jsonl"
    if not path.exists():
        return None
    epochs_seen = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    metrics = [{m["name"]: m["value"] for m in p["metrics"]} for p in epochs_seen if p["source"] == "tolaria"]
    metrics = [m for m in metrics if "tolaria.validation.loss" in m]
    if len(metrics) != epochs:
        return None
    seconds = sum(m["tolaria.epoch.latency_ms"] for m in metrics) / 1e3
    return {"val_loss": metrics[-1]["tolaria.validation.loss"], "train_s": seconds, "reused": True}


def main() -> None:
    """Command line: run, print and optionally save ``lr.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1.5e-3, 3e-3, 6e-3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000])
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write lr.json here")
    args = parser.parse_args()
    if min(args.seeds) < 1000:
        parser.error("selection seeds are 1000 and up: seeds below are the benchmark's evaluation seeds")
    result = run(args.lrs, args.seeds, args.home)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lr.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
