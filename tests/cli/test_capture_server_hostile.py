"""``srtscope capture --server`` against broken and hostile servers (``raw_server.RawServer`` on
127.0.0.1) and bad URLs: each is one ``srtscope: error:`` line and exit 2 (never a traceback),
within the deadline however slowly the server drips its answer; credentials in the URL are sent
as basic auth and never printed; what the server says is escaped and cut before it is printed."""
from __future__ import annotations

import base64
import json
import shutil
import socket
import time

import pytest
from cli_proc import SAMPLES, srtscope
from raw_server import RawServer, Reply, Request, reply

from srtscope.cli.http_call import CallError, exchange, parse_target

#: 5 kB of window-title (OSC), screen-clearing and colour (CSI, 8-bit CSI) escape sequences
EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[1;31mred\x9b31m" * 150
LONGEST_LINE = 1200


@pytest.fixture
def server():
    made: list[RawServer] = []

    def start(answer) -> RawServer:
        srv = RawServer(answer)
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.close()


def assert_printable(text: str) -> None:
    """No escape sequence or other control character reaches the terminal; every line is short."""
    assert not [c for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0], repr(text[:300])
    assert max(len(line) for line in text.splitlines()) < LONGEST_LINE, text[:300]


def on_start(answer: Reply):
    """A server whose /start_profile answers ``answer`` (anything else: 200)."""
    return lambda req: answer if req.path == "/start_profile" else reply(200)


def drip(head: bytes, piece: bytes = b"a", pause: float = 0.3, pieces: int = 400) -> Reply:
    """``head``, then ``piece`` every ``pause`` s: an answer that never ends in time."""
    return [(head, pause)] + [(piece, pause)] * pieces


MALFORMED = [
    ("garbage status line", b"SSH-2.0-OpenSSH\x1b]0;owned\x07\r\n\r\n", "BadStatusLine"),
    ("header line over 64 KiB", b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", "LineTooLong"),
    ("500 headers", b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(500)) + b"\r\n",
     "more than 100 headers"),
    ("chunked body cut short", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "IncompleteRead"),
    ("body cut short", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", "IncompleteRead"),
    ("chunk size no number", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab", "no valid HTTP"),
    ("307 on POST", reply(307, b"", "Temporary Redirect", {"Location": "http://u:pw@elsewhere/\x1b]0;x\x07"}),
     "HTTP 307"),
    ("500 with 5 kB of escapes", reply(500, EVIL.encode(), "Internal Server Error"), "HTTP 500"),
]


@pytest.mark.parametrize("answer, needle", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_answer_is_one_line(server, answer, needle):
    srv = server(on_start(answer))
    t0 = time.monotonic()
    done = srtscope("capture", "--server", srv.url, "--load", "0", "--timeout", "5")
    line = done.one_error_line(2, f"POST {srv.url}/start_profile", needle)
    assert_printable(done.stderr)
    assert time.monotonic() - t0 < 15
    assert [r.path for r in srv.requests] == ["/start_profile"]    # nothing sent on, no stop needed
    if "307" in needle:
        assert "redirect to http://***@elsewhere/" in line and "pw" not in line


@pytest.mark.parametrize("url, needle", [
    ("http://127.0.0.1:abc", "expected http://HOST:PORT"),
    ("http://127.0.0.1:99999", "expected http://HOST:PORT"),
    ("http://[::1", "expected http://HOST:PORT"),
    ("http://user:s3cret@127.0.0.1:abc/", "--server http://***@127.0.0.1:abc/"),
    ("http://127.0.0.1:8000/?x=1", "no ?query"),
])
def test_bad_url_is_one_line(url, needle):
    done = srtscope("capture", "--server", url, "--load", "0")
    line = done.one_error_line(2, needle)
    assert "s3cret" not in line


def test_url_with_crlf_sends_nothing(server):
    srv = server(lambda req: reply(200))
    done = srtscope("capture", "--server", f"{srv.url}/\r\nX-Injected: 1", "--load", "0")
    done.one_error_line(2, "control characters")
    assert_printable(done.stderr)
    assert srv.requests == []


@pytest.mark.parametrize("answer, needle", [
    (drip(b"HTTP/1.1 200 OK\r\nX-Drip: "), "start_profile got no answer within 2 s"),
    (drip(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"), "start_profile did not finish its answer within 2 s"),
], ids=["headers", "body"])
def test_dripping_server_is_bounded_by_one_total_deadline(server, answer, needle):
    # scenario: one byte every 0.3 s; a timeout per recv would never fire
    srv = server(on_start(answer))
    t0 = time.monotonic()
    done = srtscope("capture", "--server", srv.url, "--load", "0", "--timeout", "2")
    took = time.monotonic() - t0
    done.one_error_line(2, needle)
    assert took < 3 * 2, took


def test_exchange_deadline_holds_in_process(server):
    srv = server(lambda req: drip(b"HTTP/1.1 200 OK\r\n", b"X: y\r\n", pause=0.2))
    t0 = time.monotonic()
    with pytest.raises(CallError, match="no answer within 1 s"):
        exchange(parse_target(srv.url), "GET", "/", None, 1.0)
    assert time.monotonic() - t0 < 3


def test_load_stops_at_the_first_request_without_answer(server, tmp_path):
    # scenario: completions that never finish: the capture ends after one more deadline, not one per request
    def answer(req: Request) -> Reply:
        if req.path == "/v1/models":
            return reply(200, b'{"data": [{"id": "m"}]}')
        return drip(b"HTTP/1.1 200 OK\r\nX: ") if req.path == "/v1/completions" else reply(200)

    srv = server(answer)
    t0 = time.monotonic()
    done = srtscope("capture", "--server", srv.url, "--trace-dir", tmp_path, "--load", "40",
                    "--concurrency", "2", "--timeout", "1", "--wait", "1")
    took = time.monotonic() - t0
    done_lines = done.stderr.strip().splitlines()
    assert done.code == 2 and done_lines[-1].startswith("srtscope: error: the server wrote no trace"), done.stderr
    assert "load: 0/2 requests answered" in done.stderr and "got no answer within 1 s" in done.stderr
    assert [r.path for r in srv.requests].count("/v1/completions") == 2
    assert srv.requests[-1].path == "/stop_profile"
    assert took < 3 * (1 + 1) + 2, took


def test_server_text_is_escaped_and_cut(server, tmp_path):
    # scenario: a model name and an error body of 5 kB of escape sequences
    def answer(req: Request) -> Reply:
        if req.path == "/v1/models":
            return reply(200, json.dumps({"data": [{"id": EVIL}]}).encode())
        return reply(500, EVIL.encode(), EVIL[:40]) if req.path == "/v1/completions" else reply(200)

    srv = server(answer)
    done = srtscope("capture", "--server", srv.url, "--trace-dir", tmp_path, "--load", "2",
                    "--timeout", "5", "--wait", "0.5")
    assert done.code == 2 and "(model ]0;owned[2J[1;31mred31m" in done.stderr, done.stderr
    assert "first failure: POST" in done.stderr and "HTTP 500" in done.stderr
    assert_printable(done.stderr)


AUTH = "Basic " + base64.b64encode(b"user:p@ss:word").decode()


def test_userinfo_is_sent_as_basic_auth_and_never_printed(server, tmp_path):
    def answer(req: Request) -> Reply:
        if req.headers.get("authorization") != AUTH:
            return reply(401, b"{}", "Unauthorized", {"WWW-Authenticate": 'Basic realm="x"'})
        if req.path == "/stop_profile":
            shutil.copyfile(SAMPLES / "profiler_steps.json.gz", tmp_path / "1-TP-0.trace.json.gz")
        return reply(200)

    srv = server(answer)
    done = srtscope("capture", "--server", f"http://user:p%40ss%3Aword@127.0.0.1:{srv.port}",
                    "--trace-dir", tmp_path, "--load", "0", "--duration", "0.1", "--no-diagnose")
    assert done.code == 0, done.stderr
    assert f"profiling http://127.0.0.1:{srv.port} for 0.1 s" in done.stderr
    assert "1-TP-0.trace.json.gz" in done.stderr and "p%40ss" not in done.stderr
    assert [r.path for r in srv.requests] == ["/start_profile", "/stop_profile"]

    wrong = srtscope("capture", "--server", f"http://user:s3cret@127.0.0.1:{srv.port}", "--load", "0")
    line = wrong.one_error_line(2, f"POST http://127.0.0.1:{srv.port}/start_profile: HTTP 401")
    assert "s3cret" not in line


def test_credentials_never_printed_when_nothing_answers():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()                              # nothing listens there now
    done = srtscope("capture", "--server", f"http://user:s3cret@127.0.0.1:{port}/", "--load", "0")
    line = done.one_error_line(2, "refused")
    assert "s3cret" not in line and "user" not in line


def test_target_parts():
    t = parse_target("https://a%20b:c%2Fd@example.org/v1/")
    assert (t.scheme, t.host, t.port, t.prefix, t.shown) == ("https", "example.org", 443, "/v1",
                                                             "https://example.org:443/v1")
    assert t.auth == "Basic " + base64.b64encode(b"a b:c/d").decode()
    assert parse_target("http://[::1]:8000").shown == "http://[::1]:8000"
