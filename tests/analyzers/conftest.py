"""Fixtures shared by the analyzers' tests."""
from __future__ import annotations

import socket
import threading

import pytest

from srtscope.analyzers.cache import cache_store


@pytest.fixture
def private_cache(monkeypatch, tmp_path):
    """Cache every file (the samples are small) in this test's own folder; warnings counted fresh."""
    monkeypatch.setenv("SRTSCOPE_CACHE_MIN_BYTES", "0")
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))    # this test's own cache key
    monkeypatch.setattr(cache_store, "_warned", [False])
    monkeypatch.setattr(cache_store, "_noted", set())


@pytest.fixture
def silent_listener():
    """``127.0.0.1:PORT`` of a TCP listener that accepts every connection and never says a word
    (the audit's case for ``--cluster``: a scheduler that never greets)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    srv.close()
    for c in held:
        c.close()
