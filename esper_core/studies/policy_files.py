"""A trained policy version as two small files a person can commit, and back into a registry.

A zoo training publishes its versions in the registry of the home it ran in, which is usually
a temporary one; ``save_policy_version`` copies the chosen version out as

- ``weights.pt``: its ``state_dict`` (``torch.save``, tensors only);
- ``policy.json``: the SHA-256 of ``weights.pt``, the GNN's size, the graph's feature widths,
  the version's provenance (format, features, zoo, seeds) and whatever the caller adds (the
  selection scores, the command, the commit),

and ``publish_policy_file`` publishes such a pair into another registry as a new version, after
checking the digest, so that a benchmark can serve it (``TamiyoConfig.policy_version``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.tamiyo.graph import FEATURE_DIMS
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNNConfig

WEIGHTS = "weights.pt"
DESCRIPTOR = "policy.json"


def save_policy_version(
    settings: EsperSettings, version: int, directory: Path, *, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """Write version ``version`` of ``settings``' registry to ``directory`` (made as needed).

    Returns:
        The descriptor written to ``policy.json``.
    """
    store = SimicStore.open(settings.home, settings.registry_db_url)
    try:
        policy = store.get_policy(version)
        weights = store.load_weights(policy)
    finally:
        store.close()
    buffer = io.BytesIO()
    torch.save(weights, buffer)
    data = buffer.getvalue()
    descriptor = {
        "weights": WEIGHTS,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "source_version": policy.version,
        "method": policy.method,
        "gnn": dataclasses.asdict(policy.gnn),
        "feature_dims": policy.feature_dims,
        "provenance": policy.provenance,
        **extra,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / WEIGHTS).write_bytes(data)
    (directory / DESCRIPTOR).write_text(json.dumps(descriptor, indent=2, default=str) + "\n")
    return descriptor


def read_policy_file(directory: Path) -> tuple[bytes, dict[str, Any]]:
    """The weights' bytes and the descriptor of the policy saved in ``directory``, digest-checked.

    Raises:
        FileNotFoundError: ``directory`` lacks ``weights.pt`` or ``policy.json``.
        ValueError: The weights' SHA-256 is not the descriptor's (the file changed after saving),
            or they were trained on graph inputs of another format or width than this code builds.
    """
    for name in (WEIGHTS, DESCRIPTOR):
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"{directory / name} is missing: point at a folder `python -m bench.zoo_policy --save DIR` wrote"
            )
    data = (directory / WEIGHTS).read_bytes()
    descriptor = json.loads((directory / DESCRIPTOR).read_text())
    if (digest := hashlib.sha256(data).hexdigest()) != descriptor["sha256"]:
        raise ValueError(
            f"{directory / WEIGHTS} has SHA-256 {digest}, its descriptor says {descriptor['sha256']}: "
            "the weights changed after they were saved; save them again from their training"
        )
    stored = (descriptor["provenance"].get("policy_format", 1), descriptor["feature_dims"])
    if stored != (POLICY_FORMAT, FEATURE_DIMS):
        raise ValueError(
            f"{directory} holds a policy of format {stored[0]} with feature widths {stored[1]}; this code serves "
            f"format {POLICY_FORMAT} with {FEATURE_DIMS}: retrain it (python -m bench.zoo_policy --save ...)"
        )
    return data, descriptor


def publish_policy_file(settings: EsperSettings, directory: Path) -> int:
    """Publish the policy saved in ``directory`` into ``settings``' registry; its version there.

    Raises:
        FileNotFoundError, ValueError: as ``read_policy_file``.
    """
    data, descriptor = read_policy_file(directory)
    weights = torch.load(io.BytesIO(data), weights_only=True)
    # The stored provenance (format and feature names) travels as is, so serving still refuses
    # weights trained on other graph inputs.
    provenance = {**descriptor["provenance"], "imported_from": str(directory), "sha256_file": descriptor["sha256"]}
    store = SimicStore.open(settings.home, settings.registry_db_url)
    try:
        return store.publish_policy(
            weights, gnn=TamiyoGNNConfig(**descriptor["gnn"]), method="imported", provenance=provenance
        ).version
    finally:
        store.close()


__all__ = ["DESCRIPTOR", "WEIGHTS", "publish_policy_file", "read_policy_file", "save_policy_version"]
