"""Blob formats of kernel artifacts, shared by Tezzeret (writer) and Kasmina's loader (reader).

- ``ArtifactKind.EXPORTED`` with the ``torch.export`` compiler: a ``torch.export.save`` archive.
- ``ArtifactKind.EXPORTED`` with the ``aot_inductor`` compiler: a bundle (``BUNDLE_FORMAT``), a
  zip holding the exported program (the trainable seed), the AOTInductor package (a
  forward-only inference kernel) when it compiled, the Inductor mega-cache when it did not, and
  a manifest.
- ``ArtifactKind.EAGER`` (the fallback): a ``torch.save`` of a small dict tagged
  ``EAGER_FORMAT`` holding the weights; the reader rebuilds the module from Karn and loads them.

The exported and eager encoders are deterministic: the same module gives the same bytes, so the
blob's SHA-256 identifies the artifact. An AOTInductor package is not byte-stable across
compiles (it embeds a shared library), so each compile of a bundle is a new version; the
registry's compile cache keeps that from happening twice for one key.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram

EAGER_FORMAT = "esper-eager-v1"
BUNDLE_FORMAT = "esper-aoti-bundle-v1"
_EAGER_KEYS = frozenset({"format", "blueprint_id", "params", "profile", "state_dict"})
_MEMBERS = {"program": "program.pt2", "aoti": "aoti.pt2", "inductor_cache": "inductor-cache.bin"}
# Fixed member timestamps keep the zip's bytes a function of its content.
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class BundlePayload:
    """Decoded content of an ``aot_inductor`` bundle.

    Attributes:
        program: ``torch.export.save`` bytes of the exported program (what Kasmina trains).
        aoti: AOTInductor package bytes (forward-only inference kernel), if it compiled.
        inductor_cache: ``torch.compiler.save_cache_artifacts`` bytes, when AOTInductor did not
            work and Tezzeret compiled the program with Inductor instead.
        aoti_error: Why there is no AOTInductor package, if there is none.
    """

    program: bytes
    aoti: bytes | None = None
    inductor_cache: bytes | None = None
    aoti_error: str | None = None


def encode_bundle(payload: BundlePayload) -> bytes:
    """Serialise a bundle (zip of the members present plus ``manifest.json``)."""
    manifest = {
        "format": BUNDLE_FORMAT,
        "aoti_error": payload.aoti_error,
        **{field: (_MEMBERS[field] if getattr(payload, field) is not None else None) for field in _MEMBERS},
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(zipfile.ZipInfo("manifest.json", _ZIP_TIME), json.dumps(manifest, sort_keys=True))
        for field, member in _MEMBERS.items():
            data = getattr(payload, field)
            if data is not None:
                archive.writestr(zipfile.ZipInfo(member, _ZIP_TIME), data)
    return buffer.getvalue()


def decode_bundle(blob: bytes) -> BundlePayload:
    """Inverse of ``encode_bundle``.

    Raises:
        ValueError: The blob is not an ``esper-aoti-bundle-v1`` bundle, or lacks a member.
    """
    fix = "recompile the blueprint with Tezzeret (`esper catalog compile --backend aot_inductor`) and republish"
    if not zipfile.is_zipfile(io.BytesIO(blob)):
        raise ValueError(f"artifact blob is not an {BUNDLE_FORMAT} bundle (not a zip archive): {fix}")
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json")) if "manifest.json" in names else {}
        if manifest.get("format") != BUNDLE_FORMAT:
            raise ValueError(
                f"artifact bundle has format {manifest.get('format')!r}, expected {BUNDLE_FORMAT!r}: {fix}"
            )
        members: dict[str, bytes | None] = {}
        for field in _MEMBERS:
            member = manifest.get(field)
            if member is not None and member not in names:
                raise ValueError(f"artifact bundle lists {member} but lacks it: the blob is damaged; {fix}")
            members[field] = None if member is None else archive.read(member)
    if members["program"] is None:
        raise ValueError(f"artifact bundle holds no exported program: {fix}")
    return BundlePayload(
        program=members["program"],
        aoti=members["aoti"],
        inductor_cache=members["inductor_cache"],
        aoti_error=manifest.get("aoti_error"),
    )
