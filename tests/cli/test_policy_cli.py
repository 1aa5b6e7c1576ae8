"""``esper policy list`` and ``esper policy show``: the shipped policies, checked and described."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_cli.main import main
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.simic.shipping import publish_shipped
from esper_core.tamiyo import shipped
from tests.helpers.shipped import make_shipped


def test_list_names_every_shipped_policy_with_its_digest_and_registry_version(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = make_shipped(tmp_path / "policies", monkeypatch)
    assert main(["policy", "list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "zoo-1" and row["default"] and row["sha256"] == digest and row["digest"] == "ok"
    assert row["registry_version"] is None  # not used yet: the first run publishes it
    store = SimicStore.open(esper_home.home)
    try:
        version = publish_shipped(store, "zoo-1")
    finally:
        store.close()
    assert main(["policy", "list"]) == 0
    out = capsys.readouterr().out
    assert f"registry: {version.label}" in out and "selection score 0.5000" in out


def test_show_describes_one_and_fails_on_weights_that_are_not_the_released_ones(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_shipped(tmp_path / "policies", monkeypatch)
    assert main(["policy", "show", "zoo-1"]) == 0
    out = capsys.readouterr().out
    assert f"sha256     {shipped.SHIPPED['zoo-1']}" in out and '"commit"' not in out and 'commit     "test"' in out
    monkeypatch.setitem(shipped.SHIPPED, "zoo-1", "f" * 64)
    assert main(["policy", "show", "zoo-1"]) == 2
    assert "refusing to serve" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["policy", "show", "zoo-99"])


def test_esper_run_takes_a_policy_pin_and_a_growth_cap() -> None:
    from esper_cli.main import build_parser

    args = build_parser().parse_args(["run", "--policy", "zoo-1", "--max-params", "50000", "--max-flops", "90000"])
    assert (args.policy, args.max_params, args.max_flops) == ("zoo-1", 50000, 90000)
    assert build_parser().parse_args(["run"]).policy is None  # the recipe's own (the heuristic by default)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--policy", "zoo-99"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--max-params", "0"])
    # One Simic version by number (what `esper policy tune` publishes).
    assert build_parser().parse_args(["run", "--policy", "gnn:12"]).policy == "gnn:12"
    for bad in ("gnn:0", "gnn:v2"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--policy", bad])


def test_esper_run_takes_a_growth_window_that_reaches_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    from esper_cli.main import build_parser
    from esper_core.run.spec import plan_spec

    args = build_parser().parse_args(["run", "--recipe", "seed-reference", "--device", "cpu", "--grow-until", "0.25"])
    assert args.grow_until == 0.25
    assert build_parser().parse_args(["run"]).grow_until is None  # the recipe's own
    # What `esper run` plans from the parsed flag (esper_cli/run.py).
    planned = plan_spec(args.recipe, device=args.device, grow_until=args.grow_until)
    assert planned.spec.grow_until == 0.25 and planned.config.tamiyo.risk.grow_until == 0.25
    for bad in ("0", "1.5", "-0.25", "nan", "a quarter"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--grow-until", bad])
    assert "must be a share in (0, 1]" in capsys.readouterr().err
