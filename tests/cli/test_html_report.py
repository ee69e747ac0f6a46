"""The HTML report: self-contained, escaped, small — and looked at in a real browser (headless
Chromium, where installed: `.ci/run` installs it, so CI always runs the browser tests)."""
from __future__ import annotations

import html as htmllib
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.html import diagnosis_html

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
EXPECTED = json.loads((SAMPLES / "expected.json").read_text())
SCENARIOS = sorted(n for n, e in EXPECTED.items() if not e.get("refused"))
REAL = ["nsys/fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite",
        "kineto/hta_ddp_convnet_a100_rank0of2_nccl_comm_args.json.gz"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--hide-scrollbars", "--window-size=1200,1600", "--enable-logging=stderr", "--v=0"]


def _report(files: list[Path]) -> tuple[dict, str]:
    d = diagnose(load_timeline(files)).to_json()
    return d, diagnosis_html(d)


def _png_variety(png: bytes) -> int:
    """Distinct byte values in a PNG's inflated image data: a blank page has a handful."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        kind = png[pos + 4:pos + 8]
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + n]
        pos += 12 + n
    return len(set(zlib.decompress(data)))


def _browse(page: Path, tmp: Path) -> tuple[str, str, bytes]:
    shot = tmp / "shot.png"
    r = subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--screenshot={shot}",
                        "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, r.stderr, shot.read_bytes()


def _check_in_browser(d: dict, page: Path, tmp: Path) -> None:
    dom, log, png = _browse(page, tmp)
    m = re.search(r'id="summary">([^<]*)<', dom)
    assert m and htmllib.unescape(m.group(1)) == d["verdict"]["summary"]
    assert f"/ {d['verdict']['cause']}" in htmllib.unescape(dom)
    assert not [ln for ln in log.splitlines() if "CONSOLE" in ln], log     # no console messages at all
    assert _png_variety(png) > 40, "the screenshot is blank"


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_report_is_self_contained_and_small(name, tmp_path):
    d, page = _report([SAMPLES / f for f in EXPECTED[name]["files"]])
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)   # opens offline
    assert re.findall(r"<script[^>]*>", page) == ["<script>"]             # one inline script: the zoom
    assert len(page) < 1_000_000                   # aggregates only, never one element per kernel
    assert htmllib.escape(d["verdict"]["summary"]) in page


def test_names_from_the_trace_are_escaped():
    d, _ = _report([SAMPLES / "healthy.sqlite"])
    d["top_kernels"][0]["name"] = '<img src=x onerror=alert(1)>[/bold]'
    d["capture"]["warnings"] = [{"code": "other", "message": "<script>alert(2)</script>"}]
    page = diagnosis_html(d)
    assert "<img src=x" not in page and "<script>alert" not in page
    assert page.count("<script") == 1                                     # ours, the zoom
    assert "&lt;img src=x onerror=alert(1)&gt;[/bold]" in page


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian package 'chromium'); "
                                              ".ci/run installs it so CI runs these")
@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_report_in_the_browser(name, tmp_path):
    d, page = _report([SAMPLES / f for f in EXPECTED[name]["files"]])
    path = tmp_path / f"{name}.html"
    path.write_text(page)
    _check_in_browser(d, path, tmp_path)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian package 'chromium'); "
                                              ".ci/run installs it so CI runs these")
@pytest.mark.parametrize("rel", REAL)
def test_real_trace_report_in_the_browser(rel, tmp_path, real_traces):
    d, page = _report([real_traces / rel])
    assert len(page) < 1_000_000
    path = tmp_path / "real.html"
    path.write_text(page)
    _check_in_browser(d, path, tmp_path)


def test_diagnose_writes_html_and_perfetto_with_kernels(tmp_path):
    from typer.testing import CliRunner

    from srtscope.cli.app import app
    page, trace = tmp_path / "r.html", tmp_path / "p.json"
    r = CliRunner().invoke(app, ["diagnose", str(SAMPLES / "copy_bound.sqlite"), "--html", str(page),
                                 "--perfetto", str(trace), "--perfetto-kernels"])
    assert r.exit_code == 0, r.stderr
    assert "Bottleneck: KERNEL" in page.read_text() and oct(page.stat().st_mode & 0o777) != "0o600"
    doc = json.loads(trace.read_text())
    assert any(e.get("cat") == "memcpy" for e in doc["traceEvents"])          # the copies themselves
    assert any(e.get("cat") == "bubble" for e in doc["traceEvents"])


def test_page_size_does_not_grow_with_the_step_count():
    """A long capture (tens of thousands of steps, as a 1 GB export has) draws one tick per column."""
    d, small = _report([SAMPLES / "healthy.sqlite"])
    dv = d["overview"]["devices"][0]
    span = dv["bin_ns"] * len(dv["kernel_ns"])
    dv["steps_ns"] = [dv["start_ns"] + i * span // 50_000 for i in range(50_000)]
    big = diagnosis_html(d)
    assert len(big) < len(small) + 200_000
