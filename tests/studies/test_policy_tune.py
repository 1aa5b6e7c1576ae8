"""``esper policy tune``: the shipped policy fine-tuned on a recipe's proxies, end to end on a real
registry, its verdict read off paired held-out runs, and bad input refused before any episode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_cli.main import main
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.policy_tune import TuneConfig, TuneResult, format_result
from esper_core.tamiyo.model import TamiyoGNNConfig

pytestmark = pytest.mark.slow


def test_tune_publishes_versions_from_the_shipped_policy_and_judges_the_chosen_one(
    compiled_home: EsperSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "tune.json"
    argv = ["policy", "tune", "--recipe", "digits-mlp", "--episodes", "2", "--iterations", "1", "--proxy-epochs", "2"]
    argv += ["--selection-seeds", "1", "--eval-seeds", "2", "--epochs", "3", "--json", "--save", str(saved)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert json.loads(saved.read_text()) == report
    # The recipe's host scales, so the proxy is half as wide, on half its training data.
    assert report["proxy"] == {"width": 0.5, "train_fraction": 0.5, "epochs": 2}
    shipped, (tuned,) = report["shipped_version"], report["versions"]
    assert set(report["selection"]) == {"none", "shipped", f"v{tuned}"}
    assert report["settings"]["episodes"] == 2 and report["settings"]["selection_seeds"] == [2000]
    # On two-epoch proxies the tuned version scored no higher than the shipped policy, which wins
    # ties, so nothing is judged on the full recipe (the verdicts: test_the_verdict_... below).
    assert report["chosen"] == shipped and report["selection"][f"v{tuned}"] <= report["selection"]["shipped"]
    assert report["eval_seeds"] == [0, 1] and len(report["shipped_test"]) == 2
    assert report["tuned_test"] == [] and report["tuned_minus_shipped"] is None
    assert report["verdict"].startswith("no tuned version beat the shipped policy")
    assert (compiled_home.runs_dir / f"tune-roll-v{shipped}-digits-mlp-gnn-s1000").is_dir()
    store = SimicStore.open(compiled_home.home)
    try:
        version = store.get_policy(tuned)
        assert (version.method, version.parent_version) == ("ppo", shipped)
        assert version.provenance["tuned_from"] == "zoo-1" and version.provenance["recipe"] == "digits-mlp"
        assert store.get_policy(shipped).method == "shipped:zoo-1"
    finally:
        store.close()
    # A second tuning starts from the same registry version of the shipped policy, under run ids
    # of its own that follow from the registry's state.
    assert main([*argv[:-3], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shipped_version"] == shipped
    assert (compiled_home.runs_dir / f"tune{tuned}-roll-v{shipped}-digits-mlp-gnn-s1000").is_dir()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"recipe": "nope"}, "unknown recipe 'nope'"),
        ({"recipe": "seed-reference", "proxy_width": 0.5}, r"esper policy tune --proxy-width 1"),
        ({"recipe": "digits-mlp", "episodes": 3, "iterations": 2}, "must be a positive multiple of iterations"),
        ({"recipe": "digits-mlp", "eval_seeds": 1}, "a paired interval needs two seeds"),
        ({"recipe": "digits-mlp", "shipped": "zoo-99"}, "esper policy list"),
        ({"recipe": "digits-mlp", "proxy_data": 0.0}, r"proxy_data must be a share"),
        ({"recipe": "digits-mlp", "proxy_epochs": 1}, "a reward needs two epochs"),
        ({"recipe": "digits-mlp", "episodes": 1004, "iterations": 4}, "would run into the selection seeds"),
        ({"recipe": "digits-mlp", "eval_seeds": 1001}, "would reuse the seeds the policy is tuned on"),
        ({"recipe": "digits-mlp", "proxy_width": float("nan")}, "proxy_width must be a width factor"),
    ],
)
def test_bad_tuning_options_are_refused_before_any_episode(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TuneConfig(**options)  # type: ignore[arg-type]


def test_the_command_refuses_a_bad_recipe_in_one_line_and_stores_nothing(
    esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "tune", "--recipe", "nope"]) == 2
    assert "unknown recipe 'nope'" in capsys.readouterr().err
    assert not esper_home.home.exists()  # no registry opened, no run folder


def _run(seed: int, test_accuracy: float) -> EpisodeResult:
    return EpisodeResult(
        run_id=f"r{seed}", recipe="m", policy="gnn", seed=seed, test_accuracy=test_accuracy,
        val_accuracy=test_accuracy, host_params=1, total_params=1, forward_flops=1, train_flops=100,
        wall_s=0.0, commands={}, policy_version=None,
    )  # fmt: skip


def _result(shipped: list[float], tuned: list[float]) -> TuneResult:
    return TuneResult(
        recipe="m", shipped="zoo-1", shipped_version=1, versions=[2, 3], chosen=3 if tuned else 1,
        selection={"none": 0.5, "shipped": 0.4, "v2": 0.4, "v3": 0.45}, shipped_runs=[_run(s, a) for s, a in enumerate(shipped)],
        tuned_runs=[_run(s, a) for s, a in enumerate(tuned)], language_model=False,
        proxy={"width": 0.5, "train_fraction": 0.5, "epochs": 2}, settings={}, wall_s={},
    )  # fmt: skip


def test_the_verdict_follows_the_paired_interval_on_the_held_out_seeds() -> None:
    shipped = [0.80, 0.82, 0.78, 0.81, 0.79]
    better = _result(shipped, [a + 0.02 + 0.001 * k for k, a in enumerate(shipped)])
    assert better.difference is not None and better.difference.better()
    assert better.verdict.startswith("tuned v3 beat the shipped policy: +2.20 points [")
    assert "esper run --recipe m --policy gnn:3" in better.verdict
    worse = _result(shipped, [a - 0.02 - 0.001 * k for k, a in enumerate(shipped)])
    assert "worse than the shipped policy" in worse.verdict
    mixed = _result(shipped, [a + d for a, d in zip(shipped, (0.02, -0.02, 0.01, -0.01, 0.0), strict=True)])
    assert mixed.verdict.startswith("not resolved: tuned v3 - shipped") and "--eval-seeds" in mixed.verdict
    same = _result(shipped, shipped)
    assert same.verdict == "tuned v3 scored the same as the shipped policy on all 5 held-out seeds: keep serving it"
    kept = _result(shipped, [])
    assert kept.difference is None and kept.as_dict()["tuned_minus_shipped"] is None
    assert kept.verdict.startswith("no tuned version beat the shipped policy")
    # Not growing scored best on the proxy: the report says so.
    shown = format_result(kept)
    assert "proxy: width x0.5, 50% of the training split, 2 epochs" in shown
    assert "note: on the proxy, no growth scored above every version" in shown


def test_a_proxy_is_narrower_and_holds_less_data_but_trains_as_long_as_the_recipe() -> None:
    config = TuneConfig(recipe="digits-mlp")
    plan = config.plan(TamiyoGNNConfig())
    assert plan.epochs == get_recipe("digits-mlp").epochs and (plan.iterations, plan.rollouts) == (4, 12)
    assert plan.variation.widths == (0.5,) and plan.variation.train_fractions == (0.5,)
    assert (plan.simic.ppo_lr, plan.simic.ppo_epochs, plan.simic.flops_penalty) == (3e-3, 8, 0.01)
    assert TuneConfig(recipe="digits-mlp", epochs=5).plan(TamiyoGNNConfig()).epochs == 5
    # A host that cannot be scaled is tuned at its own width.
    assert TuneConfig(recipe="seed-reference").width == 1.0
