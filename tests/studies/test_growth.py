"""The growth benchmark's smoke plan end to end (real runs, a real Simic policy), and its input checks.

Numbers are not asserted (they belong to the benchmark run); the report's shape is: every arm,
the frontier, the paired entries with their intervals, the goals, and the plot on disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from esper_cli.main import main
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.arms import ARMS
from esper_core.studies.growth import GrowthBenchConfig, run

PAIRED = (
    "learned_minus_heuristic",
    "learned_minus_random",
    "heuristic_minus_none",
    "learned_minus_static_same_params",
)


@pytest.mark.slow
def test_smoke_plan_writes_the_paired_report_and_the_frontier_plot(
    compiled_home: EsperSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "baseline"
    argv = ["bench", "growth", "--recipes", "seed-reference", "--plan", "smoke", "--workers", "0", "--json"]
    assert main([*argv, "--home", str(compiled_home.home), "--save-baseline", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seeds"] == [0, 1] and result["lr_schedule"] == "cosine"
    # The phases' wall times, and where the runs went.
    assert 0 < result["kernel_compile_s"] + result["policy"]["training_s"] + result["evaluation_s"] <= result["wall_s"]
    assert result["fan_out"] == {"workers": 0, "dask_address": None}
    report = result["results"]["seed-reference"]
    assert set(report["arms"]) == set(ARMS)
    for arm in report["arms"].values():
        assert {"test_acc_mean", "params_mean", "flops_mean", "wall_s_mean"} <= arm.keys()
        assert [r["seed"] for r in arm["runs"]] == [0, 1]
    assert [f["width"] for f in report["frontier"]] == [1.0, 2.0]
    for name in PAIRED:
        entry = report["paired"][name]
        assert entry["n"] == 2 and entry["ci95_low"] <= entry["mean"] <= entry["ci95_high"]
    # Budget-matched: random's seeds never outgrow the GNN's on the same seed.
    for gnn, rand in zip(report["arms"]["gnn"]["runs"], report["arms"]["random"]["runs"], strict=True):
        assert rand["params"] <= gnn["params"]
    assert "met" in report["goals"]
    assert json.loads((out / "growth.json").read_text())["results"].keys() == {"seed-reference"}
    assert (out / "growth_frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _numbers(result: dict) -> dict:
    """The runs' results without what names or times them."""

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("run_id", "wall_s", "wall_s_mean", "fork_ms")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(json.dumps(result["results"], default=str)))  # type: ignore[return-value]


@pytest.mark.slow
def test_runs_fanned_out_on_dask_give_the_sequential_numbers_bit_for_bit(
    compiled_home: EsperSettings, compiled_home_template: Path, tmp_path: Path
) -> None:
    config = GrowthBenchConfig(recipes=("seed-reference",), plan="smoke", home=compiled_home.home, workers=0)
    sequential = run(config)
    # The fanned-out benchmark trains its own policy too (Simic's episodes on the workers), in a
    # fresh copy of the same registry: the GNN samples by run id, and a rerun in the first home
    # would give its episodes new ids.
    fanned_home = tmp_path / "fanned"
    shutil.copytree(compiled_home_template, fanned_home)
    fanned = run(GrowthBenchConfig(**{**_fields(config), "workers": 2, "home": fanned_home}))
    assert _numbers(fanned) == _numbers(sequential)
    # The same episodes taught both policies. Their weights agree only to rounding: Tamiyo's graph
    # reads wall-clock latencies, so no two trainings, fanned out or not, match bit for bit.
    assert fanned["policy"]["demonstration_runs"] == sequential["policy"]["demonstration_runs"]
    decisions = _decisions(fanned_home)
    assert decisions and decisions == _decisions(compiled_home.home)
    accuracies = [r["test_acc"] for r in fanned["results"]["seed-reference"]["arms"]["gnn"]["runs"]]
    assert len(accuracies) == 2  # both seeds ran on the cluster


def _decisions(home: Path) -> list[tuple[str, int, str]]:
    """Every recorded decision of Simic's episodes: run, epoch and the command it issued."""
    store = SimicStore.open(home)
    try:
        decisions = store.decisions()
    finally:
        store.close()
    return [
        (d.state.current.run_id, d.command.epoch, f"{d.command.command_type}:{d.command.seed_operation}")
        for d in decisions
        if d.state.current.run_id.startswith("simic-")
    ]


def _fields(config: GrowthBenchConfig) -> dict:
    return {name: getattr(config, name) for name in config.__slots__}  # type: ignore[attr-defined]


def test_bad_options_are_refused_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown growth plan"):
        GrowthBenchConfig(plan="huge")
    with pytest.raises(ValueError, match="workers must be >= 0"):
        GrowthBenchConfig(workers=-1)
    with pytest.raises(ValueError, match="shared path: give home"):
        GrowthBenchConfig(dask_address="tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match="seeds must be >= 2"):
        GrowthBenchConfig(seeds=1)
    with pytest.raises(ValueError, match="overlap Simic's training seeds"):
        GrowthBenchConfig(seeds=1001)
    with pytest.raises(ValueError, match="without ModelSpec.build_scaled"):
        GrowthBenchConfig(recipes=("tests.helpers.user_model:recipe",))
    with pytest.raises(ValueError, match="widths must be distinct factors > 0 other than 1"):
        GrowthBenchConfig(widths=(1.0, 2.0))
    assert GrowthBenchConfig(widths=(0.5, 1.5)).growth_plan.widths == (0.5, 1.5)
    with pytest.raises(ValueError, match="pass the home"):
        GrowthBenchConfig(policy_version=3)
    assert GrowthBenchConfig(simic_plan="counterfactual").growth_plan.simic == "counterfactual"
    with pytest.raises(ValueError, match="unknown training plan 'huge'"):
        GrowthBenchConfig(simic_plan="huge")
    with pytest.raises(ValueError, match="pass one of them"):
        GrowthBenchConfig(simic_plan="counterfactual", policy_version=3, home=tmp_path)


def test_a_plan_names_its_recipes_and_an_explicit_list_wins() -> None:
    assert GrowthBenchConfig().recipes == ("mnist1d-cnn",)
    assert GrowthBenchConfig(plan="full").recipes == ("mnist1d-cnn", "digits-mlp")
    assert GrowthBenchConfig(plan="full", recipes=["digits-mlp"]).recipes == ("digits-mlp",)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name at least one recipe"):
        GrowthBenchConfig(recipes=())
