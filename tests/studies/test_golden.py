"""Golden runs: a record is reproducible, and a comparison names every difference."""

from __future__ import annotations

import copy

import pytest

from bench.golden import main
from esper_core.settings import EsperSettings
from esper_core.studies.golden import GoldenCase, compare, record

CASE = GoldenCase(recipe="seed-reference", policy="heuristic", seed=0, epochs=3)


@pytest.mark.slow
def test_a_record_is_reproduced_and_a_changed_number_is_named(compiled_home: EsperSettings) -> None:
    first = record([CASE], compiled_home)
    (compiled_home.runs_dir / CASE.name).rename(compiled_home.runs_dir / "first")
    second = record([CASE], compiled_home)
    assert compare(first, second) == []
    run = first[CASE.name]
    assert len(run["epochs"]) == 3 and float(run["epochs"][0]["val_loss"]) > 0
    assert {e["command"][0] for e in run["epochs"]} <= {"wait", "germinate", "advance", "fossilize", "cull"}
    changed = copy.deepcopy(second)
    changed[CASE.name]["epochs"][1]["val_loss"] = "1.0"
    changed[CASE.name]["weights"] = "0" * 64
    lines = compare(first, changed)
    assert len(lines) == 2
    assert lines[0].startswith(f"{CASE.name} epoch 1 val_loss: ") and lines[0].endswith(" != 1.0")
    assert lines[1].startswith(f"{CASE.name} weights: ")
    assert compare(first, {}) == [f"{CASE.name}: only in the first record"]


def test_a_malformed_case_is_refused_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["record", "out.json", "--case", "seed-reference:heuristic"])
    assert exit_info.value.code == 2
    assert "expected RECIPE:POLICY:SEED:EPOCHS" in capsys.readouterr().err
