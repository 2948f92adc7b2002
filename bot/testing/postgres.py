"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` into a temp dir
(on a RAM file system when there is room).

:class:`PostgresCluster` starts a real server (the Debian ``postgresql``
package's binaries, found on ``PATH`` or under ``/usr/lib/postgresql/<ver>/bin``)
on a free 127.0.0.1 port, with durability switched off (``fsync=off``): a
test database never has to survive a power loss. ``initdb`` refuses to run as
root, so under root the cluster is created and run as the ``postgres`` user
(``runuser``), which owns the temp dir; as anyone else it runs as that user.

Each test gets a database of its own, created from a template with
``CREATE DATABASE ... TEMPLATE ... STRATEGY = FILE_COPY`` (a file copy, tens of
milliseconds), so tests never see each other's rows. Under pytest-xdist each
worker starts its own cluster (the session-scoped fixture runs once per worker).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["RAM_DIR", "RAM_NEEDED", "PostgresCluster", "PostgresUnavailable", "find_binary"]

SUPERUSER = "roost"
"""The cluster's superuser (trust authentication on 127.0.0.1 only)."""


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed (``apt-get install postgresql``)."""


def find_binary(name: str) -> str:
    """The path of PostgreSQL program ``name``: on ``PATH``, else Debian's versioned dir."""
    found = shutil.which(name)
    if found:
        return found
    # Debian and Ubuntu keep the server programs out of PATH; take the newest version.
    candidates = glob.glob(f"/usr/lib/postgresql/*/bin/{name}")
    if candidates:
        return max(candidates, key=lambda p: _version_key(Path(p).parent.parent.name))
    raise PostgresUnavailable(
        f"{name} not found on PATH or under /usr/lib/postgresql/*/bin: install the "
        "postgresql server package (apt-get install postgresql)")


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


RAM_DIR = Path("/dev/shm")
"""A RAM file system (tmpfs) for clusters: creating a database copies the template's
files, which costs the server several times the CPU on a disk file system."""
RAM_NEEDED = 2 << 30
"""Free space :data:`RAM_DIR` must have for a cluster to go there (a test cluster grows
by ~7 MB per database)."""


def _ram_dir() -> str | None:
    """:data:`RAM_DIR` if it is writable and has :data:`RAM_NEEDED` free, else ``None``."""
    try:
        free = os.statvfs(RAM_DIR)
    except OSError:
        return None
    room = free.f_bavail * free.f_frsize >= RAM_NEEDED
    return str(RAM_DIR) if room and os.access(RAM_DIR, os.W_OK | os.X_OK) else None


class PostgresCluster:
    """One running PostgreSQL server in a temp dir; :meth:`stop` removes it.

    With ``in_ram`` (the default) the dir is on :data:`RAM_DIR` when it has room, else in
    the default temp dir; benchmarks pass ``in_ram=False`` to measure a server on disk.
    """

    def __init__(self, *, in_ram: bool = True) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="roost-pg-",
                                          dir=_ram_dir() if in_ram else None))
        self.datadir = self.base / "data"
        self.port = 0
        self._names = itertools.count(1)
        self._run_as: list[str] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            # initdb and postgres refuse root: hand the directory to the postgres user.
            try:
                user = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable("running as root and there is no 'postgres' "
                                          "user to run the server as") from exc
            os.chown(self.base, user.pw_uid, user.pw_gid)
            self._run_as = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", "postgres",
                            "--"]

    def _run(self, *argv: str) -> None:
        result = subprocess.run([*self._run_as, *argv], capture_output=True, text=True,
                                check=False, cwd=self.base)
        if result.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed ({result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")

    def start(self) -> PostgresCluster:
        """initdb and start the server; raises :class:`PostgresUnavailable` without binaries."""
        initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        self._run(initdb, "-D", str(self.datadir), "-U", SUPERUSER, "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
        for attempt in range(3):
            # A port found free can be taken before the server binds it: try another.
            self.port = _free_port()
            options = " ".join([
                f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.base}",
                "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
                "-c max_connections=200", "-c shared_buffers=32MB",
            ])
            try:
                self._run(pg_ctl, "-D", str(self.datadir), "-l", str(self.base / "log"),
                          "-o", options, "-w", "-t", "60", "start")
                break
            except RuntimeError:
                if attempt == 2:
                    raise RuntimeError("postgres did not start: " + self.log_tail()) from None
        self._watch(pg_ctl)
        return self

    def _watch(self, pg_ctl: str) -> None:
        """Stop the server if this process dies without :meth:`stop` (killed by a timeout,
        an interrupted xdist worker): a server never outlives the tests that started it."""
        stop = " ".join(shlex.quote(a) for a in [*self._run_as, pg_ctl, "-D", str(self.datadir),
                                                  "-m", "immediate", "-w", "stop"])
        script = (f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                  f"{stop} >/dev/null 2>&1; rm -rf {shlex.quote(str(self.base))}")
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server log (for failures)."""
        with contextlib.suppress(OSError):
            return "\n".join((self.base / "log").read_text().splitlines()[-lines:])
        return ""

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of ``database`` on this server."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    async def create_database(self, template: str = "template0") -> str:
        """A new, empty database copied from ``template``; returns its URL."""
        import asyncpg  # type: ignore[import-untyped]  # the postgres extra; tests only

        name = f"t{os.getpid()}_{next(self._names)}"
        conn = await asyncpg.connect(self.url())
        try:
            # Identifiers cannot be bound; both are our own names.
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'
                               " STRATEGY = FILE_COPY")
        finally:
            await conn.close()
        return self.url(name)

    def stop(self) -> None:
        """Stop the server at once and delete its files."""
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        if self.port:
            with contextlib.suppress(PostgresUnavailable, RuntimeError):
                self._run(find_binary("pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                          "-w", "stop")
        shutil.rmtree(self.base, ignore_errors=True)
