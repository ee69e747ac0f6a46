"""Fast checks of the peer-comparison plumbing (benchmarks/peers, benchmarks/compare_*.py).

No timing assertions and no dependency on benchmarks/.peer-venv: the peers' side is skipped when the
venv is absent; everything else runs on tiny generated inputs.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
import common as C  # noqa: E402


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_wait4_measures_child_and_parses_json():
    r = C.run_wait4([sys.executable, "-c", "import json; b = bytearray(30 << 20); print(json.dumps({'n': len(b)}))"])
    assert r.ok and r.out == {"n": 30 << 20}
    assert r.maxrss_mb >= 30          # the child's own peak, not ours
    bad = C.run_wait4([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert not bad.ok and bad.rc == 3


def test_helpers():
    assert C.pct_diff(100, 95) == pytest.approx(5.0)
    assert C.pct_diff(0, 0) == 0.0 and C.pct_diff(None, 1) is None
    assert C.ratio(2.0, 5.0) == "2.50x" and C.ratio(None, 1.0) == "—"
    t = C.table(["a", "bb"], [["1", "2"], ["333", "4"]])
    assert t.splitlines()[0].startswith("| a ") and len(t.splitlines()) == 4
    cmd = C.srtscope_command(["x.sqlite"], 0)
    assert "x.sqlite" in cmd and "--threshold-us" in cmd


def test_findings_judges():
    f = _load("compare_findings")
    exp = {"bottleneck": "scheduler", "summary_prefix": "scheduler-bound", "checks": {}}
    out = {"verdict": {"bottleneck": "scheduler", "summary": "scheduler-bound: ...", "healthy": False}}
    assert f.judge_srtscope(exp, out)[0] == "yes"
    out["verdict"]["summary"] = "prep-bound: ..."
    assert f.judge_srtscope(exp, out)[0] == "partial"
    assert f.judge_srtscope(exp, None)[0] == "failed"
    assert f.judge_nsys_ai(exp, [{"severity": "info", "label": "Critical path is cpu-bound"}])[0] == "partial"
    assert f.judge_nsys_ai(exp, [{"severity": "info", "label": "Hotspot: k"}])[0] == "no"
    healthy = {"bottleneck": "kernel", "summary_prefix": "healthy", "checks": {"healthy": True}}
    assert f.judge_nsys_ai(healthy, [{"severity": "info", "label": "Hotspot"}])[0] == "yes"
    assert f.judge_nsys_ai(healthy, [{"severity": "warning", "label": "GPU idle"}])[0] == "no"


def test_generated_kineto_is_read_by_srtscope(tmp_path):
    out = tmp_path / "k.json.gz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers" / "gen_kineto.py"), "--kernels", "300",
                    str(out)], check=True, capture_output=True)
    from srtscope.analyzers.readers import load_timeline
    tl = load_timeline([out])
    assert len(tl.device) >= 288          # 2 steps x 24 layers x 6 kernels, plus copies
    assert set(tl.device["stream"].unique()) >= {7, 20}


@pytest.mark.skipif(not C.PEER_PY.exists(), reason="peer venv absent (benchmarks/peers/setup_peers.sh)")
def test_hta_driver_on_tiny_trace(tmp_path):
    if not C.peer_ok("hta"):
        pytest.skip(f"HTA not installed: {C.peer_status().get('hta')}")
    out = tmp_path / "k.json.gz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers" / "gen_kineto.py"), "--kernels", "300",
                    str(out)], check=True, capture_output=True)
    r = C.run_wait4([str(C.PEER_PY), str(ROOT / "benchmarks" / "peers" / "run_hta.py"), str(out),
                     "--include-last-profiler-step"], env=C.peer_env({"HTA_DISABLE_NS_ROUNDING": "1"}))
    assert r.ok, r.stderr
    assert r.out["temporal_idle_ns"] > 0 and r.out["streams"] == 2
