"""bench.zoo_trainings: the spread of saved zoo trainings and the best on selection seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.zoo_trainings import summarise


def _save(directory: Path, name: str, chosen: float, heuristic: float) -> None:
    def score(label: str, value: float) -> dict[str, object]:
        return {"label": label, "score": value, "val_accuracy": value, "flops_ratio": 1.1, "by_family": {"mlp": value}}

    folder = directory / name
    folder.mkdir(parents=True)
    saved = {
        "sha256": name * 4,
        "provenance": {"seeds": {"train": [1000], "selection": [2000]}},
        "chosen_label": "v2",
        "selection": [
            score("none", 0.5),
            score("heuristic", heuristic),
            score("v1", chosen - 0.01),
            score("v2", chosen),
        ],
    }
    (folder / "policy.json").write_text(json.dumps(saved))


def test_the_best_training_is_the_one_with_the_best_selection_score(tmp_path: Path) -> None:
    _save(tmp_path, "a", 0.70, 0.69)
    with pytest.raises(SystemExit, match="needs two or more"):
        summarise(tmp_path)
    _save(tmp_path, "b", 0.74, 0.69)
    out = summarise(tmp_path)
    assert out["best_on_selection"] == "b"
    assert out["chosen_score"]["min"] == 0.70 and out["chosen_score"]["max"] == 0.74
    assert out["chosen_minus_heuristic"]["b"] == pytest.approx(0.05)
    assert out["trainings"]["a"]["versions"] == {"v1": pytest.approx(0.69), "v2": 0.70}
