"""The tuned version with its weight decay chosen on validation too, against the static network of
its own grown shape with the same choice: the grown runs at 1e-4 and 1e-3 (the 0 runs are
fresh_seeds.py's), the choice per seed on validation, then the static network of the chosen run's
shape at each weight decay, its choice on validation. Run as two processes of 8 seeds each.

python regularised.py grow HOME SEEDS OUT.json            (SEEDS: 100,101,...)
python regularised.py static HOME FRESH.json OWN_SHAPE.json GROWN.json... SEEDS OUT.json
"""

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

from esper_core.data import load_dataset
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.studies.growth import fresh_run_id
from esper_core.studies.yardstick import best_on_validation, static_shape

RECIPE, VERSION = "mnist1d-cnn-width", 5


def grow(settings: EsperSettings, seeds: list[int]) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        for wd in (1e-4, 1e-3):
            config = episode_config(RECIPE, seed=seed, policy="gnn", policy_version=VERSION)
            config.trainer = dataclasses.replace(config.trainer, weight_decay=wd)
            r = run_episode(config, settings=settings, run_id=fresh_run_id(settings, f"wd-v5-wd{wd:g}-s{seed}"))
            rows.append(
                {
                    "seed": seed,
                    "wd": wd,
                    "val": 100 * r.val_accuracy,
                    "test": 100 * r.test_accuracy,
                    "params": r.total_params,
                    "flops": r.train_flops,
                    "widths": r.widths,
                }
            )
            print(rows[-1], flush=True)
    return rows


def chosen(fresh: dict[str, Any], own: dict[str, Any], grown: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """The grown run of ``seed`` whose weight decay did best on validation (0 first on a tie)."""
    zero = next(a for a in fresh["arms"]["tuned-v5"] if a["seed"] == seed)
    widths = next(r["widths"] for r in own["rows"] if r["seed"] == seed)
    grid = {0.0: {**zero, "wd": 0.0, "widths": widths}} | {r["wd"]: r for r in grown if r["seed"] == seed}
    order = list(grid)
    return grid[max(order, key=lambda wd: (grid[wd]["val"], -order.index(wd)))]


def static(settings: EsperSettings, run: dict[str, Any]) -> dict[str, Any]:
    seed = run["seed"]
    base = episode_config(RECIPE, seed=seed, policy="none")
    host = base.host
    shape = load_dataset(base.data).feature_shape
    build = functools.partial(static_shape, host.build, run["widths"], shape, host.input_dtype)  # type: ignore[union-attr]
    static_host = dataclasses.replace(host, build=build)  # type: ignore[type-var]
    grid: dict[float, EpisodeResult] = {}
    for wd in (0.0, 1e-4, 1e-3):
        config = dataclasses.replace(episode_config(RECIPE, seed=seed, policy="none"), host=static_host)
        if wd:
            config.trainer = dataclasses.replace(config.trainer, weight_decay=wd)
        grid[wd] = run_episode(
            config, settings=settings, run_id=fresh_run_id(settings, f"own2-static-wd{wd:g}-s{seed}")
        )
    best = best_on_validation(grid, language_model=False)
    return {
        "seed": seed,
        "grown_wd": run["wd"],
        "grown_test": run["test"],
        "widths": run["widths"],
        "static_test": 100 * grid[0.0].test_accuracy,
        "tuned_static_test": 100 * grid[best].test_accuracy,
        "tuned_static_wd": best,
        "static_params": grid[0.0].total_params,
        "grown_flops": run["flops"],
        "static_flops": grid[0.0].train_flops,
    }


if __name__ == "__main__":
    settings = EsperSettings(home=Path(sys.argv[2]))
    if sys.argv[1] == "grow":
        out: list[dict[str, Any]] = grow(settings, [int(s) for s in sys.argv[3].split(",")])
    else:
        fresh, own = (json.loads(Path(p).read_text()) for p in sys.argv[3:5])
        grown = [row for p in sys.argv[5:-2] for row in json.loads(Path(p).read_text())]
        out = [static(settings, chosen(fresh, own, grown, int(s))) for s in sys.argv[-2].split(",")]
    Path(sys.argv[-1]).write_text(json.dumps(out, indent=1))
