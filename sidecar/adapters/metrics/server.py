"""The HTTP server of ``/metrics``: bounded in threads, connections, time and bytes per client.

The trainer shares the pod's network namespace and is not trusted, so what a client can hold must
not grow with what it opens or how slowly it talks (prometheus_client's own server starts a thread
per connection, with no timeout). Here one thread serves every connection through a selector; a
connection is closed ``CONNECTION_TIMEOUT_S`` after it was accepted whatever it sent (an idle or
trickling client, a reader that never reads the reply); a request head over ``MAX_REQUEST_BYTES``
is dropped; and a connection beyond ``MAX_CONNECTIONS`` closes the oldest, so a scrape that arrives
while hostile connections are open still gets in. Constants, not settings: a scrape sends one small
request at once and reads one small reply, so no deployment needs other bounds.
"""

from __future__ import annotations

import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

CONNECTION_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
MAX_REQUEST_BYTES = 8192
_HEAD_END = re.compile(rb"\r?\n\r?\n")

StartResponse = Callable[[str, list[tuple[str, str]]], object]
WsgiApp = Callable[[dict[str, str], StartResponse], Iterable[bytes]]


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float  # monotonic
    received: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None  # what is left to send, once the request head is in


class BoundedHttpServer:
    """Serves ``app`` (a WSGI app, for a request head only: no body) on ``address:port`` from
    construction until :meth:`close`, one request per connection. OSError when it cannot bind."""

    def __init__(self, address: str, port: int, app: WsgiApp) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, port), family=family, backlog=MAX_CONNECTIONS)
        self._listener.setblocking(False)
        self._app = app
        self._wake, self._waker = socket.socketpair()  # close() writes, the serving thread returns
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake, selectors.EVENT_READ)
        # In accept order, which is deadline order: the first is the next to expire or be evicted.
        self._open: dict[socket.socket, _Connection] = {}
        self._thread = threading.Thread(target=self._serve, name="soak-metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        """Stop serving: the thread joined, every socket closed."""
        self._waker.send(b"x")
        self._thread.join()
        for conn in list(self._open.values()):
            self._drop(conn)
        self._selector.close()
        for sock in (self._listener, self._wake, self._waker):
            sock.close()

    def _serve(self) -> None:
        while True:
            for key, _events in self._selector.select(self._wait_s()):
                if key.fileobj is self._wake:
                    return
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._step(key.data)
            self._expire()

    def _wait_s(self) -> float | None:
        if not self._open:
            return None
        return max(0.0, next(iter(self._open.values())).deadline - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        while self._open and (oldest := next(iter(self._open.values()))).deadline <= now:
            self._drop(oldest)

    def _accept(self) -> None:
        while True:
            try:
                sock, _peer = self._listener.accept()
            except OSError:  # the backlog is empty (or the accept failed): back to the selector
                return
            sock.setblocking(False)
            if len(self._open) >= MAX_CONNECTIONS:
                self._drop(next(iter(self._open.values())))
            conn = _Connection(sock, time.monotonic() + CONNECTION_TIMEOUT_S)
            self._open[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _step(self, conn: _Connection) -> None:
        if self._open.get(conn.sock) is not conn:  # dropped earlier in this round (evicted)
            return
        try:
            if conn.reply is None:
                self._read(conn)
            else:
                self._write(conn, conn.reply)
        except OSError:  # reset by the client, or gone
            self._drop(conn)

    def _read(self, conn: _Connection) -> None:
        chunk = conn.sock.recv(MAX_REQUEST_BYTES - len(conn.received))
        conn.received += chunk
        end = _HEAD_END.search(conn.received)
        if end is None:
            if not chunk or len(conn.received) >= MAX_REQUEST_BYTES:
                self._drop(conn)
            return
        conn.reply = memoryview(self._respond(bytes(conn.received[: end.start()])))
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _write(self, conn: _Connection, reply: memoryview) -> None:
        conn.reply = reply[conn.sock.send(reply) :]
        if not conn.reply:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        del self._open[conn.sock]
        self._selector.unregister(conn.sock)
        conn.sock.close()

    def _respond(self, head: bytes) -> bytes:
        environ = request_environ(head)
        if environ is None:
            return http_response("400 Bad Request", [], b"")
        started: list[tuple[str, list[tuple[str, str]]]] = []
        try:
            body = b"".join(self._app(environ, lambda status, headers: started.append((status, headers))))
        except Exception:  # prometheus_client raises on some Accept headers: one reply, not the server
            return http_response("500 Internal Server Error", [], b"")
        ((status, headers),) = started
        return http_response(status, headers, body)


def request_environ(head: bytes) -> dict[str, str] | None:
    """The WSGI environ of a request head (request line and headers), None when it is not one."""
    request_line, *header_lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target, _version = parts
    path, _, query = target.partition("?")
    environ = {"REQUEST_METHOD": method, "PATH_INFO": unquote(path), "QUERY_STRING": query}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if colon:
            environ["HTTP_" + name.strip().upper().replace("-", "_")] = value.strip()
    return environ


def http_response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A whole HTTP/1.1 reply that closes the connection."""
    lines = [
        f"HTTP/1.1 {status}",
        *(f"{name}: {value}" for name, value in headers),
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
