"""What Urza knows about an artifact beyond its descriptor: status history, tags, lineage.

Plain frozen dataclasses: they stay inside Urza and its CLI (``esper registry show``), so they
are not Leyline messages; ``to_dict`` gives their JSON form.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from esper_core.contracts import ArtifactStatus, KernelArtifact

_TAG_RE = re.compile(r"^[a-z0-9][a-z0-9_.:\-]{0,63}$")
COMPILE_RUN_STATES = ("running", "finished", "failed")


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """Validate tags and return them sorted and de-duplicated.

    Raises:
        ValueError: A tag is not 1-64 characters of ``a-z 0-9 _ . : -`` starting alphanumeric.
    """
    checked = sorted(set(tags))
    bad = [t for t in checked if not isinstance(t, str) or not _TAG_RE.match(t)]
    if bad:
        raise ValueError(
            f"invalid tag(s) {bad}: a tag is 1-64 characters of a-z, 0-9, '_', '.', ':' or '-' "
            "starting with a letter or digit, e.g. 'approved' or 'baseline:2026-05'"
        )
    return tuple(checked)


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusChange:
    """One entry of an artifact's status history.

    Attributes:
        status: The status entered.
        reason: Why (never empty).
        actor: Who or what changed it (``tezzeret``, ``cli:<user>``, ...).
        changed_at: When (UTC).
    """

    status: ArtifactStatus
    reason: str
    actor: str
    changed_at: dt.datetime

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "status": self.status.value,
            "reason": self.reason,
            "actor": self.actor,
            "changed_at": self.changed_at.isoformat(),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileRun:
    """A Tezzeret compile run, the lineage of the artifacts it published.

    Attributes:
        run_id: Unique id (a Prefect flow run id, or a random hex id).
        compiler: The environment key's compiler (e.g. ``torch.export``, ``aot_inductor``).
        torch_version: Torch version compiled with.
        device_kind: ``cpu`` or ``cuda``.
        hostname: Machine it ran on.
        detail: Free-form facts (recipe, blueprints, counts).
        state: ``running``, ``finished`` or ``failed``.
        started_at: Start (UTC); set by the registry.
        finished_at: End (UTC), once finished or failed.
    """

    run_id: str
    compiler: str
    torch_version: str
    device_kind: str
    hostname: str
    detail: dict[str, Any] = field(default_factory=dict)
    state: str = "running"
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        if not self.run_id or len(self.run_id) > 64:
            raise ValueError(f"compile run id must be 1-64 characters, got {self.run_id!r}")
        if self.state not in COMPILE_RUN_STATES:
            raise ValueError(f"compile run state must be one of {COMPILE_RUN_STATES}, got {self.state!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "run_id": self.run_id,
            "state": self.state,
            "compiler": self.compiler,
            "torch_version": self.torch_version,
            "device_kind": self.device_kind,
            "hostname": self.hostname,
            "detail": self.detail,
            "started_at": None if self.started_at is None else self.started_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ArtifactRecord:
    """An artifact with everything the registry holds about it.

    Attributes:
        artifact: The descriptor (current status included).
        tags: Sorted tags.
        compile_run: The run that first published it, if recorded.
        history: Status changes, oldest first (the first is its publication).
    """

    artifact: KernelArtifact
    tags: tuple[str, ...]
    compile_run: CompileRun | None
    history: tuple[StatusChange, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "artifact": self.artifact.model_dump(mode="json"),
            "tags": list(self.tags),
            "compile_run": None if self.compile_run is None else self.compile_run.to_dict(),
            "history": [change.to_dict() for change in self.history],
        }
