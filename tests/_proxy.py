"""A loopback TCP proxy for tests that break the network between clients and a store.

:class:`Proxy` listens on a free port of 127.0.0.1 and forwards every connection to a target
``host:port``, from one background thread running a selector loop (no thread per connection).
The controls act at once and return when done:

- :meth:`Proxy.cut`: close every live connection, both sides (a reset by default, as when a
  middlebox drops its state); new connections are accepted and work.
- :meth:`Proxy.stall` / :meth:`Proxy.resume`: stop forwarding bytes in both directions without
  closing anything (a silent partition: no error, no FIN, nothing arrives); new connections are
  accepted but stalled too. Bytes already read are delivered after :meth:`resume`.
- :meth:`Proxy.refuse` / :meth:`Proxy.accept`: close the listening socket, so new connections
  are refused (live ones are left alone), and listen again on the same port.
- :meth:`Proxy.close`: stop the thread and close everything (also on its own after ``lifetime``
  seconds, so a forgotten proxy never outlives its test by much).

A connection whose target cannot be reached is closed at once, as the target would refuse it.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["Proxy"]

_CHUNK = 65536
_BUFFER_LIMIT = 1 << 20  # bytes held per direction before the proxy stops reading that side


@dataclass(eq=False)
class _Pipe:
    """One proxied connection: the client's socket, the target's, and a buffer per direction."""

    client: socket.socket
    upstream: socket.socket
    to_upstream: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    eof: bool = False  # one side closed: close the pipe once the other's buffer is delivered

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client

    def outgoing(self, sock: socket.socket) -> bytearray:
        """The bytes waiting to be written to ``sock``."""
        return self.to_client if sock is self.client else self.to_upstream


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_host:target_port``.

    Args:
        target_host: where connections are forwarded.
        target_port: the target's port.
        port: the port to listen on (0: a free one).
        connect_timeout: seconds to reach the target for a new connection.
        lifetime: seconds after which the proxy closes itself.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        port: int = 0,
        connect_timeout: float = 2.0,
        lifetime: float = 600.0,
    ) -> None:
        self.target = (target_host, target_port)
        self.connect_timeout = connect_timeout
        self.accepted = 0  # connections accepted so far
        self._deadline = time.monotonic() + lifetime
        self._selector = selectors.DefaultSelector()
        self._pipes: dict[socket.socket, _Pipe] = {}
        self._stalled = False
        self._closed = False
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._listener: socket.socket | None = None
        self._listen(port)
        assert self._listener is not None
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    # -- controls (any thread) ------------------------------------------------------------------

    @property
    def live(self) -> int:
        """Connections open now."""
        count: list[int] = []
        self._call(lambda: count.append(len({id(p) for p in self._pipes.values()})))
        return count[0]

    @property
    def stalled(self) -> bool:
        """Whether forwarding is stopped."""
        return self._stalled

    def cut(self, *, reset: bool = True) -> int:
        """Close every live connection, both sides, at once; returns how many were closed.

        Args:
            reset: send a TCP reset (``False``: an orderly close, a FIN to each side).
        """
        closed: list[int] = []

        def do() -> None:
            pipes = {id(p): p for p in self._pipes.values()}
            for pipe in pipes.values():
                self._close_pipe(pipe, reset=reset)
            closed.append(len(pipes))

        self._call(do)
        return closed[0] if closed else 0

    def stall(self) -> None:
        """Stop forwarding in both directions, keeping every connection open."""

        def do() -> None:
            self._stalled = True

        self._call(do)

    def resume(self) -> None:
        """Forward again (what was read before the stall is delivered first)."""

        def do() -> None:
            self._stalled = False

        self._call(do)

    def refuse(self) -> None:
        """Stop listening: new connections are refused; live ones are not touched."""

        def do() -> None:
            if self._listener is not None:
                self._selector.unregister(self._listener)
                self._listener.close()
                self._listener = None

        self._call(do)

    def accept(self) -> None:
        """Listen again on the same port after :meth:`refuse`."""

        def do() -> None:
            if self._listener is None:
                self._listen(self.port)

        self._call(do)

    def close(self) -> None:
        """Close every connection and the listener, and stop the thread (idempotent)."""
        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError):
                self._call(self._shutdown)
            self._thread.join(timeout=10)
        if not self._closed:  # the thread is gone (lifetime over): tidy up from here
            self._shutdown()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, action: Callable[[], None], timeout: float = 10.0) -> None:
        """Run ``action`` on the proxy's thread and wait for it."""
        if not self._thread.is_alive():
            raise RuntimeError("the proxy is closed")
        done = threading.Event()
        self._commands.put((action, done))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if not done.wait(timeout):
            raise TimeoutError("the proxy did not answer")

    # -- the loop (the proxy's thread only) -------------------------------------------------------

    def _listen(self, port: int) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)
        self._listener = listener

    def _run(self) -> None:
        try:
            while not self._closed:
                if time.monotonic() > self._deadline:
                    self._shutdown()
                    return
                self._update_interest()
                for key, mask in self._selector.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._wake_r:
                        self._run_commands()
                    elif sock is self._listener:
                        self._accept_one()
                    elif sock in self._pipes:
                        self._service(self._pipes[sock], sock, mask)
                    if self._closed:
                        return
        finally:
            if not self._closed:
                self._shutdown()

    def _run_commands(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                action, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                action()
            finally:
                done.set()

    def _accept_one(self) -> None:
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self.accepted += 1
        try:
            upstream = socket.create_connection(self.target, timeout=self.connect_timeout)
        except OSError:
            _abort(client)  # the target is down: the client sees its connection reset
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe = _Pipe(client, upstream)
        for sock in (client, upstream):
            self._pipes[sock] = pipe  # registered by _update_interest (not while stalled)

    def _update_interest(self) -> None:
        """Register each socket for what it needs now; a stalled one is not watched at all."""
        for sock, pipe in list(self._pipes.items()):
            events = 0
            if not self._stalled:
                if not pipe.eof and len(pipe.outgoing(pipe.peer(sock))) < _BUFFER_LIMIT:
                    events |= selectors.EVENT_READ
                if pipe.outgoing(sock):
                    events |= selectors.EVENT_WRITE
            try:
                current = self._selector.get_key(sock).events
            except KeyError:
                current = 0
            if events == current:
                continue
            if current == 0:
                self._selector.register(sock, events)
            elif events == 0:
                self._selector.unregister(sock)
            else:
                self._selector.modify(sock, events)

    def _service(self, pipe: _Pipe, sock: socket.socket, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                pipe.eof = True
            elif data:
                pipe.outgoing(pipe.peer(sock)).extend(data)
        if mask & selectors.EVENT_WRITE:
            out = pipe.outgoing(sock)
            try:
                sent = sock.send(out)
                del out[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                pipe.eof = True
                out.clear()
        if pipe.eof and not pipe.to_client and not pipe.to_upstream:
            self._close_pipe(pipe, reset=False)
        elif pipe.eof:
            self._flush_and_close(pipe)

    def _flush_and_close(self, pipe: _Pipe) -> None:
        """One side closed: hand the other what is pending (briefly), then close both."""
        for sock in (pipe.client, pipe.upstream):
            out = pipe.outgoing(sock)
            if out:
                with contextlib.suppress(OSError):
                    sock.settimeout(0.5)
                    sock.sendall(out)
                out.clear()
        self._close_pipe(pipe, reset=False)

    def _close_pipe(self, pipe: _Pipe, *, reset: bool) -> None:
        for sock in (pipe.client, pipe.upstream):
            if self._pipes.pop(sock, None) is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
            if reset:
                _abort(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pipe in {id(p): p for p in self._pipes.values()}.values():
            self._close_pipe(pipe, reset=False)
        if self._listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0) rather than an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
