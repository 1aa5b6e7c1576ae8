"""The width bench's command line: pooling runs refuses overlapping seeds (the study's arms are
tested in ``tests/studies/test_width.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.width import main


def test_combining_runs_refuses_overlapping_seeds(tmp_path: Path) -> None:
    part = {"config": {"first_seed": 1, "seeds": 2, "factor": 1.5}, "runs": {}}
    paths = []
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(part))
        paths.append(str(tmp_path / name))
    with pytest.raises(ValueError, match="disjoint seeds"):
        main(["--combine", *paths])
