"""bench/chars_lr.py: finished runs are read back from their telemetry, unfinished ones are not,
and evaluation seeds cannot be used to choose a rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.chars_lr import _finished, main


def _telemetry(run_dir: Path, losses: list[float]) -> None:
    run_dir.mkdir(parents=True)
    packets = [
        {"source": "tolaria", "metrics": [{"name": "tolaria.validation.loss", "value": v},
                                          {"name": "tolaria.epoch.latency_ms", "value": 1500.0}]}
        for v in losses
    ] + [{"source": "tamiyo", "metrics": [{"name": "tamiyo.decision.latency_ms", "value": 1.0}]}]  # fmt: skip
    (run_dir / "telemetry.jsonl").write_text("".join(json.dumps(p) + "\n" for p in packets))


def test_a_finished_run_is_read_back_and_an_unfinished_one_is_not(tmp_path: Path) -> None:
    _telemetry(tmp_path / "done", [2.0, 1.9, 1.8])
    assert _finished(tmp_path / "done", 3) == {"val_loss": 1.8, "train_s": 4.5, "reused": True}
    assert _finished(tmp_path / "done", 4) is None  # stopped early: trained again
    assert _finished(tmp_path / "absent", 3) is None


def test_evaluation_seeds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["chars_lr", "--seeds", "0"])
    with pytest.raises(SystemExit):
        main()
