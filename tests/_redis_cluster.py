"""A private three-master Redis Cluster for the contract suite (``redis-cluster`` backend).

``start()`` runs three ``redis-server`` processes with ``cluster-enabled yes`` on free ports in a
temporary directory, joins them with ``redis-cli --cluster create`` (no replicas), waits until
every node reports ``cluster_state:ok``, and returns a handle with the URL and ``stop()``.
With ``tls`` (``tls-*`` settings, as for :class:`PrivateRedis`) the nodes speak TLS only, on the
client port and on the cluster bus (``tls-cluster yes``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests._private_redis import CannotStart, PrivateRedis

__all__ = ["CannotStart", "Cluster", "start"]


@dataclass
class Cluster:
    """A running private cluster."""

    nodes: list[PrivateRedis]
    directory: tempfile.TemporaryDirectory[str]

    @property
    def url(self) -> str:
        """A URL naming the cluster through its first node."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=1"

    def stop(self) -> None:
        """Stop every node and remove the directory."""
        for node in self.nodes:
            node.stop()
        self.directory.cleanup()


def _state_ok(node: PrivateRedis) -> bool:
    client = redis.Redis(port=node.port, socket_timeout=1, **node.client_tls())
    try:
        info = client.execute_command("CLUSTER INFO")
    except redis.RedisError:
        return False
    finally:
        client.close()
    if isinstance(info, dict):  # redis-py parses CLUSTER INFO
        return str(info.get("cluster_state")) == "ok"
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def start(
    masters: int = 3,
    timeout: float = 30.0,
    options: dict[str, str] | None = None,
    tls: dict[str, str] | None = None,
) -> Cluster:
    """Start a cluster of ``masters`` nodes, each with ``options`` (``--name value`` settings)
    over the defaults and, with ``tls``, speaking TLS only; raises :class:`CannotStart` if it
    cannot."""
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            raise CannotStart(f"{binary} is not installed")
    directory = tempfile.TemporaryDirectory(prefix="agentlease-cluster-")
    nodes: list[PrivateRedis] = []
    try:
        for i in range(masters):
            node = PrivateRedis(
                Path(directory.name) / f"node{i}",
                options={
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": "5000",
                    "appendonly": "no",
                    **(options or {}),
                },
                tls=None if tls is None else {"tls-cluster": "yes", **tls},
            )
            nodes.append(node.start())
        created = subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
                *_cli_tls(tls),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if created.returncode != 0:
            raise CannotStart(f"redis-cli --cluster create failed: {created.stdout[-500:]}")
        deadline = time.monotonic() + timeout
        while not all(_state_ok(n) for n in nodes):
            if time.monotonic() > deadline:
                raise CannotStart(f"cluster not ok within {timeout}s")
            time.sleep(0.05)
    except BaseException:
        for node in nodes:
            node.stop()
        directory.cleanup()
        raise
    return Cluster(nodes, directory)


def _cli_tls(tls: dict[str, str] | None) -> list[str]:
    """redis-cli's arguments to reach nodes started with ``tls``."""
    if tls is None:
        return []
    args: dict[str, Any] = {
        "--cacert": tls.get("tls-ca-cert-file"),
        "--cert": tls.get("tls-cert-file"),
        "--key": tls.get("tls-key-file"),
    }
    return ["--tls", *(part for name, value in args.items() if value for part in (name, value))]
