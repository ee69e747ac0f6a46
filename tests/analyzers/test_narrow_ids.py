"""Id columns held as int32 (``timeline.narrow_ids``, issue 27's memory cut) give the diagnosis the
int64 layout gives: the same JSON, byte for byte, on every labelled scenario, the shared real nsys
exports and a generated export; ``SRTSCOPE_WIDE_IDS=1`` is the int64 layout (the test switch)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from sample_traces import generate as scenarios
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.timeline import ID_COLUMNS, WIDE_IDS_ENV, narrow_ids
from srtscope.analyzers.readers import load_timeline
from tests.conftest import REAL_TRACES

SAMPLES = Path(scenarios.__file__).resolve().parent
_EXPECTED = json.loads((SAMPLES / "expected.json").read_text())
#: labelled scenarios the nsys reader reads (the refused ones are refused either way)
SCENARIOS = sorted(n for n, e in _EXPECTED.items()
                   if not e.get("refused") and all(f.endswith(".sqlite") for f in e["files"]))
REAL = sorted(p.name for p in (REAL_TRACES / "nsys").glob("*.sqlite")) if REAL_TRACES.is_dir() else []


def _both_ways(files: list[Path], monkeypatch) -> tuple[str, str, object]:
    """(JSON with narrowed ids, JSON with int64 ids, the narrowed Timeline)."""
    out = []
    for wide in ("0", "1"):
        monkeypatch.setenv(WIDE_IDS_ENV, wide)
        tl = load_timeline([str(f) for f in files], cache=False)
        out.append((json.dumps(diagnose(tl).to_json(), sort_keys=True), tl))
    (narrow, tl), (wide_json, wide_tl) = out
    for table in ("device", "api"):
        for c in ID_COLUMNS & set(getattr(wide_tl, table).columns):
            assert getattr(wide_tl, table)[c].dtype == np.int64, (table, c)
    return narrow, wide_json, tl


def _assert_narrowed(tl) -> None:
    """The cut took place: the device table's stream ids (small on every capture) are int32."""
    if len(tl.device):
        assert tl.device["stream"].dtype == np.int32


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_json_identical_with_narrow_ids(name, monkeypatch):
    narrow, wide, tl = _both_ways([SAMPLES / f for f in _EXPECTED[name]["files"]], monkeypatch)
    _assert_narrowed(tl)
    assert narrow == wide


@pytest.mark.parametrize("name", REAL)
def test_real_nsys_json_identical_with_narrow_ids(name, monkeypatch):
    narrow, wide, tl = _both_ways([REAL_TRACES / "nsys" / name], monkeypatch)
    _assert_narrowed(tl)
    assert narrow == wide


def test_generated_export_json_identical_and_cached_narrow(tmp_path, monkeypatch):
    sys.path.insert(0, str(SAMPLES.parent))
    from benchmarks.gen_nsys import generate

    path = tmp_path / "gen.sqlite"
    generate(path, 6)                          # ~60 k kernels, the benchmark's shape
    narrow, wide, tl = _both_ways([path], monkeypatch)
    _assert_narrowed(tl)
    assert narrow == wide
    monkeypatch.setenv(WIDE_IDS_ENV, "0")
    first = load_timeline([str(path)], cache=True)           # writes the table cache entry
    again = load_timeline([str(path)], cache=True)           # read back from it
    assert again.api["tid"].dtype == np.int32 == first.api["tid"].dtype
    assert json.dumps(diagnose(again).to_json(), sort_keys=True) == narrow


@pytest.mark.parametrize("values, narrowed", [
    ([0, 5, -1], True),
    ([-(2 ** 31), 2 ** 31 - 1], True),            # int32's own bounds
    ([0, 2 ** 31], False),                         # one value over: the whole column stays int64
    ([-(2 ** 31) - 1], False),
    ([], True),
])
def test_narrow_ids_only_where_every_value_fits(values, narrowed, monkeypatch):
    monkeypatch.delenv(WIDE_IDS_ENV, raising=False)
    cols = {"stream": np.asarray(values, np.int64), "start_ns": np.asarray(values, np.int64)}
    narrow_ids(cols)
    assert cols["stream"].dtype == (np.int32 if narrowed else np.int64)
    assert cols["start_ns"].dtype == np.int64                 # times are never narrowed
    assert cols["stream"].tolist() == values
