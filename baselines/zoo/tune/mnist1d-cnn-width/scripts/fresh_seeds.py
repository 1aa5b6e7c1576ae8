"""Tuned v5 vs shipped v1, heuristic and no growth on fresh seeds 100-115 of mnist1d-cnn-width."""
import json, sys
from pathlib import Path
from esper_core.settings import EsperSettings
from esper_core.studies.simic_train import TrainingPlan, collect_episodes
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.telemetry.paired import paired_difference
s = EsperSettings(home=Path("/tmp/tune3/h60"))
plan = TrainingPlan(gnn=TamiyoGNNConfig())
seeds = list(range(100, 116))
arms = {}
for label, policy, version in (("tuned-v5", "gnn", 5), ("shipped-v1", "gnn", 1), ("heuristic", "heuristic", None), ("none", "none", None)):
    rs = collect_episodes(s, recipe="mnist1d-cnn-width", seeds=seeds, policy=policy, plan=plan, policy_version=version, label=f"fresh-{label}")
    arms[label] = [{"seed": r.seed, "test": 100 * r.test_accuracy, "val": 100 * r.val_accuracy, "flops": r.train_flops, "params": r.total_params, "commands": r.commands} for r in rs]
    print(label, [round(a["test"], 2) for a in arms[label]], flush=True)
out = {"seeds": seeds, "arms": arms, "differences": {}}
t = {k: [a["test"] for a in v] for k, v in arms.items()}
for a, b in (("tuned-v5", "shipped-v1"), ("tuned-v5", "heuristic"), ("tuned-v5", "none"), ("shipped-v1", "none"), ("heuristic", "none")):
    d = paired_difference(t[a], t[b]); out["differences"][f"{a} - {b}"] = d.as_dict(); print(a, "-", b, d)
json.dump(out, open("/tmp/tune3/fresh.json", "w"), indent=1)
