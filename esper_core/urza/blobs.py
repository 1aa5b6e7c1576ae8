"""Content-addressed blob store: ``root/<first two hex chars>/<sha256>``.

Writes are atomic (temp file in the same directory, fsync, ``os.replace``), so a reader never
sees a partial blob, and idempotent, so concurrent publishers of the same bytes are harmless.
Every read verifies the hash: a flipped bit on disk surfaces as ``CorruptBlobError`` instead of a
kernel that computes garbage.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from esper_core.urza.errors import CorruptBlobError, MissingBlobError

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_TMP_SUFFIX = ".tmp"


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredFile:
    """A file in the blob store: a blob (``sha256`` set) or a leftover temp file (``sha256`` None)."""

    path: Path
    sha256: str | None
    size_bytes: int
    mtime: float


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class BlobStore:
    """Blobs on a local or shared filesystem, addressed by their SHA-256.

    Args:
        root: Directory holding the blobs; created if absent.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        """Where the blob ``sha256`` lives (whether or not it exists).

        Raises:
            ValueError: ``sha256`` is not 64 lower-case hex characters.
        """
        if not _SHA_RE.match(sha256):
            raise ValueError(f"{sha256!r} is not a sha256 hex digest: pass 64 lower-case hex characters")
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        """Whether the blob is stored (its content is not checked)."""
        return self.path(sha256).is_file()

    def put(self, data: bytes) -> str:
        """Store ``data`` and return its SHA-256.

        A blob already stored intact is left alone; a stored copy that fails verification is
        replaced, so re-publishing repairs a corrupt blob.

        Args:
            data: The blob content (non-empty).

        Returns:
            The hex SHA-256, which is the blob's address.
        """
        if not data:
            raise ValueError("refusing to store an empty blob: a kernel artifact always has content")
        sha = sha256_hex(data)
        target = self.path(sha)
        if target.is_file() and sha256_hex(target.read_bytes()) == sha:
            return sha
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{sha[:12]}.", suffix=_TMP_SUFFIX)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)
        return sha

    def get(self, sha256: str) -> bytes:
        """Read a blob and verify it.

        Raises:
            MissingBlobError: No blob with that hash.
            CorruptBlobError: The file's content does not hash to ``sha256``.
        """
        target = self.path(sha256)
        try:
            data = target.read_bytes()
        except FileNotFoundError as e:
            raise MissingBlobError(sha256, target) from e
        actual = sha256_hex(data)
        if actual != sha256:
            raise CorruptBlobError(target, sha256, actual)
        return data

    def files(self) -> Iterator[StoredFile]:
        """Every blob and leftover temp file (an interrupted ``put``), in no particular order.

        Files that are neither (foreign names) are not listed, so garbage collection never
        touches them.
        """
        for shard in self.root.iterdir():
            if not (shard.is_dir() and len(shard.name) == 2):
                continue
            for path in shard.iterdir():
                is_blob = _SHA_RE.match(path.name) is not None and path.name[:2] == shard.name
                is_tmp = path.name.startswith(".") and path.name.endswith(_TMP_SUFFIX)
                if not (is_blob or is_tmp):
                    continue
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # removed meanwhile (a concurrent put finished, or another gc)
                yield StoredFile(
                    path=path, sha256=path.name if is_blob else None, size_bytes=stat.st_size, mtime=stat.st_mtime
                )

    def remove(self, stored: StoredFile) -> bool:
        """Delete a file listed by ``files``; False when it was already gone."""
        try:
            stored.path.unlink()
        except FileNotFoundError:
            return False
        return True


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable on POSIX; Windows cannot open directories.
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
