"""The srtscope CLI through typer's test runner: commands, JSON contract, exit codes, errors."""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.cli.app import app

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
runner = CliRunner()


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env or {"COLUMNS": "100"})


def test_version_and_help():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.startswith("srtscope ")
    r = invoke("--help")
    assert r.exit_code == 0
    for cmd in ("run", "capture", "diagnose", "compare"):
        assert cmd in r.stdout


def _expected() -> dict:
    return json.loads((SAMPLES / "expected.json").read_text())


@pytest.mark.parametrize("scenario", ["scheduler_bound", "prep_bound", "kernel_bound", "healthy"])
def test_diagnose_json_contract_on_samples(scenario):
    exp = _expected()[scenario]
    files = [SAMPLES / f for f in exp["files"]] if "files" in exp else [SAMPLES / f"{scenario}.sqlite"]
    r = invoke("diagnose", *files, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)  # --json prints the contract and nothing else
    assert doc["verdict"]["bottleneck"] == exp["bottleneck"]
    assert 0.0 <= doc["verdict"]["confidence"] <= 1.0
    for key in ("count", "total_ns", "by_class"):
        assert key in doc["bubbles"]
    assert set(doc["bubbles"]["by_class"]) >= {"scheduler", "prep", "kernel", "sync", "unattributed"}
    for key in ("count", "graph", "eager", "eager_reasons"):
        assert key in doc["steps"]
    for key in ("total_ns", "exposed_ns", "skew_ns", "straggler_rank"):
        assert key in doc["comm"]
    assert doc["capture"]["format"] == "nsys-sqlite" and isinstance(doc["capture"]["warnings"], list)
    assert all(isinstance(v, int) for v in doc["bubbles"]["by_class"].values())


def test_diagnose_report_renders_in_80_columns():
    r = invoke("diagnose", SAMPLES / "scheduler_bound.sqlite", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = r.stdout
    assert "Bottleneck: SCHEDULER" in text and "bubbles:" in text and "steps:" in text
    # no wrapping damage: each table heading stays on one line
    assert any(line.startswith("bubbles: ") and "idle" in line for line in lines)


def test_diagnose_straggler_pair_names_rank():
    exp = _expected()
    key = next(k for k in exp if "straggler" in k)
    files = [SAMPLES / f for f in exp[key]["files"]]
    r = invoke("diagnose", *files, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["comm"]["straggler_rank"] == exp[key]["checks"]["straggler_rank"]
    assert doc["capture"]["ranks"] == [0, 1]


def test_diagnose_writes_markdown_and_perfetto(tmp_path):
    md, pf = tmp_path / "r.md", tmp_path / "b.json"
    r = invoke("diagnose", SAMPLES / "prep_bound.sqlite", "--markdown", md, "--perfetto", pf)
    assert r.exit_code == 0, r.stderr
    assert "**Bottleneck: PREP / batch_prep · " in md.read_text()
    assert "| `prepare_for_decode` |" in md.read_text()  # bubble time by stage (SGLang name)
    events = json.loads(pf.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["cat"] == "bubble"]
    assert slices and all(e["name"].startswith("bubble: ") for e in slices)
    assert {"bubble: prep"} <= {e["name"] for e in slices}
    assert all(e["dur"] > 0 for e in slices)


def test_diagnose_step_range_and_threshold():
    f = SAMPLES / "scheduler_bound.sqlite"
    full = json.loads(invoke("diagnose", f, "--json").stdout)
    part = json.loads(invoke("diagnose", f, "--json", "--steps", "0:10").stdout)
    assert part["steps"]["count"] == 10 < full["steps"]["count"]
    high = json.loads(invoke("diagnose", f, "--json", "--threshold-us", "100000").stdout)
    assert high["bubbles"]["count"] < full["bubbles"]["count"]


@pytest.mark.parametrize("args, message", [
    (["diagnose", "/nonexistent/trace.sqlite"], "no such file"),
    (["diagnose", "{tmp}"], "is a directory"),
    (["diagnose", "{junk}"], "{junk}"),
    (["diagnose", "{empty_json}"], "{empty_json}"),
    (["diagnose", str(SAMPLES / "healthy.sqlite"), "--steps", "x:y"], "--steps"),
    (["diagnose", str(SAMPLES / "healthy.sqlite"), "--steps", "5:2"], "--steps"),
    (["compare", "/nonexistent/a.sqlite", str(SAMPLES / "healthy.sqlite")], "no such file"),
    (["run", "--inject", "bogus=5"], "--inject"),
    (["run", "--inject", "sched=-5"], "--inject"),
    (["run", "--inject", "straggler=500@3", "--tp", "2"], "straggler_rank=3"),
    (["diagnose", str(SAMPLES / "healthy.sqlite"), "--steps", "5000:6000"], "selects no step"),
    (["capture", "--backend", "torch"], "needs a command"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 10)
    empty_json = tmp_path / "empty.json"
    empty_json.write_text("{}")
    subst = {"{tmp}": str(tmp_path), "{junk}": str(junk), "{empty_json}": str(empty_json)}
    args = [subst.get(a, a) for a in args]
    message = subst.get(message, message)
    r = invoke(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("srtscope: error: ") and message in err
    assert "Traceback" not in r.stdout + r.stderr


def test_capture_without_nsys_names_torch_backend(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    r = invoke("capture", "--out", tmp_path / "x", "--", "python", "-c", "pass")
    assert r.exit_code == 2
    assert "--backend torch" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_capture_torch_passes_exit_code_and_writes_kineto(tmp_path):
    script = tmp_path / "work.py"
    script.write_text("import sys, torch\n"
                      "x = torch.ones(64, 64)\n"
                      "for _ in range(3):\n    x = x @ x / 64\n"
                      "sys.exit(7)\n")
    out = tmp_path / "trace.json.gz"
    r = invoke("capture", "--backend", "torch", "--out", out, "--", sys.executable, script)
    assert r.exit_code == 7, r.stderr
    assert out.exists()
    d = invoke("diagnose", out, "--json")
    # a CPU-only Kineto trace has no kernels: a clear one-line error, or a diagnosis
    assert d.exit_code in (0, 2)
    if d.exit_code == 2:
        assert len(d.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("out, name", [
    ("cap", "cap"), ("cap.nsys-rep", "cap"), ("cap.sqlite", "cap"), ("cap.qdrep", "cap"),
    ("run.v2", "run.v2"),                         # a dot inside the name is not an extension
])
def test_nsys_plan_names_report_and_export_alike(tmp_path, out, name):
    from srtscope.cli.capture import nsys_plan

    plan = nsys_plan("/usr/bin/nsys", tmp_path / out, ["python", "x.py"])
    assert plan.report == tmp_path / f"{name}.nsys-rep" and plan.sqlite == tmp_path / f"{name}.sqlite"
    assert f"--output={plan.report}" in plan.profile and plan.export[-1] == str(plan.report)


def test_nsys_plan_flags(tmp_path):
    from srtscope.cli.capture import nsys_plan

    plan = nsys_plan("/usr/bin/nsys", tmp_path / "cap", ["python", "serve.py", "--x", "a b"],
                     capture_range=True)
    assert plan.profile[:2] == ["/usr/bin/nsys", "profile"]
    assert "--trace=cuda,nvtx,osrt" in plan.profile and "--cuda-graph-trace=node" in plan.profile
    assert "--capture-range=cudaProfilerApi" in plan.profile
    assert plan.profile[-4:] == ["python", "serve.py", "--x", "a b"]  # a list, never a shell string
    assert plan.export[:3] == ["/usr/bin/nsys", "export", "--type=sqlite"]
    assert plan.sqlite == tmp_path / "cap.sqlite" and str(plan.report) == plan.export[-1]


def test_compare_real_nccl_pair(fastvideo_pair, tmp_path):
    before, after = fastvideo_pair
    r = invoke("compare", before, after, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    figs = {f["figure"]: f for f in doc["figures"]}
    exposed = figs["comm.exposed_ns"]
    assert exposed["before"] != exposed["after"]
    # the gate: exit 3 when the chosen figure got worse than allowed, 0 when it did not
    worse = [f for f in doc["figures"] if f["worse"] and f["delta_pct"] and f["delta_pct"] > 1]
    assert worse, "the pair differs in at least one figure"
    gated = invoke("compare", before, after, "--fail-on-regression", "1", "--figure", worse[0]["figure"])
    assert gated.exit_code == 3 and "regression" in gated.stdout
    better = [f for f in doc["figures"] if f["better"]]
    if better:
        ok = invoke("compare", before, after, "--fail-on-regression", "1", "--figure", better[0]["figure"])
        assert ok.exit_code == 0


def test_compare_saved_diagnosis_json(tmp_path):
    saved = tmp_path / "baseline.json"
    r = invoke("diagnose", SAMPLES / "healthy.sqlite", "--json")
    saved.write_text(r.stdout)
    r = invoke("compare", saved, SAMPLES / "scheduler_bound.sqlite", "--fail-on-regression", "5")
    assert r.exit_code == 3
    assert "before: kernel" in r.stdout and "after: scheduler" in r.stdout


def test_compare_unknown_figure_is_bad_input():
    r = invoke("compare", SAMPLES / "healthy.sqlite", SAMPLES / "healthy.sqlite", "--figure", "nope")
    assert r.exit_code == 2 and "unknown figure" in r.stderr


def test_diagnose_real_traces_text_and_json(real_traces):
    for f in [real_traces / "kineto" / "hta_triton_single_kernel_a100.json.gz",
              real_traces / "nsys" / "pytorch_tiny_sum_rtx3080_nsys2026.1.sqlite"]:
        r = invoke("diagnose", f)
        assert r.exit_code == 0, r.stderr
        assert "Bottleneck:" in r.stdout
        j = json.loads(invoke("diagnose", f, "--json").stdout)
        assert j["verdict"]["bottleneck"] in ("kernel", "host")          # no engine stages in either


def test_run_small_workload_writes_traces_and_diagnoses(tmp_path):
    out = tmp_path / "run"
    r = invoke("run", "--requests", "4", "--max-new-tokens", "4", "--device", "cpu",
               "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["capture"]["format"] == "srtscope-probe"
    assert doc["steps"]["count"] >= 4 and doc["steps"]["eager_reasons"].get("no_cuda", 0) >= 1
    assert (out / "probe.rank0.json").exists() and (out / "chrome.rank0.json").exists()
    assert "srtscope run" in (out / "report.html").read_text()          # the HTML report beside the traces
    report = json.loads((out / "workload_report.json").read_text())
    assert report["num_requests"] == 4 and report["output_tokens"] == 16
    # which backend and graph sizes the engine used, for the user to see
    model = report["engine"].pop("model")                     # what model ran: the embedded one
    assert model["path"] is None and model["type"] == "llama" and model["tokenizer"] == "bytes"
    assert report["engine"] == {"device": "cpu", "device_name": "cpu", "nvtx": "off",
                                "attention_backend": "torch_native", "graph_capture_bs": []}


def test_run_report_says_what_the_engine_ran_on(tmp_path):
    r = invoke("run", "--requests", "2", "--max-new-tokens", "2", "--device", "cpu",
               "--out", tmp_path / "run")
    assert r.exit_code == 0, r.stderr
    assert "on cpu, torch_native attention, no CUDA graphs (not on CUDA)" in r.stdout


def test_run_with_injected_prep_delay_names_prep(tmp_path):
    r = invoke("run", "--requests", "2", "--max-new-tokens", "4", "--device", "cpu",
               "--inject", "prep=60000", "--out", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"]["bottleneck"] == "prep"
    # every forward step paid >= 60 ms of prep; all but the first lie inside the device's active
    # window (bubbles start after the first device activity), and are attributed to prep
    forwards = doc["steps"]["graph"] + doc["steps"]["eager"]
    assert doc["bubbles"]["by_class"]["prep"] >= 0.9 * 60_000_000 * (forwards - 1)


def test_capture_torch_of_an_engine_run(tmp_path):
    trace = tmp_path / "engine.json.gz"
    r = invoke("capture", "--backend", "torch", "--out", trace, "--",
               sys.executable, "-m", "srtscope.cli.app", "run", "--requests", "2", "--max-new-tokens", "3",
               "--device", "cpu", "--overlap", "--out", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.stderr
    assert trace.exists() and (tmp_path / "run" / "probe.rank0.json").exists()
    # the Kineto trace names our stages, on the scheduler thread and on the overlap loop's forward
    # thread alike (every thread is profiled, not only the one that started the profiler)
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    tids = {}
    for e in events:
        if e.get("cat") == "user_annotation":
            tids.setdefault(e["name"].split(" ")[0], set()).add(e["tid"])
    assert {"sched.schedule", "prep.batch", "run.sample"} <= tids.keys(), sorted(tids)
    assert tids["sched.schedule"].isdisjoint(tids["run.sample"])
    # on the CPU the forwards stand in for device activity: the Kineto trace is diagnosed by stage
    d = invoke("diagnose", trace, "--json")
    assert d.exit_code == 0, d.stderr
    doc = json.loads(d.stdout)
    assert doc["steps"]["source"] == "loop.step" and doc["steps"]["eager"] > 0
    assert any(w["code"] == "cpu_stand_in" for w in doc["capture"]["warnings"])


def test_capture_torch_of_a_tp_run_writes_one_trace_per_rank(tmp_path):
    # scenario: ranks are separate processes; each captures itself, named by its rank
    trace = tmp_path / "tp.json.gz"
    r = invoke("capture", "--backend", "torch", "--out", trace, "--",
               sys.executable, "-m", "srtscope.cli.app", "run", "--tp", "2", "--requests", "2", "--max-new-tokens", "2",
               "--device", "cpu", "--out", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.stderr
    # the launcher only waited: no trace of its own, so `diagnose tp*.json.gz` reads the ranks
    assert not (tmp_path / "tp.json.gz").exists()
    assert [ln.split()[-1] for ln in r.stderr.splitlines() if "wrote" in ln] == [
        str(tmp_path / "tp.rank0.json.gz"), str(tmp_path / "tp.rank1.json.gz")]
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((tmp_path / f"tp.rank{rank}.json.gz").read_bytes()))
        assert doc["distributedInfo"]["rank"] == rank
        names = {e["name"].split(" ")[0] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"}
        assert {"comm.all_reduce", "run.eager", "loop.step"} <= names


def test_capture_torch_reports_only_the_traces_it_wrote(tmp_path):
    # scenario: an earlier TP capture left rank traces in the folder; this one writes one trace
    import os
    import time

    stale = tmp_path / "x.rank0.json.gz"
    stale.write_bytes(b"old")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    r = invoke("capture", "--backend", "torch", "--out", tmp_path / "x.json.gz", "--",
               sys.executable, "-c", "pass")
    assert r.exit_code == 0, r.stderr
    assert [ln.split()[-1] for ln in r.stderr.splitlines() if "wrote" in ln] == [str(tmp_path / "x.json.gz")]


@pytest.mark.parametrize("name, ranked", [
    ("t.json.gz", "t.rank1.json.gz"), ("t.json", "t.rank1.json"), ("cap", "cap.rank1.json.gz")])
def test_rank_trace_path(name, ranked):
    from srtscope.probes.torch_capture import rank_trace_path

    assert rank_trace_path(Path("/x") / name, 1) == Path("/x") / ranked


@pytest.mark.parametrize("files, hint", [
    (["a.json.gz", "b.json.gz", "c.sqlite", "notes.txt"], "/*.json.gz (2 files)?"),
    (["rank0.sqlite"], "/*.sqlite (1 file)?"),
    (["notes.txt"], "(it holds no .sqlite, .json.gz, .json, .nsys-rep file)"),
])
def test_a_folder_given_as_a_trace_suggests_its_traces(tmp_path, files, hint):
    """The audit: a folder argument got no "did you mean folder/*.json.gz"."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for f in files:
        (folder / f).write_bytes(b"")
    r = invoke("diagnose", folder)
    lines = r.stderr.splitlines()
    assert r.exit_code == 2 and len(lines) == 1
    assert lines[0].startswith(f"srtscope: error: {folder}: is a directory, expected a trace file")
    assert lines[0].endswith(hint), lines[0]
