"""Shared fixtures: the real third-party traces (read in place) and a clean probe recorder."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the slow tier (``tests/slow_tier.py``) ``slow``: ``make test`` runs the others."""
    from tests.slow_tier import SLOW_TESTS

    for item in items:
        if item.nodeid.split("[", 1)[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
REAL_TRACES = REPO.parent / "shared" / "traces" / "real"


@pytest.fixture(autouse=True)
def _private_trace_cache(tmp_path_factory, monkeypatch):
    """Every test's table cache (``SRTSCOPE_CACHE_DIR``) and cache key (``XDG_CONFIG_HOME``) in
    temporary folders, never the user's."""
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("srtscope-cache")))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("srtscope-config")))


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """SIGINT, SIGTERM and SIGHUP as they were before the test: a CLI run in this process (the
    torch profiler's wrapper) may leave them ignored, which every child started later would
    inherit through exec (a Ctrl-C test then waits on a child that cannot be interrupted)."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        if signal.getsignal(s) is not h and h is not None:
            signal.signal(s, h)


@pytest.fixture
def real_traces() -> Path:
    if not REAL_TRACES.is_dir():
        pytest.skip(f"real traces not found at {REAL_TRACES} (needs the shared/ folder beside the repo)")
    return REAL_TRACES


@pytest.fixture
def fastvideo_pair(real_traces):
    """The real FastVideo 2xH100 before/after exports (nsys), read in place."""
    d = real_traces / "nsys"
    before = d / "fastvideo_train_2xH100_nccl_before_nsys2026.2_300ms-window.sqlite"
    after = d / "fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite"
    return before, after


@pytest.fixture
def recorder():
    """A fresh process-wide recorder with probes enabled (NVTX off); restored afterwards."""
    from srtscope.probes import ranges
    from srtscope.probes.recorder import Recorder, set_recorder

    rec = Recorder()
    old = set_recorder(rec)
    was = ranges.is_enabled()
    ranges.enable(nvtx=False)
    try:
        yield rec
    finally:
        if not was:
            ranges.disable()
        set_recorder(old)


@pytest.fixture
def probes_off():
    """After the test: probes disabled and the process recorder emptied (engines enable probes)."""
    yield
    from srtscope.probes import disable
    from srtscope.probes.recorder import get_recorder

    disable()
    get_recorder().clear()
