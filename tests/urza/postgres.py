"""A private PostgreSQL server for the registry tests, started from the local binaries.

``initdb`` and ``pg_ctl`` come from PATH or Debian's ``/usr/lib/postgresql/<version>/bin``
(``apt-get install postgresql``; ``.ci/run`` installs them). The cluster lives in a temporary
directory, listens on a free loopback port and trusts local connections; durability is off
(``fsync=off``), it is thrown away after the session. PostgreSQL refuses to run as root, so under
root the server runs as the ``postgres`` user. ``ESPER_TEST_DB_URL`` (an admin URL such as
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``) uses an existing server instead.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ENV_URL = "ESPER_TEST_DB_URL"
_counter = itertools.count()


def find_binaries() -> Path | None:
    """Directory holding ``initdb`` and ``pg_ctl``, or None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parent.parent.name)
    return candidates[-1].parent if candidates else None


def unavailable_reason() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when they can."""
    if os.environ.get(ENV_URL):
        return None
    if find_binaries() is None:
        return f"needs PostgreSQL server binaries (apt-get install postgresql) or {ENV_URL}"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "PostgreSQL refuses to run as root and runuser is missing"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "PostgreSQL refuses to run as root and there is no 'postgres' user to run it as"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    # initdb and postgres exit with "cannot be run as root".
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class LocalServer:
    """A throw-away cluster on a loopback port that a test may stop and start again (an outage drill).

    Args:
        root: Empty directory owned by the server's user; the cluster goes in ``root/data``.
    """

    def __init__(self, root: Path) -> None:
        bindir = find_binaries()
        assert bindir is not None, unavailable_reason()
        self.root = root
        self._bindir = bindir
        self._data = root / "data"
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._run([str(bindir / "initdb"), "-D", str(self._data), "-U", "postgres", "--auth=trust", "--no-sync"])

    def _run(self, argv: list[str]) -> None:
        try:
            subprocess.run(_as_server_user(argv), check=True, capture_output=True, text=True, timeout=120)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{argv[0]} failed: {e.stderr or e.stdout}") from e

    def start(self) -> None:
        """Start the server and wait until it accepts connections (``pg_ctl -w``)."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
        log = str(self.root / "server.log")
        self._run([str(self._bindir / "pg_ctl"), "-D", str(self._data), "-l", log, "-o", options, "-w", "start"])

    def stop(self, mode: str = "fast") -> None:
        """Stop the server and wait until it is gone.

        ``fast`` (what ``systemctl stop`` does) ends open sessions and flushes what was committed;
        ``immediate`` is a crash, which with this cluster's ``synchronous_commit=off`` may lose the
        last commits.
        """
        self._run([str(self._bindir / "pg_ctl"), "-D", str(self._data), "-m", mode, "-w", "stop"])


@contextmanager
def controllable_server() -> Iterator[LocalServer]:
    """A started ``LocalServer`` of its own (never ``ESPER_TEST_DB_URL``'s: a drill stops it)."""
    root = Path(tempfile.mkdtemp(prefix="esper-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres", group="postgres")
    try:
        server = LocalServer(root)
        server.start()
        try:
            yield server
        finally:
            subprocess.run(
                _as_server_user(
                    [str(server._bindir / "pg_ctl"), "-D", str(server._data), "-m", "immediate", "-w", "stop"]
                ),
                capture_output=True,
                timeout=60,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def local_server() -> Iterator[str]:
    """Start a throw-away cluster and yield its admin URL (database ``postgres``)."""
    existing = os.environ.get(ENV_URL)
    if existing:
        yield existing
        return
    with controllable_server() as server:
        yield server.url


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """Create an empty database on the server of ``admin_url``; drop it afterwards."""
    name = f"esper_test_{os.getpid()}_{next(_counter)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
