"""The tuned version against the static network of its own grown shape (weight decay 0, and chosen
on validation from {0, 1e-4, 1e-3}) on the tuning's evaluation seeds 0-7, each grown run checked
against the tuning's own evaluation run of that seed (it ran on 2 Dask workers; this, here).

python own_shape.py HOME TUNE_REPORT.json OUT.json   (HOME: the registry the tuning published to)
"""

import dataclasses
import functools
import json
import statistics
import sys
from pathlib import Path

from esper_core.data import load_dataset
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.studies.growth import fresh_run_id
from esper_core.studies.yardstick import best_on_validation, static_shape
from esper_core.telemetry.paired import paired_difference

settings = EsperSettings(home=Path(sys.argv[1]))
report = json.loads(Path(sys.argv[2]).read_text())
recipe, version = report["recipe"], report["chosen"]
rows = []
for seed in report["eval_seeds"]:
    grown_config = episode_config(recipe, seed=seed, policy="gnn", policy_version=version)
    grown = run_episode(grown_config, settings=settings, run_id=fresh_run_id(settings, f"own-v{version}-s{seed}"))
    host = grown_config.host
    shape = load_dataset(grown_config.data).feature_shape
    build = functools.partial(static_shape, host.build, grown.widths, shape, host.input_dtype)  # type: ignore[union-attr]
    static_host = dataclasses.replace(host, build=build)  # type: ignore[type-var]
    grid: dict[float, EpisodeResult] = {}
    for wd in (0.0, 1e-4, 1e-3):
        config = dataclasses.replace(episode_config(recipe, seed=seed, policy="none"), host=static_host)
        if wd:
            config.trainer = dataclasses.replace(config.trainer, weight_decay=wd)
        grid[wd] = run_episode(config, settings=settings, run_id=fresh_run_id(settings, f"own-static-wd{wd:g}-s{seed}"))
    best = best_on_validation(grid, language_model=False)
    row = {
        "seed": seed,
        "grown_test": 100 * grown.test_accuracy,
        "equals_tune_eval": abs(100 * grown.test_accuracy - report["tuned_test"][seed]) < 1e-9,
        "widths": grown.widths,
        "params": grown.total_params,
        "static_test": 100 * grid[0.0].test_accuracy,
        "tuned_test": 100 * grid[best].test_accuracy,
        "tuned_wd": best,
        "grown_flops": grown.train_flops,
        "static_flops": grid[0.0].train_flops,
    }
    rows.append(row)
    print(row, flush=True)
out: dict[str, object] = {"recipe": recipe, "version": version, "rows": rows}
for key in ("static_test", "tuned_test"):
    diff = paired_difference([r["grown_test"] for r in rows], [r[key] for r in rows])  # type: ignore[misc]
    out[f"grown - {key}"] = diff.as_dict()
    print(key, diff)
out["flops_ratio"] = statistics.fmean(r["grown_flops"] / r["static_flops"] for r in rows)  # type: ignore[operator]
print(out["flops_ratio"])
Path(sys.argv[3]).write_text(json.dumps(out, indent=1))
