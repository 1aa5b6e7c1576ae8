"""Tuned v5 on fresh seeds 100-115 against the static network of its own grown shape, weight decay tuned on validation."""
import dataclasses, functools, json, statistics
from pathlib import Path
from esper_core.data import load_dataset
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.studies.growth import fresh_run_id
from esper_core.studies.yardstick import best_on_validation, static_shape
from esper_core.telemetry.paired import paired_difference
s = EsperSettings(home=Path("/tmp/tune3/h60"))
fresh = json.load(open("/tmp/tune3/fresh.json"))
rows = []
for seed in range(100, 116):
    grown_cfg = episode_config("mnist1d-cnn-width", seed=seed, policy="gnn", policy_version=5)
    grown = run_episode(grown_cfg, settings=s, run_id=fresh_run_id(s, f"yard-v5-s{seed}"))
    before = next(a for a in fresh["arms"]["tuned-v5"] if a["seed"] == seed)
    host = grown_cfg.host
    shape = load_dataset(grown_cfg.data).feature_shape
    static_host = dataclasses.replace(host, build=functools.partial(static_shape, host.build, grown.widths, shape, host.input_dtype))
    grid = {}
    for wd in (0.0, 1e-4, 1e-3):
        cfg = dataclasses.replace(episode_config("mnist1d-cnn-width", seed=seed, policy="none"), host=static_host)
        if wd:
            cfg.trainer = dataclasses.replace(cfg.trainer, weight_decay=wd)
        grid[wd] = run_episode(cfg, settings=s, run_id=fresh_run_id(s, f"yard-static-wd{wd:g}-s{seed}"))
    best = best_on_validation(grid, language_model=False)
    row = {"seed": seed, "grown_test": 100 * grown.test_accuracy, "rerun_equal": abs(100 * grown.test_accuracy - before["test"]) < 1e-9,
           "widths": grown.widths, "params": grown.total_params, "static_test": 100 * grid[0.0].test_accuracy,
           "static_params": grid[0.0].total_params, "tuned_test": 100 * grid[best].test_accuracy, "tuned_wd": best,
           "grown_flops": grown.train_flops, "static_flops": grid[0.0].train_flops}
    rows.append(row); print(row, flush=True)
out = {"rows": rows}
for k in ("static_test", "tuned_test"):
    d = paired_difference([r["grown_test"] for r in rows], [r[k] for r in rows]); out[f"grown - {k}"] = d.as_dict(); print("grown -", k, d)
out["flops_ratio"] = statistics.fmean(r["grown_flops"] / r["static_flops"] for r in rows)
print("flops ratio", out["flops_ratio"])
json.dump(out, open("/tmp/tune3/yard.json", "w"), indent=1)
