"""bench.rules_budget: the default rule at several budgets on the same hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.rules_budget import main


def test_each_budget_pairs_the_rule_with_the_static_network_of_its_shape_on_the_same_hosts(tmp_path: Path) -> None:
    out = tmp_path / "budget.json"
    argv = ["--epochs", "2", "3", "--families", "mlp", "--zoo-families", "mlp", "cnn1d"]
    assert main([*argv, "--eval-members", "1", "--seeds", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["budgets"]) == {"2", "3"}
    short, long = result["budgets"]["2"]["mlp"], result["budgets"]["3"]["mlp"]
    # The same member at both budgets: the zoo's draw does not depend on the budget.
    assert short["members"] == long["members"] and short["pairs"] == long["pairs"] == 2
    assert "rule_minus_tuned" in short["paired"] and "rule_minus_heuristic" in long["paired"]


def test_a_family_outside_the_zoo_is_refused_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--epochs", "4", "--families", "gru", "--zoo-families", "mlp"])
    assert exit_info.value.code == 2
    assert "are not among --zoo-families" in capsys.readouterr().err
