"""Signed artifacts: an HMAC-SHA256 over an artifact's blob bytes and its descriptor.

The SHA-256 of a blob detects corruption, not someone who can write both the blob store and the
database. So every artifact Urza publishes carries a signature made with a key the database does
not hold (``ESPER_SIGNING_KEY``, or a key generated in ``<home>/signing.key`` on first use), and
``Urza.fetch_blob`` verifies it before any byte reaches a deserialiser or the AOTInductor loader.

What is signed is what the kernel *is*: blueprint, shape profile, parameters, environment key
(torch version, device, compiler), format (kind), blob hash and size, guard schema, latency
record, fallback flag and reason, and the blob bytes themselves. Not signed: the status, its
reason and the version number, which the registry changes over an artifact's life (its status
history records who changed them).

Rotation: each signature is stored with the id of the key that made it. Keys listed in
``ESPER_SIGNING_KEY_FALLBACKS`` (and a generated local key, once a configured key replaces it)
still verify; ``esper registry resign`` re-signs everything with the current key, after which
the old key can be dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from esper_core.contracts import KernelArtifact
from esper_core.settings import EsperSettings
from esper_core.urza.base import canonical_params
from esper_core.urza.errors import ArtifactSignatureError, UnsignedArtifactError

SCHEME = b"esper-artifact-hmac-sha256-v1"
KEY_FILE_NAME = "signing.key"
MIN_SECRET_CHARS = 32
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One HMAC key and the id stored with its signatures.

    Attributes:
        key_id: Short public name of the key (1-64 of ``A-Z a-z 0-9 _ . -``).
        secret: The secret bytes (never printed).
    """

    key_id: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not _KEY_ID_RE.match(self.key_id):
            raise ValueError(
                f"signing key id {self.key_id!r} is invalid: use 1-64 characters of letters, digits, '_', '.' "
                "or '-', e.g. ESPER_SIGNING_KEY=prod-2026-11:<secret>"
            )
        if len(self.secret) < MIN_SECRET_CHARS:
            raise ValueError(
                f"signing key {self.key_id!r} has a {len(self.secret)}-character secret, at least "
                f"{MIN_SECRET_CHARS} are needed: generate one with "
                "`python -c 'import secrets; print(secrets.token_hex(32))'`"
            )

    @classmethod
    def parse(cls, text: str, *, setting: str) -> SigningKey:
        """A key from ``<key id>:<secret>``.

        Raises:
            ValueError: Not of that form, or a bad id or short secret; the message names ``setting``.
        """
        key_id, sep, secret = text.strip().partition(":")
        if not sep:
            raise ValueError(
                f"{setting} must be '<key id>:<secret>' (e.g. prod-2026-11:<64 hex characters>), got no ':'"
            )
        return cls(key_id, secret.encode())

    def sign(self, message: bytes) -> str:
        """Hex HMAC-SHA256 of ``message``."""
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()


def signed_descriptor(artifact: KernelArtifact) -> bytes:
    """The canonical bytes of the descriptor fields a signature covers (see the module docstring)."""
    env = artifact.environment
    fields = {
        "blueprint_id": artifact.blueprint_id,
        "shape_profile": artifact.shape_profile,
        "params": canonical_params(artifact.params),
        "environment": [env.torch_version, env.device_kind, env.compiler],
        "kind": artifact.kind.value,
        "sha256": artifact.sha256,
        "size_bytes": artifact.size_bytes,
        "guard": artifact.guard.model_dump(mode="json"),
        "latency": {k: v.model_dump(mode="json") for k, v in sorted(artifact.latency.items())},
        "fallback": artifact.fallback,
        "fallback_reason": artifact.fallback_reason,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _message(descriptor: bytes, blob: bytes) -> bytes:
    # Length-prefixed, so no descriptor/blob split of the same bytes can collide.
    return b"%s\n%d\n%s%s" % (SCHEME, len(descriptor), descriptor, blob)


class ArtifactSigner:
    """Signs with one key, verifies with it and the fallback keys.

    Args:
        active: The key new signatures are made with.
        fallbacks: Older keys that still verify.
    """

    def __init__(self, active: SigningKey, fallbacks: Sequence[SigningKey] = ()) -> None:
        self.active = active
        self._keys = {k.key_id: k for k in fallbacks}
        self._keys[active.key_id] = active

    @classmethod
    def from_settings(cls, settings: EsperSettings, *, home: Path | None = None) -> ArtifactSigner:
        """The configured keys; without ``ESPER_SIGNING_KEY``, the local key of ``home`` (made on first use).

        Args:
            settings: Where ``signing_key`` and ``signing_key_fallbacks`` come from.
            home: Directory of the local key file (default: ``settings.home``).

        Raises:
            ValueError: A configured key is malformed, or the local key file is unsafe or damaged.
        """
        home = settings.home if home is None else Path(home)
        fallbacks = []
        if settings.signing_key_fallbacks is not None:
            for part in settings.signing_key_fallbacks.get_secret_value().split(","):
                if part.strip():
                    fallbacks.append(SigningKey.parse(part, setting="ESPER_SIGNING_KEY_FALLBACKS"))
        local_path = home / KEY_FILE_NAME
        if settings.signing_key is None:
            return cls(local_key(home), fallbacks)
        active = SigningKey.parse(settings.signing_key.get_secret_value(), setting="ESPER_SIGNING_KEY")
        if local_path.exists():
            # Artifacts signed before a key was configured keep verifying until re-signed.
            fallbacks.append(read_key_file(local_path))
        return cls(active, fallbacks)

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Ids of every key that verifies, sorted."""
        return tuple(sorted(self._keys))

    def sign(self, artifact: KernelArtifact, blob: bytes) -> KernelArtifact:
        """``artifact`` with a signature over it and ``blob`` made with the active key."""
        signature = self.sign_bytes(signed_descriptor(artifact), blob)
        return artifact.model_copy(update={"signature": signature, "signature_key_id": self.active.key_id})

    def sign_bytes(self, descriptor: bytes, blob: bytes) -> str:
        """The active key's signature over a descriptor's canonical bytes and a blob."""
        return self.active.sign(_message(descriptor, blob))

    def verify_bytes(
        self, what: str, signature: str | None, key_id: str | None, descriptor: bytes, blob: bytes, *, fix: str
    ) -> None:
        """Check a signature over ``descriptor`` and ``blob`` (any stored object, e.g. a Simic policy).

        Args:
            what: The object, for messages (``policy v3``).
            signature: Its stored signature (None: unsigned).
            key_id: Id of the key that made it.
            descriptor: Canonical bytes of the signed fields.
            blob: Its blob.
            fix: How to publish it again (appended to the messages).

        Raises:
            UnsignedArtifactError: ``signature`` is None.
            ArtifactSignatureError: Unknown key, or the signature does not match.
        """
        if signature is None or key_id is None:
            raise UnsignedArtifactError(None, what, republish=fix)
        key = self._keys.get(key_id)
        if key is None:
            raise ArtifactSignatureError(None, what, self._unknown_key(key_id))
        if not hmac.compare_digest(key.sign(_message(descriptor, blob)), signature):
            raise ArtifactSignatureError(
                None,
                what,
                f"its signature (key {key_id}) does not match its blob and descriptor: publish it again ({fix})",
            )

    def _unknown_key(self, key_id: str) -> str:
        return (
            f"it is signed with key {key_id!r}, which this installation does not hold "
            f"(it holds {', '.join(self.key_ids)}): add that key to ESPER_SIGNING_KEY_FALLBACKS, or re-sign "
            "the registry with `esper registry resign` where the key is held"
        )

    def verify(self, artifact: KernelArtifact, blob: bytes) -> None:
        """Check ``artifact``'s signature over its descriptor and ``blob``.

        Raises:
            UnsignedArtifactError: It carries no signature.
            ArtifactSignatureError: Its key is unknown here, or the signature does not match.
        """
        self.check_signed(artifact)
        key = self._keys[artifact.signature_key_id or ""]
        message = _message(signed_descriptor(artifact), blob)
        if not hmac.compare_digest(key.sign(message), artifact.signature or ""):
            raise ArtifactSignatureError(
                artifact.artifact_id,
                artifact.blueprint_id,
                f"its signature (key {key.key_id}) does not match its blob and descriptor, so one of them was "
                "changed after it was signed: quarantine it (`esper registry quarantine "
                f"{artifact.artifact_id} --reason 'bad signature'`) and re-publish the blueprint "
                "(`esper catalog compile <blueprint>`)",
            )

    def check_signed(self, artifact: KernelArtifact) -> None:
        """Refuse an unsigned artifact or one signed with a key not held here (no bytes needed).

        Raises:
            UnsignedArtifactError: No signature.
            ArtifactSignatureError: The signature's key is unknown.
        """
        if artifact.signature is None or artifact.signature_key_id is None:
            raise UnsignedArtifactError(artifact.artifact_id, artifact.blueprint_id)
        if artifact.signature_key_id not in self._keys:
            raise ArtifactSignatureError(
                artifact.artifact_id, artifact.blueprint_id, self._unknown_key(artifact.signature_key_id)
            )

    def is_current(self, artifact: KernelArtifact) -> bool:
        """Whether ``artifact`` is signed with the active key (``resign`` skips those)."""
        return artifact.signature is not None and artifact.signature_key_id == self.active.key_id


def read_key_file(path: Path) -> SigningKey:
    """The key stored in ``path`` (``<key id>:<secret>``).

    Raises:
        ValueError: Group or others may read it, or it is malformed.
    """
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(
            f"signing key file {path} has mode {mode:o}: anyone who can read it can sign artifacts; "
            f"run `chmod 600 {path}`"
        )
    return SigningKey.parse(path.read_text(), setting=str(path))


def local_key(home: Path) -> SigningKey:
    """The key in ``<home>/signing.key``, generated (mode 0600) if absent.

    Creation is atomic and never replaces an existing file: the key is written to a private
    temporary file and hard-linked into place, so of two processes that start at once one
    link wins and both read the winner's key.
    """
    home = Path(home)
    path = home / KEY_FILE_NAME
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        candidate = f"local-{secrets.token_hex(4)}:{secrets.token_hex(32)}\n"
        tmp = home / f".{KEY_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, candidate.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process generated it first: use theirs
        finally:
            tmp.unlink()
    return read_key_file(path)
