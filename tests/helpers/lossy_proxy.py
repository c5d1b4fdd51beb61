"""A TCP proxy on a loopback port in front of a storage server that loses the answer to one
request: it passes the first request whose request line matches on to the server, and
when the server answers it, closes the client's connection instead of passing the answer
back, as a network failure after the server acted does. The client library sees the
connection dropped and retries the request; the proxy passes every later request and
answer through.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from urllib.parse import urlsplit


class AnswerLosingProxy:
    """Proxy for the server at `upstream` (``http://host:port``, a path is ignored); its
    own address is `url`. `matched` counts the requests whose request line matched
    `request_line` (a pattern searched in each chunk a client sends)."""

    def __init__(self, upstream: str, request_line: re.Pattern[bytes]) -> None:
        address = urlsplit(upstream)
        assert address.hostname is not None
        assert address.port is not None
        self._upstream = (address.hostname, address.port)
        self._request_line = request_line
        self._lock = threading.Lock()
        self._lost = False
        self.matched = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="lossy-proxy", daemon=True)
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
            lose_answer = threading.Event()
            threading.Thread(
                target=self._requests, args=(client, server, lose_answer), daemon=True
            ).start()
            threading.Thread(
                target=self._answers, args=(server, client, lose_answer), daemon=True
            ).start()

    def _requests(
        self, client: socket.socket, server: socket.socket, lose: threading.Event
    ) -> None:
        while data := _receive(client):
            if self._request_line.search(data):
                with self._lock:
                    self.matched += 1
                    if not self._lost:
                        self._lost = True
                        lose.set()
            try:
                server.sendall(data)
            except OSError:
                return
        _shut(server)

    def _answers(self, server: socket.socket, client: socket.socket, lose: threading.Event) -> None:
        while data := _receive(server):
            # An interim "100 Continue" comes before the request's body: the server has not
            # acted yet, so it is passed on.
            if lose.is_set() and not data.startswith(b"HTTP/1.1 100"):
                _shut(client)
                _shut(server)
                return
            try:
                client.sendall(data)
            except OSError:
                return
        _shut(client)


def _receive(connection: socket.socket) -> bytes:
    try:
        return connection.recv(1 << 16)
    except OSError:
        return b""


def _shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        connection.shutdown(socket.SHUT_RDWR)
