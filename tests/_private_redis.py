"""A private ``redis-server`` for tests that must break it (never the shared one on 6379).

Each server runs from the installed ``redis-server`` binary on a free port, in a directory of its
own, and can be killed and started again on the same directory and port (what a crash and a
restart look like to clients).

With ``tls`` (redis-server's ``tls-*`` settings) a server listens for TLS only, on its port
(``--port 0 --tls-port <port>``), and is checked for readiness over TLS (its host name not
checked); when it requires client certificates (``tls-auth-clients yes``, the default), with
``tls-client-cert-file`` or else its own certificate, which must then allow client use.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

__all__ = ["CannotStart", "PrivateRedis", "free_port"]


class CannotStart(Exception):
    """The server cannot be started here (no binary, or it would not come up)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def free_port(*, with_bus: bool = False) -> int:
    """A TCP port nobody listens on now (and, ``with_bus``, port + 10000 too)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not with_bus:
            return port
        if port + 10000 <= 65535:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port + 10000))
                return port
    raise CannotStart("no free port found")


@dataclass
class PrivateRedis:
    """One ``redis-server`` process owned by a test.

    Attributes:
        directory: its working directory (data files, log).
        port: the port it listens on, kept across restarts.
        options: extra ``--name value`` settings (``appendonly``, ``requirepass``, ...).
        tls: ``tls-*`` settings (``tls-cert-file``, ``tls-key-file``, ``tls-ca-cert-file``,
            ``tls-auth-clients``, ...); if given, the server speaks TLS only, on ``port``.
    """

    directory: Path
    port: int = 0
    options: dict[str, str] = field(default_factory=dict)
    tls: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        if shutil.which("redis-server") is None:
            raise CannotStart("redis-server is not installed")
        if not self.port:
            self.port = free_port(with_bus="cluster-enabled" in self.options)
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client_tls(self) -> dict[str, Any]:
        """redis-py keyword arguments that reach this server (none without ``tls``)."""
        if self.tls is None:
            return {}
        kwargs: dict[str, Any] = {
            "ssl": True,
            "ssl_ca_certs": self.tls.get("tls-ca-cert-file"),
            "ssl_check_hostname": False,  # its certificate may name another host, on purpose
        }
        if self.tls.get("tls-auth-clients", "yes") == "yes":
            client = "tls-client-cert-file" in self.tls
            kwargs["ssl_certfile"] = self.tls["tls-client-cert-file" if client else "tls-cert-file"]
            kwargs["ssl_keyfile"] = self.tls["tls-client-key-file" if client else "tls-key-file"]
        return kwargs

    @property
    def log(self) -> Path:
        """The server's log file."""
        return self.directory / "redis.log"

    def start(self, timeout: float = 15.0) -> PrivateRedis:
        """Start the server and wait until it answers PING."""
        args = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.log),
            "--save",
            "",
            "--daemonize",
            "no",
        ]
        if self.tls is not None:
            args[2:3] = ["0", "--tls-port", str(self.port)]
            for name, value in self.tls.items():
                args += [f"--{name}", value]
        for name, value in self.options.items():
            args += [f"--{name}", value]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.directory
        )
        deadline = time.monotonic() + timeout
        password = self.options.get("requirepass")
        while True:
            if self.process.poll() is not None:
                raise CannotStart(f"redis-server exited at start: {self._tail()}")
            client = redis.Redis(
                port=self.port, password=password, socket_timeout=1, **self.client_tls()
            )
            try:
                if client.ping():
                    return self
            except redis.RedisError:
                pass
            finally:
                client.close()
            if time.monotonic() > deadline:
                self.kill()
                raise CannotStart(f"redis-server did not answer within {timeout}s: {self._tail()}")
            time.sleep(0.02)

    def _tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return " | ".join(text.strip().splitlines()[-3:])

    def kill(self) -> None:
        """SIGKILL the server (a crash) and wait for it to be gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def restart(self) -> None:
        """Kill the server and start it again on the same directory and port."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Stop the server for good."""
        self.kill()
