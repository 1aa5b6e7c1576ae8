"""Growth events under CUDA graphs (the GPU lease's bench): refused at once without CUDA; its
plumbing runs on the CPU (nothing captures there); on CUDA, one capture per structure change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.cuda_growth import case_config, main, measure
from tests.helpers.runif import requires_cuda


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_refuses_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "sees no CUDA device: run this on a GPU machine (or --device cpu --quick)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_each_case_grows_and_only_the_graphed_run_asks_for_graphs() -> None:
    width = case_config("width", device="cpu", quick=True, graphs=True)
    assert width.trainer.step.enable_graphs and width.trainer.step.compile == "off"
    assert [g.slot for g in width.tamiyo.schedule] == ["conv1+width", "conv3+width"]
    depth = case_config("depth", device="cpu", quick=True, graphs=False)
    assert not depth.trainer.step.enable_graphs
    assert [(g.epoch, g.blueprint) for g in depth.tamiyo.schedule] == [(1, "depth-stack-all")]
    with pytest.raises(ValueError, match="unknown case 'heads'"):
        case_config("heads", device="cpu", quick=True, graphs=False)


def test_on_the_cpu_the_graphed_run_trains_as_the_eager_one_and_captures_nothing(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--cases", "width"]) == 0
    (result,) = json.loads((tmp_path / "cuda_growth.json").read_text())["cases"]
    assert result["structure_changes"] >= 2  # germinated (TRAINING), then blending: each a change
    assert result["captures"] == result["captures_expected"] == 0
    assert [r["val_loss"] for r in result["graphed"]] == [r["val_loss"] for r in result["eager"]]


@requires_cuda("CUDA graph captures across a width seed's lifecycle")
def test_a_growing_run_recaptures_once_per_structure_change_and_never_per_epoch(tmp_path: Path) -> None:
    result = measure("width", device="cuda", quick=True, home=tmp_path)
    assert result["structure_changes"] >= 2
    assert result["captures"] == 1 + result["structure_changes"]
    for row in result["graphed"][1:]:
        assert row["captures"] == int(row["structure_changed"]), row
