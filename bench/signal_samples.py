"""signal_samples: does measuring a growth signal on fewer samples change what a policy decides?

Tamiyo's GNN reads the epoch's train accuracy, measured on the first
``TrainerConfig.train_accuracy_samples`` training samples (512 by default). Fewer samples cost
less per epoch, and would be free to use if the stored policy then decided the same. This bench
runs a stored policy on the same held-out seeds once per sample count and compares, seed by
seed, the germinations it issued (epoch, slot, blueprint) with those under the first count, and
the test accuracy (paired differences, bootstrap 95 % intervals).

    OMP_NUM_THREADS=1 python -m bench.signal_samples --recipe mnist1d-cnn-width --home H \\
        --policy-version 4 --samples 512 256 128 [--seeds 10] [--workers 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._output import save_json
from esper_core.fanout import FanOut
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.adapt import SPLIT_SEED, germinations
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.studies.growth import fresh_run_id
from esper_core.telemetry.paired import paired_difference

FIRST_SEED = 0
"""The growth benchmark's held-out seeds (Simic trains on 1000 and up)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One run of the stored policy with one sample count, on one seed."""

    recipe: str
    home: str
    version: int
    gnn: Any
    samples: int
    seed: int


def run_job(job: Job) -> dict[str, Any]:
    """Run ``job``; returns its germinations and test accuracy."""
    settings = EsperSettings(home=Path(job.home))
    config = episode_config(
        job.recipe,
        seed=job.seed,
        policy="gnn",
        policy_version=job.version,
        lr_schedule="cosine",
        split_seed=SPLIT_SEED,
    )
    config.tamiyo = dataclasses.replace(config.tamiyo, gnn=job.gnn)
    config.trainer = dataclasses.replace(config.trainer, train_accuracy_samples=job.samples)
    run_id = fresh_run_id(settings, f"signals-{job.recipe}-n{job.samples}-s{job.seed}")
    result = run_episode(config, settings=settings, run_id=run_id)
    schedule = germinations(settings, run_id)
    return {
        "seed": job.seed,
        "samples": job.samples,
        "germinations": [[g.epoch, g.slot, g.blueprint] for g in schedule],
        "test_accuracy": 100.0 * result.test_accuracy,
        # A halted run stays in its pair, scored at its last commit (run_episode).
        "halted": result.halted,
    }


def run(recipe: str, *, home: Path, version: int, samples: list[int], seeds: int, workers: int) -> dict[str, Any]:
    """Every sample count on every seed; the first count is the reference."""
    if len(samples) < 2 or len(set(samples)) != len(samples) or min(samples) < 1:
        raise ValueError(f"give two or more distinct sample counts >= 1, the reference first; got {samples}")
    store = SimicStore.open(home)
    try:
        policy = store.get_policy(version)
    finally:
        store.close()
    policy.require_current_inputs()
    jobs = [
        Job(recipe=recipe, home=str(home), version=version, gnn=policy.gnn, samples=n, seed=FIRST_SEED + i)
        for n in samples
        for i in range(seeds)
    ]
    runs = FanOut(workers=workers).map(run_job, jobs)
    by_count = {n: [r for r in runs if r["samples"] == n] for n in samples}
    reference = by_count[samples[0]]
    compared = {}
    for n in samples[1:]:
        same = [a["germinations"] == b["germinations"] for a, b in zip(reference, by_count[n], strict=True)]
        compared[str(n)] = {
            "same_germinations": sum(same),
            "seeds": len(same),
            "differing_seeds": [r["seed"] for r, s in zip(reference, same, strict=True) if not s],
            "halted": sum(r["halted"] is not None for r in by_count[n]),
            "reference_halted": sum(r["halted"] is not None for r in reference),
            "test_accuracy_minus_reference": paired_difference(
                [r["test_accuracy"] for r in by_count[n]], [r["test_accuracy"] for r in reference]
            ).as_dict(),
        }
    return {
        "bench": "signal_samples",
        "recipe": recipe,
        "policy_version": version,
        "reference_samples": samples[0],
        "compared": compared,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--home", type=Path, required=True, help="ESPER_HOME holding the stored policy")
    parser.add_argument("--policy-version", type=int, required=True)
    parser.add_argument("--samples", type=int, nargs="+", default=[512, 256, 128], help="the reference first")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="Dask workers (0: one run after another here)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = run(
        args.recipe,
        home=args.home,
        version=args.policy_version,
        samples=args.samples,
        seeds=args.seeds,
        workers=args.workers,
    )
    if args.json:
        save_json(result, args.json)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
