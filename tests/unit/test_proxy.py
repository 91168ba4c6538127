"""The test proxy (tests/_proxy.py) in front of a tiny echo server: forwarding, cuts, stalls,
refusals, and a clean close that leaves no thread behind."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests._proxy import Proxy


class Echo:
    """An echo server on 127.0.0.1: one thread per connection, all stopped by close()."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port: int = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._accept, name="echo-accept")
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._echo, args=(conn,), name="echo-conn")
            self.threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        with conn:
            while not self.stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                with contextlib.suppress(OSError):
                    conn.sendall(data)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for t in self.threads:
            t.join(timeout=5)
        self.listener.close()


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: Echo) -> Iterator[Proxy]:
    p = Proxy("127.0.0.1", echo.port)
    yield p
    p.close()


def client(proxy: Proxy, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def closed_by_peer(connect: Callable[[], socket.socket]) -> bool:
    """Whether a connection (made by ``connect``) is refused, reset or ended by the other side."""
    try:
        with connect() as sock:
            sock.sendall(b"anyone?")
            return sock.recv(10) == b""
    except (ConnectionError, BrokenPipeError):
        return True


def wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_forwards_both_ways_also_large_messages(proxy: Proxy) -> None:
    with client(proxy) as a, client(proxy) as b:
        assert roundtrip(a, b"ping") == b"ping"
        big = bytes(range(256)) * 8192  # 2 MiB: more than the proxy buffers per direction
        assert roundtrip(b, big) == big
        assert proxy.live == 2
        assert proxy.accepted == 2


def test_cut_closes_every_connection_and_new_ones_work(proxy: Proxy) -> None:
    socks = [client(proxy) for _ in range(3)]
    for s in socks:
        assert roundtrip(s, b"x") == b"x"
    assert proxy.cut() == 3
    assert proxy.live == 0
    for s in socks:
        assert closed_by_peer(lambda s=s: s)  # reset: the next read or write fails at once
    with client(proxy) as fresh:
        assert roundtrip(fresh, b"again") == b"again"


def test_an_orderly_cut_sends_end_of_file(proxy: Proxy) -> None:
    with client(proxy) as s:
        assert roundtrip(s, b"x") == b"x"
        proxy.cut(reset=False)
        assert s.recv(10) == b""


def test_stall_holds_bytes_without_closing_and_resume_delivers_them(proxy: Proxy) -> None:
    with client(proxy, timeout=0.3) as s:
        assert roundtrip(s, b"before") == b"before"
        proxy.stall()
        assert proxy.stalled
        s.sendall(b"held")
        with pytest.raises(TimeoutError):
            s.recv(10)  # silence: no data, no end of file, no reset
        late = client(proxy, timeout=0.3)  # accepted while stalled, and stalled too
        late.sendall(b"late")
        with pytest.raises(TimeoutError):
            late.recv(10)
        proxy.resume()
        s.settimeout(5)
        late.settimeout(5)
        assert s.recv(10) == b"held"
        assert late.recv(10) == b"late"
        assert roundtrip(s, b"after") == b"after"
        late.close()


def test_refuse_and_accept(proxy: Proxy) -> None:
    with client(proxy) as kept:
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        assert roundtrip(kept, b"still here") == b"still here"  # live ones are untouched
        proxy.accept()
        with client(proxy) as fresh:
            assert roundtrip(fresh, b"back") == b"back"


def test_a_dead_target_closes_new_connections(echo: Echo) -> None:
    with Proxy("127.0.0.1", echo.port) as p:
        echo.close()
        assert closed_by_peer(lambda: client(p))  # reset at connect, or at the first read


def test_close_stops_the_thread_and_frees_the_port(echo: Echo) -> None:
    p = Proxy("127.0.0.1", echo.port)
    s = client(p)
    assert roundtrip(s, b"x") == b"x"
    p.close()
    p.close()  # twice is fine
    assert s.recv(10) == b""
    s.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("proxy-")]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", p.port), timeout=2)
    with pytest.raises(RuntimeError):
        p.cut()


def test_it_stops_by_itself_after_its_lifetime(echo: Echo) -> None:
    p = Proxy("127.0.0.1", echo.port, lifetime=0.3)
    wait_for(lambda: not p._thread.is_alive())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", p.port), timeout=2)
    p.close()
