"""A hostile HTTP stand-in on 127.0.0.1: a thread per connection reads one request and writes what
``answer(request)`` gives, byte for byte (malformed status lines, oversized headers, broken chunked
bodies, redirects) or a piece at a time with pauses (a server that drips its answer)."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


#: what a server answers: the bytes to write, or pieces (bytes, seconds to pause after them)
Reply = bytes | Iterable[tuple[bytes, float]]


def reply(status: int, body: bytes = b"{}", reason: str = "OK", headers: dict[str, str] | None = None) -> bytes:
    """A well-formed HTTP/1.1 answer that closes the connection."""
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", "Connection: close",
            *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class RawServer:
    answer: Callable[[Request], Reply]
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.closed.set()
        self.sock.close()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                req = _read_request(conn)
                self.requests.append(req)
                out = self.answer(req)
                for piece, pause in ([(out, 0.0)] if isinstance(out, bytes) else out):
                    if self.closed.is_set():
                        return
                    conn.sendall(piece)
                    time.sleep(pause)
            except OSError:                     # the client hung up (it gave up: what is tested)
                pass


def _read_request(conn: socket.socket) -> Request:
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the headers")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        body += conn.recv(65536)
    method, path, _ = first.split(" ", 2)
    return Request(method, path, headers, body)
