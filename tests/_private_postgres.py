"""A private PostgreSQL server for tests that must break one: restart it, stop it, lock a role out.

The shared server (127.0.0.1:5432) is never touched here. :func:`start` runs ``initdb`` and
``pg_ctl`` as the ``postgres`` OS user (PostgreSQL refuses to run as root) in a temporary directory
it owns, on a free port on 127.0.0.1, with trust authentication for everyone except the role
:data:`PASSWORD_ROLE`, which must log in with :data:`PASSWORD` (scram-sha-256). ``fsync=off``
makes it fast and unsafe against a machine crash only; ``synchronous_commit`` stays on, so a
commit survives the server being killed (``pg_ctl stop -m immediate``), as in production.
:meth:`PrivatePostgres.stop` removes everything, and is safe to call twice.

``start(hba=..., conf=..., files=...)`` serves other needs (TLS): ``files`` are copied into the
data directory, owned by the server's user with mode 0600 (as PostgreSQL wants a key file),
``conf`` lines are appended to ``postgresql.conf`` and ``hba`` replaces the ``pg_hba.conf``
above. :meth:`PrivatePostgres.sql` goes through the server's Unix socket (``local`` lines), so
it works whatever ``hba`` says about TCP.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PASSWORD", "PASSWORD_ROLE", "CannotStart", "PrivatePostgres", "start"]

OS_USER = "postgres"
PASSWORD_ROLE = "locked"
PASSWORD = "right-password"
HBA = f"""\
local all all                   trust
host  all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256
host  all all             127.0.0.1/32 trust
"""


class CannotStart(RuntimeError):
    """No private server here (no binaries, no ``postgres`` user, or it failed to start)."""


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if candidates:
        return candidates[-1]
    raise CannotStart(f"{name} not found on PATH or under /usr/lib/postgresql/*/bin")


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv  # already an unprivileged user: run as ourselves
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", OS_USER, "--", *argv]
    return ["su", OS_USER, "-s", "/bin/sh", "-c", " ".join(argv)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class PrivatePostgres:
    """One private server: its directory, port and the commands that drive it."""

    root: Path
    port: int
    _running: bool = field(default=False, repr=False)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres", user: str = "postgres", **options: str) -> str:
        """A ``postgresql://`` URL on this server, with agentlease options if given."""
        url = f"postgresql://{user}@127.0.0.1:{self.port}/{database}"
        if options:
            url += "?" + "&".join(f"{k}={v}" for k, v in options.items())
        return url

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        opts = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c max_connections=200 "
            # Fast but still crash-safe for what the tests do (a server process killed, never
            # the machine): commits reach the OS before they are acknowledged.
            "-c fsync=off -c full_page_writes=off"
        )
        argv = [_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, *args]
        done = subprocess.run(
            _as_postgres(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise CannotStart(f"pg_ctl {' '.join(args)} failed: {done.stderr.strip()}\n{tail}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._ctl("-w", "-t", "60", "start")
        self._running = True

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect clients; ``immediate``: like a crash)."""
        if self._running:
            self._ctl("-w", "-t", "60", "-m", mode, "stop")
            self._running = False

    def restart(self, *, down_for: float = 0.0, mode: str = "fast") -> None:
        """Stop the server, stay down for ``down_for`` seconds, and start it again."""
        self.stop_server(mode)
        time.sleep(down_for)
        self.start()

    def sql(self, statement: str, *, database: str = "postgres") -> None:
        """Run one statement as the superuser (autocommit)."""
        import psycopg

        with psycopg.connect(
            dbname=database,
            user="postgres",
            host=str(self.root),
            port=self.port,
            autocommit=True,
            connect_timeout=10,
        ) as conn:
            conn.execute(statement.encode())

    def stop(self) -> None:
        """Stop the server (if running) and remove its directory."""
        try:
            self.stop_server("immediate")
        except (CannotStart, subprocess.TimeoutExpired):
            pass
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start(
    *, hba: str = HBA, conf: tuple[str, ...] = (), files: dict[str, Path] | None = None
) -> PrivatePostgres:
    """Create, configure and start a private server; the caller must stop it.

    Args:
        hba: the whole ``pg_hba.conf`` (it must keep a ``local ... trust`` line for
            :meth:`PrivatePostgres.sql`).
        conf: lines appended to ``postgresql.conf`` (``ssl = on``, ...).
        files: name -> source path, copied into the data directory, owned by the server's user
            and mode 0600 (refer to them from ``conf`` by name).

    Raises:
        CannotStart: PostgreSQL is not installed, or the server did not come up.
    """
    initdb = _binary("initdb")
    _binary("pg_ctl")
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam(OS_USER)
        except KeyError as exc:
            raise CannotStart(f"no {OS_USER!r} OS user to run the server as") from exc
    root = Path(tempfile.mkdtemp(prefix="agentlease-pg-"))
    server = PrivatePostgres(root, _free_port())
    try:
        if os.geteuid() == 0:
            os.chown(root, entry.pw_uid, entry.pw_gid)
        argv = [initdb, "-D", str(server.data), "-U", "postgres", "-E", "UTF8", "--no-sync"]
        argv += ["--auth=trust", "--locale=C"]
        done = subprocess.run(
            _as_postgres(argv),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise CannotStart(f"initdb failed: {done.stderr.strip()}")
        hba_file = server.data / "pg_hba.conf"
        hba_file.write_text(hba)
        written = [hba_file]
        for name, source in (files or {}).items():
            target = server.data / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            written.append(target)
        if conf:
            with (server.data / "postgresql.conf").open("a") as config:
                config.write("\n".join(conf) + "\n")
        if os.geteuid() == 0:
            for path in written:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        server.start()
        server.sql(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")
        server.sql(f"GRANT ALL ON DATABASE postgres TO {PASSWORD_ROLE}")
    except BaseException:
        server.stop()
        raise
    return server
