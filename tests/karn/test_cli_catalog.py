"""``esper catalog list|show``: every blueprint, its tier policy and profiles; clear errors."""

from __future__ import annotations

import json

import pytest

from esper_cli.main import main
from esper_core.karn.entries import default_catalog


def test_list_table_and_filters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "list"]) == 0
    out = capsys.readouterr().out
    for blueprint_id in default_catalog().ids:
        assert blueprint_id in out
    assert main(["catalog", "list", "--host-kind", "cnn", "--tier", "safe", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["blueprint_id"] for r in rows] == ["conv_residual", "depthwise_separable", "pointwise_adapter"]


def test_show_prints_policy_profiles_and_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "show", "spatial_attention"]) == 0
    out = capsys.readouterr().out
    assert "tier         experimental (compiled and germinated only with an explicit approval" in out
    assert "profiles     (C, H, W) maps, C >= 2, H*W <= 1024" in out
    assert "param        key_dim: integer in [4, 64], default 16" in out
    assert main(["catalog", "show", "wide_conv", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["tier"] == "high_risk" and shown["profiles"].startswith("(C, H, W) maps")


def test_unknown_blueprint_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "show", "resnet9000"]) == 2
    err = capsys.readouterr().err
    assert "unknown blueprint 'resnet9000'" in err and "residual_mlp" in err


def test_seq_kind_and_what_each_blueprint_adds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "list", "--host-kind", "seq", "--tier", "safe", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["blueprint_id"] for r in rows] == [
        "seq_conv_residual",
        "seq_depthwise_separable",
        "seq_pointwise_adapter",
    ]
    for row in rows:
        capacity = row["capacity"]
        assert capacity["profile"] == "f8x40-b512" and not capacity["linear"]
        assert capacity["parameters"] > 0 and capacity["flops_per_sample"] > 0
    assert main(["catalog", "show", "lowrank_adapter", "--profile", "f128-b64"]) == 0
    out = capsys.readouterr().out
    assert "version      2" in out
    # W -> 4 -> W at W = 128: 128*4 + 4*128 + 128 parameters, 2 FLOPs per multiply-add.
    assert "adds         1152 parameters, 2048 FLOPs/sample at f128-b64; non-linear" in out


def test_show_refuses_a_profile_the_blueprint_does_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "show", "seq_attention", "--profile", "f64-b8"]) == 2
    assert "(C, L) sequences" in capsys.readouterr().err
    assert main(["catalog", "show", "seq_attention", "--profile", "8x40"]) == 2
    assert "is not a shape profile name" in capsys.readouterr().err
