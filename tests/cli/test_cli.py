"""The ``esper`` command: help, inspection commands and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from esper_cli.main import build_parser, main
from esper_core.settings import EsperSettings


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "runs", "export", "catalog", "registry", "bench"):
        assert command in out


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["export"],
        ["catalog", "list"],
        ["catalog", "compile"],
        ["registry", "list"],
        ["runs", "list"],
        ["bench", "seed-reference"],
    ],
)
def test_every_subcommand_explains_its_options(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    out = capsys.readouterr().out
    for action in build_parser()._subparsers._group_actions[0].choices[argv[0]]._actions:  # type: ignore[union-attr]
        if action.help and action.option_strings:
            assert action.option_strings[-1] in out


def test_catalog_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "list", "--json"]) == 0
    ids = {d["blueprint_id"] for d in json.loads(capsys.readouterr().out)}
    assert {"residual_mlp", "lowrank_adapter"} <= ids


def test_registry_list_on_empty_and_compiled_home(
    esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["registry", "list"]) == 0
    assert "no artifacts" in capsys.readouterr().out


def test_registry_list_shows_published(compiled_home: EsperSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["blueprint_id"] for r in rows} >= {"lowrank_adapter"}


def test_bad_input_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--epochs", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive integer" in capsys.readouterr().err
    assert main(["run", "--recipe", "nope"]) == 2  # refused before Prefect starts
    err = capsys.readouterr().err
    assert "unknown recipe 'nope'" in err and "package.module:function" in err and "Traceback" not in err
    # seed-reference's batch is 4: eight processes cannot share it (refused before Prefect starts).
    assert main(["run", "--recipe", "seed-reference", "--nproc", "8"]) == 2
    assert "batch_size 4 cannot be shared by 8 processes" in capsys.readouterr().err
    assert main(["run", "--recipe", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'nope'" in err and "package.module:function" in err and "Traceback" not in err


def test_bench_seed_reference_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "seed-reference", "--epochs", "10", "--warmup-batches", "4", "--no-compile", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps_per_epoch"] == 4
    for key in ("esper_p95_ms", "bare_p95_ms", "ratio_p95"):
        assert result[key] > 0


def test_bench_training_any_recipe_writes_a_baseline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "user.json"
    argv = ["bench", "training", "--recipe", "tests.helpers.user_model:recipe", "--epochs", "5", "--seeds", "0"]
    argv += ["--min-seconds", "0.2", "--warmup-batches", "0", "--no-compile", "--json", "--save-baseline", str(out)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["workload"] == "tests.helpers.user_model:recipe" and result["epoch_ratio_p50"] > 0
    assert result["epochs"] >= 6 and result["epochs"] % 4 == 0  # at least 0.2 s, in whole rounds of the 4 paths
    saved = json.loads(out.read_text())
    assert set(saved["latency"]) >= {"bare", "bare_default", "esper_chosen", "epoch_bare", "epoch_esper_chosen"}


def test_console_script_is_installed() -> None:
    out = subprocess.run([sys.executable, "-m", "esper_cli", "--help"], capture_output=True, text=True, check=True)
    assert "Grow neural networks" in out.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "unknown blueprint 'nope': known blueprints are"),
        (["lowrank_adapter", "--approve", "nope"], "unknown blueprint 'nope'"),
        (["glu_block"], "pass --approve glu_block"),
    ],
)
def test_catalog_compile_refuses_bad_input_before_any_flow_starts(
    argv: list[str], message: str, esper_home: EsperSettings
) -> None:
    # A real process, as a user runs it: the message, and neither a traceback nor a flow run.
    done = subprocess.run(
        [sys.executable, "-m", "esper_cli", "catalog", "compile", *argv, "--recipe", "seed-reference"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert any(line.startswith("esper: error: ") and message in line for line in done.stderr.splitlines()), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "flow run" not in (done.stdout + done.stderr).lower()
    assert not (esper_home.home / "registry.db").exists()  # nothing was started


def test_export_of_an_unknown_run_says_where_it_looked(
    esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert "no run 'no-such-run'" in err and str(esper_home.runs_dir) in err


def test_bench_growth_refuses_random_without_the_learned_arm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "growth", "--arms", "heuristic", "random", "--workers", "0"]) == 2
    assert "budget-matched to the learned one" in capsys.readouterr().err


def test_bench_transfer_refuses_more_seeds_than_the_training_reserves(capsys: pytest.CaptureFixture[str]) -> None:
    # Refused before any training: the evaluation seeds are the zoo training's reserved ones.
    assert main(["bench", "transfer", "--families", "gru", "--seeds", "41"]) == 2
    assert "reserves 40 evaluation seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "transfer", "--families", "lstm"])


def test_bench_rules_refuses_evaluating_on_the_searched_zoo(capsys: pytest.CaptureFixture[str]) -> None:
    # Refused before any episode: the evaluated hosts must be drawn under another zoo seed.
    assert main(["bench", "rules", "--zoo-seed", "3", "--eval-zoo-seed", "3"]) == 2
    assert "is the zoo's own seed" in capsys.readouterr().err
