"""``run.json``: a run folder's record of the request it was started with, read as plain JSON.

``RunSpec.load`` turns it back into a request to resume; ``esper runs list`` reads it to say what
each run is, and must not import the run layer (torch, the recipes, the planner) for that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC_FILE = "run.json"
"""A run folder's record of what the run was started with (``RunSpec.save``)."""
SPEC_VERSION = 5
"""``run.json``'s format: 5 adds ``grow_until`` (and the risk engine's thresholds to ``decides``):
an Esper of version 4 would resume such a run growing past its window, so it refuses; 4 adds
``max_flops`` (an Esper of version 3 would resume such a run without its cap, so it refuses); 3
adds ``policy`` and ``max_params`` (and the resolved ``decides``, not read back), so an older
Esper refuses to resume a run it would decide differently; 2 is ``RunSpec``'s own fields before
them; 1 (no version key, before 2026-11-27) held recipe, epochs, device and seed as a hand-built
dict. All still load. ``total_epochs`` (the epochs the run trains, its recipe's when ``epochs``
is None; not read back) was added within version 3."""


def read_spec_file(run_dir: Path) -> dict[str, Any]:
    """The fields of ``run_dir/run.json`` (any version this Esper reads), without ``version``.

    Raises:
        ValueError: no ``run.json`` there, or a newer format.
    """
    path = run_dir / SPEC_FILE
    if not path.exists():
        raise ValueError(f"no run {run_dir.name!r} under {run_dir.parent}; list runs with `ls {run_dir.parent}`")
    saved: dict[str, Any] = json.loads(path.read_text())
    version = saved.pop("version", 1)
    if version > SPEC_VERSION:
        raise ValueError(
            f"{path} is run.json version {version}, newer than this Esper reads ({SPEC_VERSION}): upgrade Esper"
        )
    return saved
