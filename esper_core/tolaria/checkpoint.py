"""Committed training state on disk: one file per tag with its digest, written atomically, plus a LATEST pointer.

A retried Prefect task restores the last committed tag, so nothing half-done is ever read back.
Every commit records the SHA-256 and size of its file (``<tag>.json``), and every load checks
them first: a damaged checkpoint raises ``CheckpointCorruptError`` instead of handing the run
weights nobody wrote. Checkpoints written before digests were recorded carry none; they load
only after their zip container's CRC-32 of every entry checks out and they unpickle completely,
with a warning that that is all that was verified.
Only a few commits stay on disk (``CheckpointConfig``): the last ``keep_last`` and the best one;
a 200-epoch run of a large model would otherwise keep hundreds of full copies of its weights.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import pickle
import zipfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

DAMAGED_DIR = "damaged"
"""Subfolder of a run's checkpoints where damaged files are kept aside (never deleted)."""


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Which committed checkpoints a run keeps on disk.

    Every step commits a checkpoint (that is what makes retries exact); only the last
    ``keep_last`` and, with ``keep_best``, the one after the epoch of the best validation loss
    stay on disk. The one ``LATEST`` points to is never deleted, nor a file being written.
    """

    keep_last: int = 3
    """Most recent commits kept. At least 2: resuming a run whose last commit is a trained but
    not yet applied epoch goes back to the commit before it."""
    keep_best: bool = True
    """Also keep the commit after the epoch with the lowest validation loss."""

    def __post_init__(self) -> None:
        if self.keep_last < 2:
            raise ValueError(
                f"keep_last must be >= 2 (a resume may go back one commit before the latest), got {self.keep_last}"
            )


def retained(
    tags: Collection[str], *, latest: str | None, best: str | None, keep_last: int, order: Callable[[str], int]
) -> set[str]:
    """The tags to keep: the ``keep_last`` newest by ``order``, LATEST, and ``best``."""
    newest = sorted(tags, key=order)[-keep_last:]
    return {*newest, *(t for t in (latest, best) if t is not None)}


class CheckpointNotFoundError(FileNotFoundError):
    """No committed checkpoint under the requested tag."""


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's bytes are not those its commit wrote (or, without a digest, do not read back).

    Not a ``ValueError``: a step that meets one must not take it for a rejected command.
    """

    def __init__(self, *, tag: str, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {tag!r} at {path} is damaged: {problem}")
        self.tag = tag
        self.path = path
        self.problem = problem


class CheckpointWriteError(OSError):
    """A commit could not be written; nothing of it is visible and the previous commit stands."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointCheck:
    """What verifying one checkpoint found."""

    tag: str
    path: Path
    status: Literal["intact", "unverified", "damaged"]
    """``intact``: SHA-256 and size match the commit's record. ``unverified``: written before
    digests were recorded; its zip CRC-32s check out and it unpickles, which is all that can be
    checked. ``damaged``: it must not be loaded."""
    problem: str = ""


class CheckpointStore:
    """Checkpoints of one run under ``root``."""

    def __init__(self, root: Path, retention: CheckpointConfig | None = None) -> None:
        """``retention``: which commits to keep when ``prune`` runs; None keeps every one."""
        self.root = root
        self.retention = retention
        root.mkdir(parents=True, exist_ok=True)

    def tags(self) -> list[str]:
        """Tags of the checkpoints on disk (complete files only; never one being written)."""
        return [p.stem for p in self.root.glob("*.pt")]

    def prune(self, *, best: str | None, order: Callable[[str], int]) -> list[str]:
        """Delete the checkpoints the retention policy does not keep.

        It runs right after a commit, so LATEST (always kept) is a file just written and
        fsynced, and ``keep_last >= 2`` keeps another beside it: one damaged file never leaves a
        run without an intact commit.

        Args:
            best: The tag of the best commit so far (kept when ``keep_best``).
            order: Sort key of tags in commit order.

        Returns:
            The deleted tags.
        """
        if self.retention is None:
            return []
        tags = self.tags()
        keep = retained(
            tags,
            latest=self.latest(),
            best=best if self.retention.keep_best else None,
            keep_last=self.retention.keep_last,
            order=order,
        )
        dropped = sorted(set(tags) - keep, key=order)
        for tag in dropped:
            self.path(tag).unlink(missing_ok=True)
            self.digest_path(tag).unlink(missing_ok=True)
        return dropped

    def size_bytes(self) -> int:
        """Bytes of the checkpoints on disk."""
        return sum(p.stat().st_size for p in self.root.glob("*.pt"))

    def path(self, tag: str) -> Path:
        """File of checkpoint ``tag``."""
        return self.root / f"{tag}.pt"

    def digest_path(self, tag: str) -> Path:
        """The record of checkpoint ``tag``'s SHA-256 and size."""
        return self.root / f"{tag}.json"

    def save(self, tag: str, state: dict[str, Any]) -> bytes:
        """Write ``state`` under ``tag`` with its digest, atomically, then point LATEST at it.

        The checkpoint, its digest and the new LATEST are written in full (and fsynced) to
        temporary names before any is renamed into place: a full disk fails there, and the
        previous commit stays exactly as it was.

        Returns:
            The serialised checkpoint (the fast rollback tier keeps it in memory).

        Raises:
            CheckpointWriteError: the files could not be written (a full disk, say).
        """
        import torch  # see _unpickle

        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        self.write(tag, data)
        return data

    def write(self, tag: str, data: bytes) -> None:
        """Commit the serialised checkpoint ``data`` under ``tag`` (``save`` without serialising).

        Raises:
            CheckpointWriteError: the files could not be written (a full disk, say).
        """
        # The bytes are in memory already: hashing them costs milliseconds, and nothing is read back.
        record = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        targets = {
            self.path(tag): data,
            self.digest_path(tag): json.dumps(record).encode(),
            self.root / "LATEST": tag.encode(),
        }
        staged: dict[Path, Path] = {}
        try:
            for path, content in targets.items():
                staged[path] = _stage(path, content)
        except OSError as e:
            for tmp in staged.values():
                tmp.unlink(missing_ok=True)
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            raise CheckpointWriteError(
                e.errno,
                f"could not commit checkpoint {tag!r} under {self.root}: {e.strerror or e}. "
                + ("The disk is full. " if full else "")
                + f"Nothing of this commit was kept; the last commit ({self.latest()!r}) is intact. "
                + ("Free space there (or set ESPER_HOME to a larger disk)" if full else "Fix the cause")
                + " and resume the run (`esper run --run-id RUN_ID`).",
            ) from e
        # A tag committed again (a re-run epoch) drops its old digest first: a crash between the
        # renames then leaves the new file without a digest (checked like an old checkpoint),
        # never beside a digest of other bytes (refused as damaged although it is not).
        self.digest_path(tag).unlink(missing_ok=True)
        for path, tmp in staged.items():
            os.replace(tmp, path)

    def latest(self) -> str | None:
        """Tag of the last committed checkpoint, or None before the first commit."""
        pointer = self.root / "LATEST"
        return pointer.read_text().strip() if pointer.exists() else None

    def point_latest(self, tag: str) -> None:
        """Make ``tag`` the last commit (after a fall-back past a damaged one)."""
        os.replace(_stage(self.root / "LATEST", tag.encode()), self.root / "LATEST")

    def load(self, tag: str | None = None) -> dict[str, Any]:
        """State saved under ``tag`` (default: LATEST), after checking its bytes.

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            CheckpointCorruptError: its bytes are not those committed (see ``verify``).
        """
        tag = tag or self.latest()
        if tag is None or not self.path(tag).exists():
            raise CheckpointNotFoundError(
                f"no checkpoint {tag!r} under {self.root}; the run has not committed an epoch yet"
            )
        data = self.path(tag).read_bytes()
        check = self._check(tag, data)
        if check.status == "damaged":
            raise CheckpointCorruptError(tag=tag, path=check.path, problem=check.problem)
        if check.status == "unverified":
            log.warning("loading checkpoint %s unverified: %s", check.path, check.problem)
        # weights_only: a checkpoint is data, never code to execute.
        return _unpickle(data)

    def verify(self, tag: str) -> CheckpointCheck:
        """Check checkpoint ``tag`` without loading it into a run (``esper runs verify``)."""
        if not self.path(tag).exists():
            raise CheckpointNotFoundError(f"no checkpoint {tag!r} under {self.root}")
        return self._check(tag, self.path(tag).read_bytes())

    def set_aside(self, tag: str) -> Path:
        """Move damaged checkpoint ``tag`` and its digest into ``damaged/`` (kept for a post-mortem).

        Returns:
            Where the checkpoint now is.
        """
        aside = self.root / DAMAGED_DIR
        aside.mkdir(exist_ok=True)
        # The same tag can be damaged twice (committed again after a fall-back): keep both.
        n = sum(1 for _ in aside.glob(f"{tag}*.pt"))
        stem = tag if n == 0 else f"{tag}.{n}"
        if self.digest_path(tag).exists():
            os.replace(self.digest_path(tag), aside / f"{stem}.json")
        moved = aside / f"{stem}.pt"
        os.replace(self.path(tag), moved)
        return moved

    def _check(self, tag: str, data: bytes) -> CheckpointCheck:
        path = self.path(tag)
        if not self.digest_path(tag).exists():
            problem = _legacy_problem(data)
            if problem:
                return CheckpointCheck(tag=tag, path=path, status="damaged", problem=problem)
            return CheckpointCheck(
                tag=tag,
                path=path,
                status="unverified",
                problem="no SHA-256 recorded (written before Esper recorded digests); only its zip CRC-32s "
                "were checked, and it unpickles",
            )
        try:
            record = json.loads(self.digest_path(tag).read_text())
            expected, size = str(record["sha256"]), int(record["bytes"])
        except (ValueError, KeyError, TypeError) as e:
            return CheckpointCheck(
                tag=tag,
                path=path,
                status="damaged",
                problem=f"its digest record {self.digest_path(tag)} is unreadable ({e})",
            )
        if len(data) != size:
            problem = f"{len(data)} bytes, its commit wrote {size}"
        elif (actual := hashlib.sha256(data).hexdigest()) != expected:
            problem = f"SHA-256 {actual}, its commit recorded {expected}"
        else:
            return CheckpointCheck(tag=tag, path=path, status="intact")
        return CheckpointCheck(tag=tag, path=path, status="damaged", problem=problem)


def _unpickle(data: bytes) -> dict[str, Any]:
    # torch is imported where a checkpoint is (de)serialised, not with the module: reading LATEST
    # and checking digests (`esper runs list|show|verify`) must not pay seconds for it.
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _legacy_problem(data: bytes) -> str:
    """Why a checkpoint without a digest cannot be trusted, or "" when all that can be checked holds.

    ``torch.load`` does not check the CRC-32 its zip container keeps of every entry (a flipped
    weight loads silently), so ``zipfile`` checks them; then the file must unpickle completely.
    """
    try:
        bad = zipfile.ZipFile(io.BytesIO(data)).testzip()
        if bad is not None:
            return f"the CRC-32 of its entry {bad!r} does not match (no SHA-256 was recorded for it)"
        _unpickle(data)
    except (zipfile.BadZipFile, RuntimeError, EOFError, pickle.UnpicklingError, UnicodeDecodeError, ValueError) as e:
        return f"it does not read back ({type(e).__name__}: {e}; no SHA-256 was recorded for it)"
    return ""


def _stage(path: Path, data: bytes) -> Path:
    """``data`` written and fsynced beside ``path`` under a temporary name (removed if that fails)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return tmp
