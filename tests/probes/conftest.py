"""Fixtures of the probes' tests."""
from __future__ import annotations

import importlib

import pytest
from fake_engine import forget, write_fake_engine

from srtscope.probes.engine_tables import ENGINES, VLLM
from srtscope.probes.instrument import WARNED_ENV, Instrumenter


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch, recorder):
    """A fake vLLM 0.32.0 (``fake_engine``) importable and instrumented by ``--instrument vllm``;
    the stage spans go to ``recorder``, which it yields."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(WARNED_ENV, "")
    write_fake_engine(tmp_path, VLLM, "0.32.0")
    inst = Instrumenter([VLLM], warn=lambda m: None).install()
    yield recorder
    inst.uninstall()
    for table in ENGINES.values():
        forget(table.package)
    importlib.invalidate_caches()
