"""A TCP proxy on a loopback port in front of a storage server that spoils the answer to one
request: it passes the first request whose request line matches on to the server and,
when the server answers it, either closes the client's connection instead of passing the
answer back (a network failure after the server acted: the client library sees the
connection dropped and retries the request), or sends a given answer in its place (a
refusal the server itself would not give, such as a missing permission). Every other
request and answer passes through. `ConditionIgnoringProxy` instead makes the server a
store that ignores conditional writes.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from urllib.parse import urlsplit


def http_answer(status: str, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer with an XML `body`, closing the connection after it."""
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


class FaultyProxy:
    """Proxy for the server at `upstream` (``http://host:port``, a path is ignored); its
    own address is `url`. The first request whose request line matches `request_line` (a
    pattern searched in each chunk a client sends) gets no answer (`answer` None) or
    `answer` (`request_line` None: none); `matched` counts the requests that matched."""

    def __init__(
        self, upstream: str, request_line: re.Pattern[bytes] | None, answer: bytes | None = None
    ) -> None:
        address = urlsplit(upstream)
        assert address.hostname is not None
        assert address.port is not None
        self._upstream = (address.hostname, address.port)
        self._request_line = request_line
        self._answer = answer
        self._lock = threading.Lock()
        self._spoiled = False
        self.matched = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="faulty-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        _shut(self._listener)  # wakes the accept (Linux); closing alone would not
        self._listener.close()
        self._thread.join()
        with self._lock:
            for connection in self._connections:
                connection.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _address = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._upstream)
            with self._lock:
                self._connections += [client, server]
            spoil = threading.Event()
            threading.Thread(
                target=self._requests, args=(client, server, spoil), daemon=True
            ).start()
            threading.Thread(
                target=self._answers, args=(server, client, spoil), daemon=True
            ).start()

    def _requests(
        self, client: socket.socket, server: socket.socket, spoil: threading.Event
    ) -> None:
        while data := _receive(client):
            data = self._forwarded(data)
            if self._request_line is not None and self._request_line.search(data):
                with self._lock:
                    self.matched += 1
                    if not self._spoiled:
                        self._spoiled = True
                        spoil.set()
            try:
                server.sendall(data)
            except OSError:
                return
        _shut(server)

    def _forwarded(self, data: bytes) -> bytes:
        """What the server gets of a chunk a client sent."""
        return data

    def _answers(
        self, server: socket.socket, client: socket.socket, spoil: threading.Event
    ) -> None:
        partial = b""  # the start of an interim answer, its end in the next chunk
        while data := _receive(server):
            # An interim "100 Continue" comes before the request's body: the server has not
            # acted yet, so it is passed on. The final answer may come in the same chunk (a
            # busy machine reads both at once): only that is spoiled.
            interim, final = split_interim_answers(partial + data)
            partial = b""
            if spoil.is_set() and final.startswith(b"HTTP/1.1 1"):
                partial = final  # an interim answer cut short: not the final one
                with contextlib.suppress(OSError):
                    client.sendall(interim)
                continue
            data = interim + final
            if spoil.is_set() and final:
                with contextlib.suppress(OSError):
                    client.sendall(interim + (self._answer or b""))
                _shut(client)
                _shut(server)
                return
            try:
                client.sendall(data)
            except OSError:
                return
        _shut(client)


class ConditionIgnoringProxy(FaultyProxy):
    """Proxy for a server that makes it a store ignoring conditional writes, as older
    S3-compatible stores ignore ``If-None-Match: *`` on a PutObject: the header is dropped
    from every request (moto's server checks no signature)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, None)

    def _forwarded(self, data: bytes) -> bytes:
        return _IF_NONE_MATCH.sub(b"", data)


_IF_NONE_MATCH = re.compile(rb"\r\nIf-None-Match:[^\r]*", re.IGNORECASE)


def split_interim_answers(data: bytes) -> tuple[bytes, bytes]:
    """`data`, a chunk of a server's answers, as the whole interim (1xx) answers it starts
    with and the rest."""
    end = 0
    while data.startswith(b"HTTP/1.1 1", end) and (head_end := data.find(b"\r\n\r\n", end)) >= 0:
        end = head_end + 4
    return data[:end], data[end:]


def _receive(connection: socket.socket) -> bytes:
    try:
        return connection.recv(1 << 16)
    except OSError:
        return b""


def _shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        connection.shutdown(socket.SHUT_RDWR)
