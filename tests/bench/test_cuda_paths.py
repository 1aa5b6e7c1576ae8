"""The GPU lease's bench: refused at once without CUDA; on CUDA each case leaves a baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.cuda_paths import cases, main, measure
from tests.helpers.runif import requires_cuda


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_refuses_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "sees no CUDA device: run this on a GPU machine" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_recipe_gets_eager_and_graphs_and_the_cnn_the_slow_paths() -> None:
    assert cases(("digits-mlp", "mnist1d-cnn")) == [
        ("digits-mlp", "eager"),
        ("digits-mlp", "graphs"),
        ("mnist1d-cnn", "eager"),
        ("mnist1d-cnn", "graphs"),
        ("mnist1d-cnn", "compiled"),
        ("mnist1d-cnn", "fp32"),
    ]


@requires_cuda("the training bench on CUDA graph replays")
def test_a_case_saves_a_baseline_with_its_config(tmp_path: Path) -> None:
    headline = measure("seed-reference", "graphs", epochs=5, out=tmp_path)
    assert headline["chosen_path"] == "eager + CUDA graph"
    saved = json.loads((tmp_path / "seed-reference-graphs.json").read_text())
    assert saved["extra"]["config"]["cuda_graphs"] is True
