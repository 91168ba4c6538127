"""A private ``redis-server`` for tests that must break it (never the shared one on 6379).

Each server runs from the installed ``redis-server`` binary on a free port, in a directory of its
own, and can be killed and started again on the same directory and port (what a crash and a
restart look like to clients).
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
    """

    directory: Path
    port: int = 0
    options: dict[str, str] = field(default_factory=dict)
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
            client = redis.Redis(port=self.port, password=password, socket_timeout=1)
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
