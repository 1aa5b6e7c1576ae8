"""zoo: what one episode on a zoo member costs, per family, on one CPU thread.

Draws ``--per-family`` members of each family (from ``ZooSpec(seed=..., families=(family,))``,
the default zoo's other choices unchanged) and runs one episode on each: an ordinary Esper run
(``esper_core.studies.episodes.run_episode``: training, the heuristic deciding after every
epoch, checkpoints committed, decisions recorded in a fresh SQLite registry) on one torch
thread. Each member's data is built first (MNIST-1D and chars are generated into the cache) and
timed apart, since a Simic training draws it once per member, not once per episode.

    python -m bench.zoo [--seed 0] [--per-family 2] [--json baselines/zoo/episodes-cpu-1thread.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._output import save_json
from esper_core._capabilities import one_thread
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.zoo import FAMILIES, ZooMember, ZooSpec, draw_members


def episode(member: ZooMember, settings: EsperSettings, *, seed: int) -> dict[str, Any]:
    """One heuristic episode on ``member``: its data's build time, then the run's, and its result."""
    config = episode_config(member.recipe(), seed=seed, policy="heuristic")
    start = time.perf_counter()
    config.data.load()  # fills the data set cache; the run reads it from there
    data_s = time.perf_counter() - start
    result = run_episode(config, settings=settings)
    return {
        "member": member.name,
        "family": member.family,
        "task": member.task.label,
        "depth": member.depth,
        "width": member.width,
        "epochs": member.epochs,
        "batch_size": member.batch_size,
        "train_samples": member.task.train if member.task.name != "digits" else None,
        "widen": list(member.widen),
        "host_params": result.host_params,
        "total_params": result.total_params,
        # A language model's score is its loss (nats per character); it has no accuracy.
        "test_accuracy": None if member.task.name == "chars" else round(result.test_accuracy, 4),
        "test_loss": round(result.test_loss, 4),
        "commands": result.commands,
        # Why the run halted (scored at its last commit), None when it trained every epoch.
        "halted": result.halted,
        "data_s": round(data_s, 3),
        "episode_s": round(result.wall_s, 3),
        "episode_s_per_epoch": round(result.wall_s / member.epochs, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the zoo's seed (and every episode's run seed)")
    parser.add_argument("--per-family", type=int, default=2, help="members drawn per family")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="esper-zoo-bench-") as home, one_thread():
        # The data caches read ESPER_HOME from the environment: point it here too, so that each
        # member's data is built (and timed) afresh rather than read from an earlier run's cache.
        os.environ["ESPER_HOME"] = home
        settings = EsperSettings(home=Path(home))
        for family in FAMILIES:
            for member in draw_members(ZooSpec(seed=args.seed, families=(family,)), args.per_family):
                row = episode(member, settings, seed=args.seed)
                print(
                    f"{row['member']:<44} {row['episode_s']:6.2f} s ({row['epochs']} epochs)  "
                    f"data {row['data_s']:5.2f} s  test loss {row['test_loss']:.3f}  {row['commands']}",
                    flush=True,
                )
                rows.append(row)
    per_family = {
        family: {
            "episodes": len(times),
            "median_episode_s": round(statistics.median(times), 3),
            "max_episode_s": round(max(times), 3),
        }
        for family in FAMILIES
        if (times := [r["episode_s"] for r in rows if r["family"] == family])
    }
    result = {
        "bench": "zoo",
        "command": f"python -m bench.zoo --seed {args.seed} --per-family {args.per_family}",
        "torch_threads": 1,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        # Other processes share the machine's cores: the 1-minute load average says how busy it was.
        "load_1m": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)},
        "zoo_seed": args.seed,
        "per_family": per_family,
        "episodes": rows,
    }
    for family, summary in per_family.items():
        print(f"{family:<8} median {summary['median_episode_s']:6.2f} s  max {summary['max_episode_s']:6.2f} s")
    text = save_json(result, args.json)
    print(text if args.json is None else f"written to {args.json}")


if __name__ == "__main__":
    main()
