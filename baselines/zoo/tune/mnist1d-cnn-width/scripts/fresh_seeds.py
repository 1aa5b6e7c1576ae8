"""Tuned v5 against the shipped policy (v1), the heuristic and no growth on fresh seeds 100-115.

HOME is the registry the tuning published v5 to: python fresh_seeds.py HOME OUT.json
"""

import json
import sys
from pathlib import Path

from esper_core.settings import EsperSettings
from esper_core.studies.simic_train import TrainingPlan, collect_episodes
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.telemetry.paired import paired_difference

settings = EsperSettings(home=Path(sys.argv[1]))
plan = TrainingPlan(gnn=TamiyoGNNConfig())
seeds = list(range(100, 116))
arms: dict[str, list[dict[str, object]]] = {}
for label, policy, version in (
    ("tuned-v5", "gnn", 5),
    ("shipped-v1", "gnn", 1),
    ("heuristic", "heuristic", None),
    ("none", "none", None),
):
    runs = collect_episodes(
        settings,
        recipe="mnist1d-cnn-width",
        seeds=seeds,
        policy=policy,
        plan=plan,
        policy_version=version,
        label=f"fresh-{label}",
    )
    arms[label] = [
        {
            "seed": r.seed,
            "test": 100 * r.test_accuracy,
            "val": 100 * r.val_accuracy,
            "flops": r.train_flops,
            "params": r.total_params,
            "commands": r.commands,
        }
        for r in runs
    ]
out: dict[str, object] = {"seeds": seeds, "arms": arms, "differences": {}}
test = {k: [float(a["test"]) for a in v] for k, v in arms.items()}  # type: ignore[arg-type]
pairs = (("tuned-v5", "shipped-v1"), ("tuned-v5", "heuristic"), ("tuned-v5", "none"), ("shipped-v1", "none"))
for a, b in (*pairs, ("heuristic", "none")):
    diff = paired_difference(test[a], test[b])
    out["differences"][f"{a} - {b}"] = diff.as_dict()  # type: ignore[index]
    print(a, "-", b, diff)
Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
