"""The growth report on a lower-is-better metric (a language model's bits per character)."""

from __future__ import annotations

import dataclasses
import math

from esper_core.studies.arms import ARMS
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.growth_report import BITS_PER_CHAR, format_table, frontier_png, summarise_recipe


def _run(arm: str, seed: int, bits: float, params: int) -> EpisodeResult:
    return EpisodeResult(
        run_id=f"{arm}-{seed}",
        recipe="chars-gpt",
        policy=arm,
        seed=seed,
        test_accuracy=0.0,
        test_loss=bits * math.log(2),
        val_accuracy=0.0,
        host_params=1000,
        total_params=params,
        forward_flops=params * 2,
        wall_s=1.0,
        commands={},
        policy_version=None,
    )


def test_bits_per_character_are_compared_with_lower_as_better() -> None:
    seeds = range(4)
    noise = [0.0, 0.01, -0.01, 0.02]
    # The learned arm is 0.1 bits better than everything else on every seed, at the host's size.
    arms = {arm: [_run(arm, s, 2.0 + noise[s] - (0.1 if arm == "gnn" else 0.0), 1000) for s in seeds] for arm in ARMS}
    frontier = {
        1.0: arms["none"],
        2.0: [_run("none", s, 1.9 + noise[s], 3000) for s in seeds],
    }
    report = summarise_recipe(arms, frontier, BITS_PER_CHAR)
    assert report["metric"] == "test_bits" and report["higher_is_better"] is False
    assert report["paired"]["learned_minus_heuristic"]["mean"] < 0
    assert report["goals"]["learned_beats_heuristic"] and report["goals"]["learned_beats_random"]
    assert report["goals"]["learned_within_0.02_of_static_same_params"] and report["goals"]["met"]
    assert math.isclose(report["arms"]["gnn"]["test_bits_mean"], 1.905)
    result = {
        "device": "cpu",
        "plan": "smoke",
        "seeds": list(seeds),
        "epochs": 2,
        "lr_schedule": "cosine",
        "wall_s": 1.0,
        "policy": {"version": 1, "method": "imitation", "training_s": 1.0},
        "results": {"chars-gpt": report},
    }
    assert "| gnn | 1.905 ± " in format_table(result) and "lower is better" in format_table(result)
    assert frontier_png(result)[:4] == b"\x89PNG"


def test_a_subset_of_arms_is_compared_where_it_can_be_and_its_goals_are_not_judged() -> None:
    """``--arms heuristic``: the heuristic's entries, no learned ones, and no goal verdict (the
    goals compare the learned policy with the others)."""
    seeds = range(3)
    arms = {arm: [_run(arm, s, 2.0 - (0.1 if arm == "heuristic" else 0.0) + 0.01 * s, 1000) for s in seeds]
            for arm in ("none", "heuristic")}  # fmt: skip
    arms["heuristic"] = [dataclasses.replace(r, train_flops=7) for r in arms["heuristic"]]
    frontier = {1.0: arms["none"], 2.0: [_run("none", s, 1.9, 3000) for s in seeds]}
    report = summarise_recipe(arms, frontier, BITS_PER_CHAR)
    assert set(report["paired"]) == {"heuristic_minus_none", "heuristic_minus_static_same_params"}
    assert report["goals"] == {}
    assert report["arms"]["heuristic"]["train_flops_mean"] == 7
    result = {
        "device": "cpu",
        "plan": "smoke",
        "seeds": list(seeds),
        "epochs": 2,
        "lr_schedule": "cosine",
        "wall_s": 1.0,
        "policy": None,
        "kernel_compile_s": 2.0,
        "evaluation_s": 3.4,
        "fan_out": {"workers": 2, "dask_address": None},
        "results": {"chars-gpt": report},
    }
    table = format_table(result)
    assert "no learned arm" in table and "goal on chars-gpt: not judged" in table
    assert "(kernels 2 s, evaluation 3 s on 2 workers)" in table.splitlines()[0]


def test_a_halted_run_keeps_its_seeds_pair_and_each_arm_counts_them() -> None:
    seeds = range(3)
    arms = {arm: [_run(arm, s, 2.0 + 0.01 * s, 1000) for s in seeds] for arm in ("none", "heuristic")}
    # The heuristic's seed-1 run halted, scored at its last commit: 3 bits instead of ~2.
    arms["heuristic"][1] = dataclasses.replace(arms["heuristic"][1], test_loss=3.0 * math.log(2), halted="diverged")
    frontier = {1.0: arms["none"], 2.0: [_run("none", s, 1.9, 3000) for s in seeds]}
    report = summarise_recipe(arms, frontier, BITS_PER_CHAR)
    assert report["arms"]["heuristic"]["halted"] == 1 and report["arms"]["none"]["halted"] == 0
    assert [r["halted"] for r in report["arms"]["heuristic"]["runs"]] == [None, "diverged", None]
    assert report["paired"]["heuristic_minus_none"]["n"] == 3
    assert math.isclose(report["paired"]["heuristic_minus_none"]["mean"], (3.0 - 2.01) / 3)
    result = {
        "device": "cpu", "plan": "smoke", "seeds": list(seeds), "epochs": 2, "lr_schedule": "cosine",
        "wall_s": 1.0, "policy": None, "results": {"chars-gpt": report},
    }  # fmt: skip
    assert "halted runs (scored at their last commit, kept in their pairs): heuristic 1" in format_table(result)
    report["arms"]["heuristic"]["halted"] = 0
    assert "halted" not in format_table(result)
