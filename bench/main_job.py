"""main_job: does the main job's grown network beat the static frontier on the frontier's own seeds?

``make run`` grows ``mnist1d-cnn-grown`` (the learned width policy's schedule, replayed) and sets
the one network it grows beside the committed static frontier. This bench says how far that one
run can be trusted: it runs the recipe on the seeds the frontier was trained on (same
initialisation and data order per seed, the episodes' eager step), and pairs each grown network
with the same seed's static frontier at its own parameter count (interpolated in log parameters
between the seed's frontier runs, as the growth benchmark does), then bootstraps the mean
difference.

    OMP_NUM_THREADS=1 python -m bench.main_job [--recipe mnist1d-cnn-grown] [--seeds 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench._output import save_json
from esper_core.run.frontier import FRONTIERS
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.telemetry.paired import paired_difference

REPO = Path(__file__).resolve().parents[1]


def run(recipe: str, *, seeds: int) -> dict[str, Any]:
    """The recipe on ``seeds`` frontier seeds, each paired with the same seed's static frontier."""
    frontier = FRONTIERS[recipe]
    baseline = json.loads((REPO / frontier.source).read_text())
    (result,) = baseline["results"].values()
    per_seed: dict[int, list[tuple[int, float]]] = {}
    for point in result["frontier"]:
        for r in point["runs"]:
            per_seed.setdefault(r["seed"], []).append((r["params"], r["test_acc"]))
    config = get_recipe(recipe)
    grown, static, params = [], [], []
    with tempfile.TemporaryDirectory(prefix="esper-main-job-") as home:
        settings = EsperSettings(home=home)
        for seed in range(seeds):
            run_config = episode_config(recipe, seed=seed, policy=config.tamiyo.policy, schedule=config.tamiyo.schedule)
            episode = run_episode(run_config, settings=settings, run_id=f"main-{seed}")
            sizes = sorted(per_seed[seed])
            at = float(
                np.interp(math.log(episode.total_params), [math.log(p) for p, _ in sizes], [a for _, a in sizes])
            )
            grown.append(100.0 * episode.test_accuracy)
            static.append(at)
            params.append(episode.total_params)
    diff = paired_difference(grown, static)
    return {
        "recipe": recipe,
        "frontier": frontier.source,
        "seeds": seeds,
        "grown_test_accuracy_mean": round(statistics.fmean(grown), 2),
        "grown_params_mean": statistics.fmean(params),
        "static_same_params_mean": round(statistics.fmean(static), 2),
        "grown_minus_static": {
            "mean": round(diff.mean, 2),
            "ci95_low": round(diff.ci95_low, 2),
            "ci95_high": round(diff.ci95_high, 2),
        },
        "runs": [
            {"seed": s, "test_acc": round(g, 2), "params": p, "static_same_params": round(t, 2)}
            for s, (g, p, t) in enumerate(zip(grown, params, static, strict=True))
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="mnist1d-cnn-grown", choices=sorted(FRONTIERS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = run(args.recipe, seeds=args.seeds)
    print(save_json(result, args.json))


if __name__ == "__main__":
    main()
