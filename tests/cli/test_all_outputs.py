"""Every output format renders every trace we have (issue 29): each shared real trace and each
labelled scenario is diagnosed once with ``--json --markdown --html --perfetto --perfetto-kernels``
(in-process, one command per trace), exit 0, and each file is well-formed: Markdown through a GFM
parser, HTML balanced and offline (and in headless Chromium where installed), Perfetto through
``json`` and event checks. And when one output fails, the others are still written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from formats import CHROMIUM, browse, check_html, check_markdown, check_perfetto, console_messages
from typer.testing import CliRunner

from srtscope.cli import contract
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
EXPECTED = json.loads((SAMPLES / "expected.json").read_text())
SCENARIOS = sorted(n for n, e in EXPECTED.items() if not e.get("refused"))
REAL = ["kineto/hta_alexnet_a100_single.json.gz", "kineto/hta_ddp_convnet_a100_rank0of2_nccl_comm_args.json.gz",
        "kineto/hta_torchrec_train_a100_rank0of16_cudagraph_nccl.json.gz",
        "kineto/hta_triton_single_kernel_a100.json.gz", "kineto/kineto_tbplugin_resnet50_v100_2021_legacy.json.gz",
        "kineto/tracelens_hf_qwen1.5-0.5b_h100.json.gz",
        "kineto/tracelens_vllm_mi300_piecewise_hipgraph_replay_ROCm.json.gz",
        "nsys/cupy_power_iteration_t4_nvtx_nsys2025.3.sqlite",
        "nsys/fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite",
        "nsys/fastvideo_train_2xH100_nccl_before_nsys2026.2_300ms-window.sqlite",
        "nsys/nvfuser_crossentropy_bench_h200_nvtx_nsys2025.1.sqlite",
        "nsys/nvfuser_test_8xH100node_nvtx_nsys2024.6.sqlite", "nsys/pytorch_tiny_sum_rtx3080_nsys2026.1.sqlite",
        "nsys/saxpy_mpi_cuda_a100_nvtx_nsys2022.2.sqlite"]


def _all_outputs(files: list[Path], tmp: Path) -> tuple[dict, dict[str, Path]]:
    out = {"md": tmp / "r.md", "html": tmp / "r.html", "pf": tmp / "p.json"}
    r = CliRunner().invoke(app, ["diagnose", *map(str, files), "--json", "--markdown", str(out["md"]),
                                 "--html", str(out["html"]), "--perfetto", str(out["pf"]), "--perfetto-kernels"])
    assert r.exit_code == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert not r.stderr.strip() or "error" not in r.stderr, r.stderr
    doc = contract.check(json.loads(r.stdout))
    for p in out.values():
        assert p.is_file() and p.stat().st_size > 0, p
    return doc, out


def _check_files(doc: dict, out: dict[str, Path], tmp: Path) -> None:
    v = doc["verdict"]
    text = check_markdown(out["md"].read_text())
    assert f"{v['bottleneck'].upper()} / {v['cause']}" in text
    assert " ".join(v["summary"].split())[:120] in text           # escaping leaves the words as they were
    for cav in v["caveats"]:                                      # every caveat reaches the page
        assert cav.split(":", 1)[1].split()[0] in text, cav
    page = out["html"].read_text()
    check_html(page)
    assert len(page) < 1_000_000
    pf = check_perfetto(json.loads(out["pf"].read_text()), doc)
    kernels = sum(e.get("cat") == "kernel" for e in pf)
    assert kernels >= sum(int(k["count"]) for k in doc["top_kernels"])     # --perfetto-kernels: all of them
    if CHROMIUM:
        dom, log = browse(out["html"], tmp)
        assert "Bottleneck:" in dom and not console_messages(log), log[-2000:]


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_output_of_a_scenario(name, tmp_path):
    doc, out = _all_outputs([SAMPLES / f for f in EXPECTED[name]["files"]], tmp_path)
    _check_files(doc, out, tmp_path)


@pytest.mark.parametrize("rel", REAL, ids=[r.split("/")[-1].split("_nsys")[0].split(".json")[0] for r in REAL])
def test_every_output_of_a_real_trace(rel, tmp_path, real_traces):
    doc, out = _all_outputs([real_traces / rel], tmp_path)
    _check_files(doc, out, tmp_path)


def test_one_output_failing_leaves_the_others_written(tmp_path, monkeypatch):
    import srtscope.cli.markdown as markdown

    def broken(_doc: dict) -> str:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(markdown, "diagnosis_markdown", broken)
    md, page, pf = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "p.json"
    r = CliRunner().invoke(app, ["diagnose", str(SAMPLES / "healthy.sqlite"), "--markdown", str(md),
                                 "--html", str(page), "--perfetto", str(pf)])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srtscope: error: --markdown: ")
    assert str(md) in lines[0] and "AttributeError" in lines[0]
    assert page.is_file() and pf.is_file() and not md.exists()
    assert "Bottleneck: KERNEL" in r.stdout                        # the terminal report still printed
