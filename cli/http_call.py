"""One HTTP exchange with a server under ONE total deadline, every failure one line (``CallError``).

The deadline covers the whole exchange: the name lookup, the connection, the TLS handshake, sending
the request, the status line and headers, and the body (read up to a limit). Before every read the
socket's timeout is set to the time left, so a server that sends one byte at a time cannot stretch
it. Redirects are never followed: the caller sees the 3xx and its ``Location``.

``Target`` is a server's base URL, checked up front: http or https, a host, a numeric port, no
query, fragment or control characters; ``user:password@`` becomes HTTP basic auth and is never
shown (``Target.shown`` and ``redacted`` drop it).
"""
from __future__ import annotations

import base64
import http.client
import io
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from srtscope.cli.escape import terminal_line

#: the most characters of server-provided text (a reason, a body, a header) a message shows
SHOWN_CHARS = 200
#: a URL's userinfo: everything from ``//`` to the last ``@`` (a password may hold ``/`` or ``@``)
_USERINFO = re.compile(r"//.*@", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


class CallError(Exception):
    """Why one exchange failed, as one line with no URL in it (the caller names the call)."""


def redacted(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``, escaped for a terminal."""
    return terminal_line(_USERINFO.sub("//***@", url, count=1), SHOWN_CHARS)


def shown(text: object, limit: int = SHOWN_CHARS) -> str:
    """Server-provided text made safe for one terminal line: no escape sequences, at most ``limit``."""
    return terminal_line(text, limit)


@dataclass(frozen=True)
class Target:
    """A server's base URL: ``prefix`` is its path without the trailing slash ('' at the root);
    ``auth`` the ``Authorization`` header its userinfo gives (None without one)."""

    scheme: str
    host: str
    port: int
    prefix: str
    auth: str | None

    @property
    def shown(self) -> str:
        """The URL as messages print it: never the credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return terminal_line(f"{self.scheme}://{host}:{self.port}{self.prefix}", 1000)


def parse_target(url: str) -> Target:
    """``url`` as a ``Target``; ValueError (naming the URL without credentials) when it is none."""
    where = f"--server {redacted(url)}"
    if _CONTROL.search(url):
        raise ValueError(f"{where}: the URL holds spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:               # a port that is no number or out of range, bad [IPv6]
        raise ValueError(f"{where}: {shown(_USERINFO.sub('//***@', str(exc)))}; "
                         f"expected http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: expected http://HOST:PORT")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError(f"{where}: expected http://HOST:PORT[/PATH] with no ?query or #fragment")
    if not parts.path.isascii():
        raise ValueError(f"{where}: the path must be ASCII (percent-encode the rest)")
    auth = None
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        secret = urllib.parse.unquote(parts.password or "")
        auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode("ascii")
    return Target(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                  parts.path.rstrip("/"), auth)


@dataclass(frozen=True)
class Answer:
    """A server's answer: its status, reason, ``Location`` header ('' if none) and body text (at
    most the limit asked for, decoded as UTF-8 with replacement)."""

    status: int
    reason: str
    location: str
    text: str


def exchange(target: Target, method: str, path: str, body: bytes | None, timeout_s: float,
             limit: int = 1 << 20) -> Answer:
    """``method target.prefix+path`` within ``timeout_s`` in all; CallError on any failure."""
    deadline = time.monotonic() + timeout_s
    conn = _Connection(target, deadline)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if target.auth:
        headers["Authorization"] = target.auth
    answered = False
    try:
        conn.request(method, target.prefix + path, body=body, headers=headers)
        resp = conn.getresponse()
        answered = True
        data = resp.read(limit)
        if len(data) < limit and resp.length:      # NOTE: read(n) returns a body cut short as it is
            raise http.client.IncompleteRead(data, resp.length)
        return Answer(resp.status, resp.reason, resp.getheader("Location") or "",
                      data.decode("utf-8", "replace"))
    except TimeoutError:
        raise CallError(f"got no answer within {timeout_s:g} s" if not answered else
                        f"did not finish its answer within {timeout_s:g} s") from None
    except http.client.HTTPException as exc:
        raise CallError(f"answered with no valid HTTP ({type(exc).__name__}: "
                        f"{shown(exc) or 'the connection closed'})") from None
    except ssl.SSLError as exc:
        raise CallError(f"failed: TLS: {shown(exc.reason or exc)}") from None
    except (OSError, ValueError) as exc:      # refused, unreachable, no such host, reset, bad name
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CallError(f"failed: {shown(reason)}") from None
    finally:
        conn.release()


def _left(deadline: float) -> float:
    """Seconds to ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline")
    return left


def _resolve(host: str, port: int, deadline: float) -> list[tuple]:
    """``getaddrinfo`` within the deadline. NOTE: the lookup cannot be interrupted, so it runs in a
    daemon thread that is abandoned when the deadline passes."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(_left(deadline))
    if not box:
        raise TimeoutError("name lookup")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]  # type: ignore[return-value]


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side whose every ``recv`` waits at most the time left to the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What ``http.client`` uses of a socket (``sendall``, ``makefile``, ``close``), each under the
    deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(_left(self._deadline))   # NOTE: since 3.5, one timeout for all the data
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: object, **kw: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        """NOTE: http.client closes the connection as soon as it has read the headers of an answer
        that ends with the connection, while the body is still to be read (a real socket stays
        open until its ``makefile`` readers close): ``_Connection.release`` closes it instead."""


class _Connection(http.client.HTTPConnection):
    """An HTTP or HTTPS connection whose connect, handshake, sends and reads share one deadline."""

    def __init__(self, target: Target, deadline: float) -> None:
        super().__init__(target.host, target.port)
        self.default_port = 443 if target.scheme == "https" else 80   # the Host header omits it
        self._target, self._deadline = target, deadline
        self._raw: socket.socket | None = None

    def release(self) -> None:
        """Close the connection and its socket (the exchange is over)."""
        self.close()
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def connect(self) -> None:
        last: OSError = OSError("the name resolves to no address")
        for family, kind, proto, _, addr in _resolve(self.host, self.port, self._deadline):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(_left(self._deadline))
                sock.connect(addr)
                break
            except OSError as exc:            # TimeoutError is one: the deadline then ends the loop
                sock.close()
                last = exc
        else:
            raise last
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._target.scheme == "https":
                context = ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=self.host,
                                           do_handshake_on_connect=False)
                sock.settimeout(_left(self._deadline))
                sock.do_handshake()           # NOTE: CPython bounds the whole handshake by the timeout
        except BaseException:
            sock.close()
            raise
        self._raw = sock
        self.sock = _DeadlineSocket(sock, self._deadline)
