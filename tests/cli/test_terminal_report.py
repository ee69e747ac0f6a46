"""The terminal report fits a terminal (issue 29): at 80 columns the default view of each shared real
trace is at most 60 lines, no line is wider, no word is split over two lines, no two kernel rows read
the same; ``--full`` shows every evidence line and caveat whole. Kernel names are shortened by a
rule that keeps them distinct and keeps the function name."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from test_all_outputs import REAL, SAMPLES

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.names import elide, short_names
from srtscope.cli.render import render_diagnosis

_DOCS: dict[str, dict] = {}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _doc(path: Path) -> dict:
    if str(path) not in _DOCS:
        _DOCS[str(path)] = diagnose(load_timeline([path])).to_json()
    return _DOCS[str(path)]


def report(d: dict, width: int = 80, full: bool = False) -> str:
    buf = io.StringIO()
    render_diagnosis(d, Console(file=buf, width=width, force_terminal=False, color_system=None), full=full)
    return buf.getvalue()


def _kernel_rows(text: str) -> list[str]:
    block = text.split("top kernels (share of kernel time")[1].split("\n", 3)[3]
    rows = []
    for ln in block.splitlines():
        m = re.match(r"^(.*?)\s{2,}\d+\s+\S+ \S+\s+\d+%$", ln)
        if not m:
            break
        rows.append(m.group(1).strip())
    return rows


def _check_fits(d: dict, lines_max: int = 60) -> str:
    text = report(d)
    lines = text.splitlines()
    assert len(lines) <= lines_max, f"{len(lines)} lines:\n{text}"
    assert max(len(ln) for ln in lines) <= 80
    # no word split: every word at 80 columns is a word of the JSON or of the widest full report
    wide = report(d, 400, True) + report(d, 400)
    vocab = set(_WORD.findall(json.dumps(d, ensure_ascii=False))) | set(_WORD.findall(wide))
    for ln in lines:
        for tok in ln.split():
            if tok.rstrip(")]").endswith("…") or tok.lstrip("([").startswith("…"):
                continue                                           # clipped on purpose, marked so
            for w in _WORD.findall(tok):
                assert w in vocab, f"{w!r} (a split word?) in: {ln!r}"
    for w in d.get("what_if") or []:
        if int(w["saved_ns"]) > 0 and w in d["what_if"][:3]:
            assert re.search(rf"^{re.escape(w['cause'])} \[\d\]", text, re.M), w["cause"]
    if d.get("top_kernels"):
        rows = _kernel_rows(text)
        assert len(rows) == min(5, len(d["top_kernels"]))
        names = [k["name"] for k in d["top_kernels"][:5]]
        assert len(set(rows)) == len(set(names)), rows        # different kernels never read the same
    v = d["verdict"]
    assert f"Bottleneck: {v['bottleneck'].upper()} / {v['cause']}" in text
    # the headline: line 1 the class, the cause and its one figure; line 2 what fixing it gives
    panel = [ln.strip("┃ ") for ln in lines if ln.startswith("┃")]
    assert panel[0].startswith(f"Bottleneck: {v['bottleneck'].upper()} / {v['cause']} · {v['headline']}")
    if v["gain"]:
        assert panel[1] == v["gain"][:len(panel[1])]
    assert lines[0].startswith("capture: ")
    if any(e["kind"].startswith("cause.") for e in v["evidence"]):
        assert "% of lost time" in text and "lost time = all device waiting" in text
    return text


@pytest.mark.parametrize("rel", REAL, ids=[r.split("/")[-1][:40] for r in REAL])
def test_default_report_of_a_real_trace_fits_80_columns(rel, real_traces):
    _check_fits(_doc(real_traces / rel))


@pytest.mark.parametrize("name", ["comm_straggler.rank0.sqlite", "scheduler_bound.sqlite", "eager_fallback.sqlite"])
def test_default_report_of_a_scenario_fits_80_columns(name):
    _check_fits(_doc(SAMPLES / name))


def test_full_report_shows_everything():
    d = _doc(SAMPLES / "scheduler_bound.sqlite")
    d["capture"]["warnings"].append({"code": "other", "message": "a long warning " + "word " * 60 + "END"})
    short, full = report(d), report(d, 120, full=True)
    flat = " ".join(full.replace("┃", " ").split())
    for e in d["verdict"]["evidence"]:
        assert " ".join(e["text"].split()) in flat, e
    assert "END" in full and "END" not in short                 # caveats whole in --full only
    for title in ("step budget:", "per-step strip", "what if:", "bubbles:", "top kernels"):
        assert title in full
    assert "--full" in short and "--full" not in full
    assert len(full.splitlines()) > len(short.splitlines())


def test_what_if_assumptions_are_footnotes_when_narrow_and_a_column_when_wide():
    d = _doc(SAMPLES / "scheduler_bound.sqlite")
    top = d["what_if"][0]
    narrow, wide = report(d, 80), report(d, 200, full=True)
    assert re.search(rf"^\[1\] {re.escape(top['assumptions'][0][:30])}", narrow, re.M)
    assert "assumes" in wide and not re.search(r"^\[1\] ", wide, re.M)


@pytest.mark.parametrize("names, width, expect", [
    # template arguments elided first, the function name kept
    (["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
      "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
      "ampere_sgemm_128x64_tn"], 48,
     ["at::native::vectorized_elementwise_kernel<…>", "ampere_sgemm_128x64_tn"]),
    # same function, different template arguments: the telling words are shown
    (["void at::native::elementwise_kernel<128, 2, at::native::AddFunctor<float> >(int)",
      "void at::native::elementwise_kernel<128, 2, at::native::MulFunctor<float> >(int)"], 50,
     ["at::native::elementwise_kernel<…> [AddFunctor]", "at::native::elementwise_kernel<…> [MulFunctor]"]),
    # short enough once the depth-1 arguments are back
    (["cutlass::Kernel<sm80_gemm_a>(Params)", "cutlass::Kernel<sm80_gemm_b>(Params)"], 48,
     ["cutlass::Kernel<sm80_gemm_a>", "cutlass::Kernel<sm80_gemm_b>"]),
    # overloads differ only in their parameters
    (["foo(int)", "foo(float)"], 30, ["foo(int)", "foo(float)"]),
])
def test_short_kernel_names(names, width, expect):
    assert short_names(names, width) == expect


def test_short_names_never_collide_nor_overflow():
    names = [f"void k<{'x' * 50}, {i % 3}, T{i}>(int)" for i in range(9)] + ["void k<a>(int)"] * 2
    out = short_names(names, 24)
    assert all(len(s) <= 24 for s in out)
    assert len(set(out)) == len(set(names))
    assert out[-1] == out[-2] == "k<a>"        # the same kernel twice reads the same; told from the k<…>s
    assert elide("bool operator<(a, b)", 0) == "bool operator<(a, b)"      # unbalanced: left whole


_BAD_NUMBER = re.compile(r"(?<![\d.,])1 (steps|bubbles|gaps|ranks|decode steps)\b|\(s\)|\{'|only 0 of|\d{10,} ns")


@pytest.mark.parametrize("rel", REAL, ids=[r.split("/")[-1][:40] for r in REAL])
def test_reports_speak_plainly(rel, real_traces):
    """The audit: ``1 bubbles``, ``1 steps``, ``rank(s)``, ``only 0 of``, a Python dict in the text
    (``({'unknown': 1})``) and raw epoch nanoseconds in a warning. The default and full reports and
    the verdict's own text are free of them."""
    d = _doc(real_traces / rel)
    text = report(d) + report(d, 200, full=True) + json.dumps(d["verdict"], ensure_ascii=False)
    text += " ".join(w["message"] for w in d["capture"]["warnings"])
    assert not _BAD_NUMBER.search(text), _BAD_NUMBER.search(text).group(0)
