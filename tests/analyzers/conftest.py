"""Fixtures shared by the analyzers' tests."""
from __future__ import annotations

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
