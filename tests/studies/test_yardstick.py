"""The yardstick's summary of paired arms (``esper bench transfer`` and ``esper bench rules``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.growth_report import ACCURACY
from esper_core.studies.yardstick import arms_around, format_arms, pairs_around, summarise_arms

ARMS = arms_around("rule")


def _run(arm: str, seed: int, accuracy: float, *, halted: str | None = None) -> EpisodeResult:
    return EpisodeResult(
        run_id=f"{arm}-s{seed}", recipe="m", policy=arm, seed=seed, test_accuracy=accuracy, val_accuracy=accuracy,
        host_params=10, total_params=10, forward_flops=1, train_flops=100, wall_s=1.0, commands={},
        policy_version=None, halted=halted,
    )  # fmt: skip


def _outcome(seed: int, accuracies: dict[str, float], halted: frozenset[str] = frozenset()) -> dict[str, Any]:
    runs = {arm: _run(arm, seed, acc, halted="diverged" if arm in halted else None) for arm, acc in accuracies.items()}
    return {"runs": runs, "tuned_weight_decay": 0.0, "tuning_flops": 300, "widths": {}}


def test_a_halted_run_stays_in_its_pair_at_its_scored_value_and_is_counted() -> None:
    member = SimpleNamespace(name="m")
    jobs = [SimpleNamespace(member=member, seed=s) for s in range(3)]
    level = {"rule": 0.8, "heuristic": 0.8, "none": 0.7, "static": 0.8, "tuned": 0.8}
    outcomes = [
        _outcome(0, level),
        _outcome(1, level),
        # The rule's run on seed 2 halted and is scored at its last commit: 0.5.
        _outcome(2, {**level, "rule": 0.5}, halted=frozenset({"rule"})),
    ]
    summary = summarise_arms(
        [member], jobs, outcomes, metric=ACCURACY, arms=ARMS, pairs=pairs_around("rule"), subject="rule"
    )
    assert summary["pairs"] == 3
    assert {arm: s["halted"] for arm, s in summary["arms"].items()} == {arm: int(arm == "rule") for arm in ARMS}
    assert [r["arms"]["rule"]["halted"] for r in summary["runs"]] == [None, None, "diverged"]
    # Paired at its score, not dropped: the mean difference carries the halted seed's -30 points.
    assert summary["paired"]["rule_minus_tuned"]["n"] == 3
    assert summary["paired"]["rule_minus_tuned"]["mean"] == pytest.approx(-10.0)
    lines = format_arms(summary, subject="rule", label="rule")
    assert "  halted runs (scored at their last commit): rule 1 of 3 pairs" in lines
    # Nothing halted: no line.
    outcomes = [_outcome(s, level) for s in range(3)]
    clean = summarise_arms(
        [member], jobs, outcomes, metric=ACCURACY, arms=ARMS, pairs=pairs_around("rule"), subject="rule"
    )
    assert not any("halted" in line for line in format_arms(clean, subject="rule", label="rule"))
