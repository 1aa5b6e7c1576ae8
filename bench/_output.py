"""Where a benchmark script's result goes: a JSON file, written whole (folders made as needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_json(result: Any, path: Path | None) -> str:  # noqa: ANN401 - any JSON-able result
    """``result`` as indented JSON text, also written to ``path`` when one is given."""
    text = json.dumps(result, indent=2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text
