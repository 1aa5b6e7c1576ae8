"""Policies that ship with Esper: trained weights in the package, pinned by SHA-256 here.

A shipped policy is two files in ``esper_core/tamiyo/policies/``: ``<name>.pt`` (the GNN's
``state_dict``, written by ``torch.save``) and ``<name>.json`` (its provenance: the commit it was
trained at, the zoo, the seeds, the selection results, the command). The weights' SHA-256 is
pinned in ``SHIPPED`` below, in code, so that a package whose weights were swapped or damaged is
refused before a byte is unpickled. A release cannot carry a signature (the signing key is each
installation's own secret), so the digest is the release's promise, and ``esper_core.simic.
shipping`` signs the weights with this installation's key at first use, after the digest check.

Re-shipping a better training is one command (``python -m bench.ship_policy --from <training>``):
it writes both files and prints the line to pin here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICY_DIR = Path(__file__).resolve().parent / "policies"
"""Where the shipped policies' files live (package data, see ``pyproject.toml``)."""

SHIPPED: dict[str, str] = {
    "zoo-1": "d7deacfd10ca1a029e20a3339b0bde6b165349e3eb60627be0e2039d95570727",
}
"""Shipped policy name -> SHA-256 of its ``<name>.pt``: the digest the release promises."""

DEFAULT_SHIPPED = "zoo-1"
"""The shipped policy a run serves unless it names another (``TamiyoConfig.shipped``)."""

REFUSED_FIX = (
    "reinstall Esper (pip install --force-reinstall) to restore the released file, "
    "or run with another policy (esper run --policy heuristic)"
)


class ShippedPolicyError(ValueError):
    """A shipped policy that cannot be served: unknown, missing, or not the released bytes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShippedPolicy:
    """A shipped policy whose weights matched their pinned digest when read.

    Attributes:
        name: Its name (a key of ``SHIPPED``).
        sha256: The digest of ``weights`` (equal to the pinned one).
        weights: The bytes of ``<name>.pt``.
        provenance: ``<name>.json``: how it was trained and chosen.
    """

    name: str
    sha256: str
    weights: bytes = field(repr=False)
    provenance: dict[str, Any]

    @property
    def gnn(self) -> dict[str, Any]:
        """The network size it was trained with (``TamiyoGNNConfig`` fields)."""
        return dict(self.provenance["gnn"])


def check_name(name: str) -> None:
    """Refuse a name that is not a shipped policy, listing the shipped ones."""
    if name not in SHIPPED:
        raise ShippedPolicyError(f"no shipped policy {name!r}; shipped: {', '.join(sorted(SHIPPED))}")


def provenance(name: str, *, directory: Path | None = None) -> dict[str, Any]:
    """``<name>.json`` (not digest-checked: a description, never served).

    Raises:
        ShippedPolicyError: Not a shipped name, or its provenance file is missing.
    """
    check_name(name)
    path = (directory or POLICY_DIR) / f"{name}.json"
    if not path.exists():
        raise ShippedPolicyError(f"shipped policy {name!r} has no provenance file {path}: {REFUSED_FIX}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def read_shipped(name: str, *, directory: Path | None = None) -> ShippedPolicy:
    """The shipped policy ``name``, its weights checked against the digest pinned in ``SHIPPED``.

    Args:
        name: A key of ``SHIPPED``.
        directory: Where its files are (default: the package's ``POLICY_DIR``).

    Raises:
        ShippedPolicyError: Unknown name, a missing file, or weights whose SHA-256 is not the
            pinned one (the message names both digests and the fix).
    """
    check_name(name)
    path = (directory or POLICY_DIR) / f"{name}.pt"
    if not path.exists():
        raise ShippedPolicyError(f"shipped policy {name!r} has no weights file {path}: {REFUSED_FIX}")
    weights = path.read_bytes()
    digest = hashlib.sha256(weights).hexdigest()
    if digest != SHIPPED[name]:
        raise ShippedPolicyError(
            f"shipped policy {name!r}: {path} has SHA-256 {digest}, but this Esper pins {SHIPPED[name]}; "
            f"refusing to serve weights that are not the released ones: {REFUSED_FIX}"
        )
    return ShippedPolicy(name=name, sha256=digest, weights=weights, provenance=provenance(name, directory=directory))
