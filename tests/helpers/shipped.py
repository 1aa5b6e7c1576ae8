"""A shipped policy made in a test's folder, and a child process that meets the real one first."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import multiprocessing
from pathlib import Path

import pytest
import torch

from esper_core.tamiyo import shipped
from esper_core.tamiyo.graph import FEATURE_DIMS, FEATURE_NAMES
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNNConfig, untrained_policy


def make_shipped(directory: Path, monkeypatch: pytest.MonkeyPatch, *, name: str = "zoo-1") -> str:
    """Write an (untrained) shipped policy ``name`` into ``directory``, pin it, serve from there.

    Returns:
        Its SHA-256.
    """
    gnn = TamiyoGNNConfig()
    buffer = io.BytesIO()
    torch.save(untrained_policy(gnn).state_dict(), buffer)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pt").write_bytes(buffer.getvalue())
    record = {
        "name": name,
        "commit": "test",
        "gnn": dataclasses.asdict(gnn),
        "policy_format": POLICY_FORMAT,
        "feature_dims": FEATURE_DIMS,
        "graph_features": {nt: list(names) for nt, names in FEATURE_NAMES.items()},
        "selection": {"chosen": {"label": "v1", "score": 0.5}},
    }
    (directory / f"{name}.json").write_text(json.dumps(record))
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    monkeypatch.setattr(shipped, "POLICY_DIR", directory)
    monkeypatch.setitem(shipped.SHIPPED, name, digest)
    return digest


def publish_in_child(home: str, start: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:
    """Meet the package's shipped policy first, in a process of its own, at the same moment as another."""
    from esper_core.simic.records import SimicStore
    from esper_core.simic.shipping import publish_shipped

    store = SimicStore.open(Path(home))
    try:
        start.wait(timeout=120)
        out.put(publish_shipped(store, shipped.DEFAULT_SHIPPED).version)
    finally:
        store.close()
