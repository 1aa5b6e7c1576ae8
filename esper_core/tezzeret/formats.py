"""Blob formats of kernel artifacts, shared by Tezzeret (writer) and Kasmina's loader (reader).

``ArtifactKind.EXPORTED`` blobs are ``torch.export.save`` archives. ``ArtifactKind.EAGER`` blobs
(the fallback) are a ``torch.save`` of a small dict tagged ``EAGER_FORMAT`` holding the weights;
the reader rebuilds the module from Karn and loads them. Both encoders are deterministic: the
same module gives the same bytes, so the blob's SHA-256 identifies the artifact.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram

EAGER_FORMAT = "esper-eager-v1"
_EAGER_KEYS = frozenset({"format", "blueprint_id", "params", "profile", "state_dict"})


@dataclass(frozen=True, kw_only=True, slots=True)
class EagerPayload:
    """Decoded content of an eager (fallback) blob.

    Attributes:
        blueprint_id: The Karn blueprint to rebuild.
        params: Its resolved parameters.
        profile: The shape profile name the module was built for.
        state_dict: The weights (CPU tensors).
    """

    blueprint_id: str
    params: dict[str, float]
    profile: str
    state_dict: dict[str, torch.Tensor]


def encode_exported(program: ExportedProgram) -> bytes:
    """Serialise an exported program to bytes (``torch.export.save``)."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def decode_exported(blob: bytes) -> ExportedProgram:
    """Inverse of ``encode_exported``."""
    return torch.export.load(io.BytesIO(blob))


def encode_eager(
    *,
    blueprint_id: str,
    params: Mapping[str, float],
    profile: str,
    state_dict: Mapping[str, torch.Tensor],
) -> bytes:
    """Serialise an eager fallback: enough to rebuild the module from Karn and load its weights.

    Args:
        blueprint_id: The Karn blueprint.
        params: Its resolved parameters.
        profile: The shape profile name.
        state_dict: The module's weights; copied to CPU so the blob is device-independent.

    Returns:
        The blob bytes.
    """
    payload = {
        "format": EAGER_FORMAT,
        "blueprint_id": blueprint_id,
        "params": {k: float(v) for k, v in sorted(params.items())},
        "profile": profile,
        "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()},
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def decode_eager(blob: bytes) -> EagerPayload:
    """Inverse of ``encode_eager``; loads with ``weights_only=True`` (no code runs).

    Raises:
        ValueError: The blob is not an ``esper-eager-v1`` payload.
    """
    payload = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != EAGER_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"eager artifact blob has format {found!r}, expected {EAGER_FORMAT!r}: it was written "
            "by another tool or Esper version; recompile the blueprint with Tezzeret and republish"
        )
    missing = sorted(_EAGER_KEYS - set(payload))
    if missing:
        raise ValueError(f"eager artifact blob lacks {missing}: the blob is damaged; recompile and republish it")
    return EagerPayload(
        blueprint_id=str(payload["blueprint_id"]),
        params={str(k): float(v) for k, v in payload["params"].items()},
        profile=str(payload["profile"]),
        state_dict=dict(payload["state_dict"]),
    )
