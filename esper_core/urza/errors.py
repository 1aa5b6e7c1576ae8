"""Urza's domain errors. SQL and filesystem errors are translated to these at Urza's boundary."""

from __future__ import annotations

from pathlib import Path

COMPILE_HINT = "run `esper catalog compile {blueprint_id}` to publish it"


class RegistryError(Exception):
    """Base of every Urza error; also what database failures are translated to."""


class RegistryUnavailableError(RegistryError):
    """The database could not be reached or dropped the connection (an outage, not a bad request)."""


class RegistryConflictError(RegistryError):
    """A concurrent writer changed the same rows first (a unique or foreign-key conflict)."""


class ArtifactNotFoundError(RegistryError, LookupError):
    """No artifact matches the request."""

    @classmethod
    def for_id(cls, artifact_id: int, where: str) -> ArtifactNotFoundError:
        """No artifact row with ``artifact_id``."""
        return cls(
            f"no artifact with id {artifact_id} in {where}: list the published artifacts with "
            "`esper registry list`, or publish the blueprint with "
            "`esper catalog compile <blueprint>`"
        )

    @classmethod
    def for_key(cls, blueprint_id: str, shape_profile: str, environment: str, where: str) -> ArtifactNotFoundError:
        """No active artifact for a (blueprint, profile, environment)."""
        return cls(
            f"no active artifact of blueprint {blueprint_id!r} for profile {shape_profile} "
            f"on {environment} in {where}: " + COMPILE_HINT.format(blueprint_id=blueprint_id)
        )


class UnknownBlueprintInRegistryError(RegistryError, LookupError):
    """An artifact names a blueprint that was never registered."""

    def __init__(self, blueprint_id: str, where: str) -> None:
        super().__init__(
            f"blueprint {blueprint_id!r} is not registered in {where}: register its Karn "
            "descriptor first (Urza.register_blueprint), or " + COMPILE_HINT.format(blueprint_id=blueprint_id)
        )
        self.blueprint_id = blueprint_id


class CorruptBlobError(RegistryError):
    """A stored blob's content no longer matches its SHA-256."""

    def __init__(self, path: Path, expected: str, actual: str) -> None:
        super().__init__(
            f"blob {path} is corrupt: expected sha256 {expected}, found {actual}; delete the "
            "file and re-publish the artifact (e.g. `esper catalog compile <blueprint>`)"
        )
        self.path = path
        self.expected = expected
        self.actual = actual


class MissingBlobError(RegistryError):
    """A registered artifact's blob is not in the blob store."""

    def __init__(self, sha256: str, path: Path) -> None:
        super().__init__(
            f"blob {sha256} is missing (expected at {path}): restore the artifact store, or "
            "re-publish the artifact (e.g. `esper catalog compile <blueprint>`)"
        )
        self.sha256 = sha256
        self.path = path


class InvalidStatusTransitionError(RegistryError, ValueError):
    """A status change the registry does not allow (e.g. out of RETIRED, or a high-risk to ACTIVE)."""


class CompileRunNotFoundError(RegistryError, LookupError):
    """No compile run with that id."""

    def __init__(self, run_id: str, where: str) -> None:
        super().__init__(
            f"no compile run {run_id!r} in {where}: start it with Urza.start_compile_run before "
            "publishing artifacts that name it"
        )
        self.run_id = run_id


RESIGN_HINT = "run `esper registry resign` with the registry's signing key (see ESPER_SIGNING_KEY)"


class UnsignedArtifactError(RegistryError):
    """An artifact row carries no signature (published before signing, or written around Urza)."""

    def __init__(
        self, artifact_id: int | None, blueprint_id: str, *, republish: str = "`esper catalog compile <blueprint>`"
    ) -> None:
        what = blueprint_id if artifact_id is None else f"artifact {artifact_id} ({blueprint_id})"
        super().__init__(
            f"{what} is not signed, so it is not loaded: if you trust the "
            f"registry's current contents, {RESIGN_HINT}; otherwise re-publish it ({republish})"
        )
        self.artifact_id = artifact_id


class ArtifactSignatureError(RegistryError):
    """An artifact's signature does not verify: its bytes or descriptor changed, or its key is unknown."""

    def __init__(self, artifact_id: int | None, blueprint_id: str, why: str) -> None:
        what = blueprint_id if artifact_id is None else f"artifact {artifact_id} ({blueprint_id})"
        super().__init__(f"{what} is refused before loading: {why}")
        self.artifact_id = artifact_id
