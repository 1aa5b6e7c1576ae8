"""zoo_trainings: the spread of independent zoo trainings, and the one to ship, on selection seeds only.

Reads every ``<dir>/*/policy.json`` that ``python -m bench.zoo_policy --save <dir>/<name>`` wrote
and reports each training's chosen version and its selection score (validation accuracy minus
the FLOPs charge, on the selection seeds) beside the heuristic's and no growth's on the same
seeds, the spread of the chosen scores across trainings, and the best training by that score.
Evaluation seeds play no part: a training never runs them.

    python -m bench.zoo_trainings baselines/zoo/trainings --json baselines/zoo/trainings/summary.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench._output import save_json


def summarise(directory: Path) -> dict[str, Any]:
    """Per training: chosen label and selection scores; across them: spread and the best.

    Raises:
        SystemExit: ``directory`` holds fewer than two saved trainings (no spread to report).
    """
    trainings: dict[str, Any] = {}
    for path in sorted(directory.glob("*/policy.json")):
        saved = json.loads(path.read_text())
        scores = {s["label"]: s for s in saved["selection"]}
        chosen = scores[saved["chosen_label"]]
        trainings[path.parent.name] = {
            "path": str(path.parent),
            "sha256": saved["sha256"],
            "train_seeds": saved["provenance"]["seeds"]["train"],
            "selection_seeds": saved["provenance"]["seeds"]["selection"],
            "chosen": saved["chosen_label"],
            "chosen_score": chosen["score"],
            "chosen_val_accuracy": chosen["val_accuracy"],
            "chosen_flops_ratio": chosen["flops_ratio"],
            "chosen_by_family": chosen["by_family"],
            "heuristic_score": scores["heuristic"]["score"],
            "none_score": scores["none"]["score"],
            "versions": {label: s["score"] for label, s in scores.items() if label.startswith("v")},
            "wall_s": saved.get("wall_s"),
            "commit": saved.get("commit"),
            "command": saved.get("command"),
        }
    if len(trainings) < 2:
        raise SystemExit(f"{directory} holds {len(trainings)} saved training(s); the spread needs two or more")
    chosen = [t["chosen_score"] for t in trainings.values()]
    best = max(trainings, key=lambda name: trainings[name]["chosen_score"])
    return {
        "bench": "zoo_trainings",
        "trainings": trainings,
        "chosen_score": {
            "mean": statistics.fmean(chosen),
            "std": statistics.stdev(chosen),
            "min": min(chosen),
            "max": max(chosen),
        },
        "chosen_minus_heuristic": {n: t["chosen_score"] - t["heuristic_score"] for n, t in trainings.items()},
        # Chosen on the selection seeds, which every training shares; never on evaluation seeds.
        "best_on_selection": best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the folder holding one folder per saved training")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args()
    out = summarise(args.directory)
    for name, t in out["trainings"].items():
        print(
            f"{name:<14} {t['chosen']:<4} selection {t['chosen_score']:.4f} (heuristic {t['heuristic_score']:.4f}, "
            f"none {t['none_score']:.4f}; FLOPs x{t['chosen_flops_ratio']:.3f})"
        )
    s = out["chosen_score"]
    print(f"chosen scores: mean {s['mean']:.4f} sd {s['std']:.4f} [{s['min']:.4f}, {s['max']:.4f}]")
    print(f"best on selection seeds: {out['best_on_selection']}")
    save_json(out, args.json)


if __name__ == "__main__":
    main()
