"""``srtscope capture`` with the interpreter the user names, ``--instrument`` and its bootstrap.

The profiled command runs in another interpreter than srtscope's (the base Python of the test's
venv, which has neither srtscope nor torch unless PYTHONPATH brings srtscope), on a fake engine
shaped like vLLM's declared table (``tests/probes/fake_engine.py``)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes"))
from fake_engine import write_fake_engine  # noqa: E402

from srtscope.probes.engine_tables import VLLM  # noqa: E402
from srtscope.probes.export import read_probe_stream  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "srtscope"]
OTHER_PYTHON = getattr(sys, "_base_executable", None) or sys.executable
TIMEOUT_S = 120

# one engine step: schedule 4 ms, prepare 0.5 ms, forward 2 ms, sample, result; 3 steps here and 5
# in a forked child (an engine core process); the output must be what it is without srtscope
DRIVER = """\
import multiprocessing, os, sys
from vllm._fake_out import HOOKS
from vllm.v1.engine.core import EngineCore
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

sched, runner = Scheduler(), GPUModelRunner()

def step(x):
    out = sched.schedule({"r1": 1, "r2": 1}, sleep_s=0.004)
    runner._prepare_inputs(out, sleep_s=0.0005)
    runner._sample(runner._model_forward(sleep_s=0.002))
    sched.update_from_output(out)

HOOKS["EngineCore.step"] = step

def engine_core(n):
    for _ in range(n):
        EngineCore().step()

engine_core(3)
child = multiprocessing.get_context("fork").Process(target=engine_core, args=(5,))
child.start(); child.join()
try:
    sched.update_from_output(fail=True)
except ValueError as exc:
    print("raised:", exc)
print("python:", sys.executable)
print("switches:", os.environ.get("VLLM_CUSTOM_SCOPES_FOR_PROFILING"),
      os.environ.get("SGLANG_ENABLE_NVTX_SCHEDULER"))
sys.exit(3)
"""


def _run(cmd: list, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_CUSTOM_SCOPES_FOR_PROFILING")}
    env.update({"COLUMNS": "100", "PYTHONDONTWRITEBYTECODE": "1", **env_extra})
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=cwd, env=env)


@pytest.fixture
def engine(tmp_path):
    root = tmp_path / "engine"
    write_fake_engine(root, VLLM, "0.32.0")
    (root / "drive.py").write_text(DRIVER)
    # the user's own sitecustomize: it must still run under the capture's bootstrap
    (root / "sitecustomize.py").write_text("import sys\nsys.stderr.write('user sitecustomize ran\\n')\n")
    return root


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _spans(path: Path) -> list[str]:
    doc = read_probe_stream(path).doc         # a process's trace is a stream of its flushes
    return [doc["strings"][i] for i in doc["spans"]["name"]]


def test_capture_runs_the_named_interpreter_and_instruments_each_process(engine, tmp_path):
    plain = _run([OTHER_PYTHON, engine / "drive.py"], {"PYTHONPATH": str(engine)}, engine)
    out = tmp_path / "out" / "cap"
    pythonpath = os.pathsep.join([str(engine), str(REPO)])
    r = _run([*CLI, "capture", "--backend", "probe", "--instrument", "vllm", "--out", out, "--",
              OTHER_PYTHON, "drive.py"], {"PYTHONPATH": pythonpath}, engine)
    # the program, its output and exit code are its own: the named interpreter ran it
    assert r.returncode == plain.returncode == 3, r.stderr
    assert f"python: {OTHER_PYTHON}" in r.stdout
    assert "raised: Scheduler.update_from_output failed" in r.stdout
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if not ln.startswith("switches")] == \
        [ln for ln in plain.stdout.splitlines() if not ln.startswith("switches")]
    # the engine's own switches: set by the capture (not the nsys-only ones)
    assert "switches: 1 None" in lines and "switches: None None" in plain.stdout
    assert "user sitecustomize ran" in r.stderr
    # one probe trace per process that ran instrumented functions: the driver and its fork
    traces = sorted(out.parent.glob("cap.pid*.json.gz"))
    assert len(traces) == 2, r.stderr
    counts = sorted(_spans(t).count("loop.step") for t in traces)
    assert counts == [3, 5]
    for t in traces + [out.parent / "cap.json.gz"]:
        assert (t.stat().st_mode & 0o777) == 0o666 & ~_umask()      # as every output: the umask's mode
    for t in traces:
        assert str(t) in r.stderr
    # and the two as one trace, on one clock, with every span of both
    merged = out.parent / "cap.json.gz"
    assert f"wrote {merged} (the 2 processes on one clock" in r.stderr
    names = _spans(merged)
    assert names.count("loop.step") == 8 and len(names) == sum(len(_spans(t)) for t in traces)
    doc = json.loads(gzip.decompress(merged.read_bytes()))
    assert doc["spans"]["start_ns"] == sorted(doc["spans"]["start_ns"]) and len(doc["meta"]["pids"]) == 2
    by_pid = {int(t.name.split(".pid")[1].split(".")[0]): _spans(t) for t in traces}
    parent = [names for names in by_pid.values() if names.count("loop.step") == 3][0]
    assert parent.count("sched.result") == 4          # 3 steps + the call that raised
    assert {"sched.schedule", "prep.batch", "run.eager", "run.sample"} <= set(parent)
    # diagnosed by stage: the scheduler's 4 ms of each step is the bottleneck
    d = _run([*CLI, "diagnose", merged, "--json"], {}, tmp_path)
    assert d.returncode == 0, d.stderr
    doc = json.loads(d.stdout)
    assert doc["verdict"]["bottleneck"] == "scheduler"
    assert doc["steps"]["source"] == "loop.step" and doc["steps"]["count"] == 8


def test_capture_instruments_an_interpreter_without_srtscope_and_writes_nothing_into_the_checkout(
        engine, tmp_path):
    # scenario: the engine's own interpreter has no srtscope and no PYTHONPATH to it; the capture
    # puts its own import path in place, which holds srtscope only (not the checkout's analyzers/,
    # cli/, ... nor the user's folders), and the checkout is left as it was
    probe = engine / "probe.py"
    probe.write_text("import importlib.util, srtscope\n"
                     "print('srtscope from:', srtscope.__file__)\n"
                     "print('checkout folders importable:', [m for m in ('analyzers', 'cli', 'probes', "
                     "'engine', 'benchmarks') if importlib.util.find_spec(m)])\n")
    before = sorted(p for p in REPO.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts)
    out = tmp_path / "out" / "cap"
    r = _run([*CLI, "capture", "--backend", "probe", "--instrument", "vllm", "--out", out, "--",
              OTHER_PYTHON, "drive.py"], {"PYTHONPATH": str(engine)}, engine)
    assert r.returncode == 3, r.stderr
    assert "not instrumented" not in r.stderr and "warning" not in r.stderr, r.stderr
    assert sorted(_spans(t).count("loop.step") for t in out.parent.glob("cap.pid*.json.gz")) == [3, 5]
    r = _run([*CLI, "capture", "--backend", "probe", "--instrument", "vllm", "--out", out, "--",
              OTHER_PYTHON, "probe.py"], {"PYTHONPATH": str(engine)}, engine)
    assert r.returncode == 0, r.stderr
    where = r.stdout.split("srtscope from: ")[1].split()[0]
    assert "srtscope-boot-" in where and not where.startswith(str(REPO))
    assert "checkout folders importable: []" in r.stdout
    assert not Path(where).exists()                  # the import path is removed afterwards
    after = sorted(p for p in REPO.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts)
    assert after == before


def test_capture_says_in_one_line_why_an_interpreter_cannot_run_srtscope(engine, tmp_path):
    # an interpreter that cannot import srtscope from the capture's path (here: one that fails
    # every import, as a Python older than 3.10 fails srtscope's syntax)
    old = tmp_path / "bin" / "python3.8"
    old.parent.mkdir()
    old.write_text("#!/bin/sh\necho 'SyntaxError: invalid syntax' >&2\nexit 1\n")
    old.chmod(0o755)
    out = tmp_path / "out" / "cap"
    r = _run([*CLI, "capture", "--backend", "probe", "--instrument", "vllm", "--out", out, "--",
              old, "drive.py"], {"PYTHONPATH": str(engine)}, engine)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln != "user sitecustomize ran"]
    assert len(lines) == 1 and lines[0].startswith("srtscope: error: "), r.stderr
    assert f"not importable by {old} (SyntaxError: invalid syntax)" in lines[0]
    assert "Python >= 3.10" in lines[0] and str(REPO) not in lines[0]
    assert r.stdout == "" and not list(out.parent.glob("*"))      # the program never ran


def test_capture_torch_instrumented_stages_in_the_kineto_trace(engine, tmp_path):
    pytest.importorskip("torch")
    trace = tmp_path / "t.json.gz"
    r = _run([*CLI, "capture", "--backend", "torch", "--instrument", "vllm", "--out", trace, "--",
              sys.executable, "-c", "import torch, runpy; runpy.run_path('drive.py', run_name='__main__')"],
             {"PYTHONPATH": os.pathsep.join([str(engine), str(REPO)])}, engine)
    assert r.returncode == 3, r.stderr
    names = [e["name"].split(" ")[0] for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
             if e.get("cat") == "user_annotation"]
    assert names.count("loop.step") == 3, sorted(set(names))
    # (the mode is known only when schedule() returns: it reaches the probe spans, not the annotation)
    assert {"sched.schedule", "prep.batch", "run.eager", "run.sample"} <= set(names)
    # the forked engine-core child profiled itself
    child = list(tmp_path.glob("t.pid*.json.gz"))
    assert len(child) == 1 and str(child[0]) in r.stderr, r.stderr
    child_names = [e["name"].split(" ")[0]
                   for e in json.loads(gzip.decompress(child[0].read_bytes()))["traceEvents"]
                   if e.get("cat") == "user_annotation"]
    assert child_names.count("loop.step") == 5


def test_probe_trace_survives_a_sigkilled_process(engine, tmp_path):
    # scenario: an engine's worker is SIGKILLed at shutdown (vLLM does so): the periodic flush stays
    (engine / "killed.py").write_text(
        "import os, signal, time\n"
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "for _ in range(4):\n    Scheduler().schedule()\n"
        "time.sleep(1.5)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "k"
    r = _run([*CLI, "capture", "--backend", "probe", "--instrument", "vllm", "--out", out, "--",
              OTHER_PYTHON, "killed.py"],
             {"PYTHONPATH": os.pathsep.join([str(engine), str(REPO)]), "SRTSCOPE_PROBE_FLUSH_S": "0.2"},
             engine)
    assert r.returncode == 128 + 9, r.stderr
    traces = list(tmp_path.glob("k.pid*.json.gz"))
    assert len(traces) == 1 and _spans(traces[0]).count("sched.schedule") == 4


# SGLang's shape: the scheduler runs in a spawned child; the parent's shutdown SIGKILLs it right
# after the last result (Engine.shutdown -> kill_process_tree), so none of its exit code runs
SPAWNED = """\
import multiprocessing, os, signal, time
from vllm._fake_out import HOOKS
from vllm.v1.engine.core import EngineCore
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

def step(x):
    out = Scheduler().schedule({"r1": 1}, sleep_s=0.004)
    GPUModelRunner()._sample(GPUModelRunner()._model_forward(sleep_s=0.004))

def scheduler(q):
    HOOKS["EngineCore.step"] = step
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 1.5:
        EngineCore().step()
        n += 1
    q.put(n)
    time.sleep(60)                          # idle until killed

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=scheduler, args=(q,))
    child.start()
    EngineCore().add_request()
    print("child steps:", q.get(), "child pid:", child.pid, flush=True)
    os.kill(child.pid, signal.SIGKILL)       # the engine's shutdown
    child.join()
"""


def test_a_sigkilled_spawned_scheduler_keeps_its_steps_in_the_merged_trace(engine, tmp_path):
    # scenario: capture --backend probe of a script whose engine SIGKILLs its scheduler process at
    # shutdown, at the default flush interval: the child's flushes before the kill are merged
    (engine / "spawned.py").write_text(SPAWNED)
    out = tmp_path / "sp"
    r = _run([*CLI, "capture", "--backend", "probe", "--instrument", "vllm", "--out", out, "--",
              OTHER_PYTHON, "spawned.py"], {"PYTHONPATH": os.pathsep.join([str(engine), str(REPO)])}, engine)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("child steps:")][0].split()
    steps, pid = int(line[2]), int(line[5])
    assert f"srtscope: note: sp.pid{pid}.json.gz: process {pid} ended without its exit flush" in r.stderr
    merged = tmp_path / "sp.json.gz"
    names = _spans(merged)
    assert names.count("sched.recv") == 1                  # the parent's own call
    # all but the steps of the child's last flush interval (0.5 s of 1.5 s) are kept
    kept = names.count("loop.step")
    assert steps / 3 <= kept <= steps, (kept, steps)
    assert names.count("run.eager") == kept
    d = _run([*CLI, "diagnose", merged, "--json"], {}, tmp_path)
    assert d.returncode == 0, d.stderr
    warned = {w["code"]: w["message"] for w in json.loads(d.stdout)["capture"]["warnings"]}
    assert f"process {pid} ended without its exit flush" in warned["ended_early"]


@pytest.mark.parametrize("args, needle", [
    (["--backend", "torch", "--", "/etc/hostname"], "cannot run /etc/hostname: Exec format error"),
    (["--backend", "torch", "--", "python", "-m"], "-m needs a module"),
    (["--backend", "torch", "--", "python", "-c"], "-c needs code"),
    (["--backend", "torch", "--", "python"], "names no script"),
    (["--backend", "torch", "--", "python", "-X"], "-X needs a value"),
    (["--backend", "torch", "--", "python", "-"], "stdin"),
    (["--backend", "probe", "--", "python", "x.py"], "add --instrument"),
    (["--backend", "probe", "--instrument", "tensorrt", "--", "python", "x.py"], "--instrument"),
])
def test_capture_bad_commands_one_line_and_no_trace(tmp_path, args, needle):
    r = _run([*CLI, "capture", "--out", tmp_path / "cap", *args], {}, tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("srtscope: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []


def test_capture_nsys_instruments_with_nvtx_and_sets_the_nsys_switches(engine, tmp_path):
    # scenario: under nsys (a stand-in on PATH that runs the command), in an interpreter without the
    # nvtx package: one warning line says how to get the ranges into nsys; the engines' NVTX
    # switches are set; the program's output and exit code are its own
    from test_capture_nsys import FAKE_NSYS

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(FAKE_NSYS.format(python=sys.executable))
    (bin_dir / "nsys").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_NSYS_LOG": str(tmp_path / "log"),
           "FAKE_NSYS_SAMPLE": str(REPO / "sample_traces" / "prep_bound.sqlite"),
           "PYTHONPATH": os.pathsep.join([str(engine), str(REPO)])}
    r = _run([*CLI, "capture", "--instrument", "vllm", "--out", tmp_path / "cap", "--",
              OTHER_PYTHON, "drive.py"], env, engine)
    assert r.returncode == 3, r.stderr
    assert "switches: 1 1" in r.stdout and "raised: Scheduler.update_from_output failed" in r.stdout
    warned = [ln for ln in r.stderr.splitlines() if "nvtx package is not importable" in ln]
    assert len(warned) == 1 and f"{OTHER_PYTHON} -m pip install nvtx" in warned[0]
    assert (tmp_path / "cap.sqlite").exists() and not list(tmp_path.glob("cap.pid*"))


def _no_nsys_path(tmp_path: Path) -> str:
    """A PATH with the interpreter's folder and the basic tools, and no nsys."""
    bin_dir = tmp_path / "nsys-free-bin"
    bin_dir.mkdir()
    for tool in ("sh", "env"):
        src = Path("/bin") / tool
        if src.exists():
            (bin_dir / tool).symlink_to(src)
    return os.pathsep.join([str(Path(OTHER_PYTHON).parent), str(bin_dir)])


def test_capture_instrument_without_backend_uses_probe_where_nsys_is_absent(engine, tmp_path):
    out = tmp_path / "out" / "cap"
    r = _run([*CLI, "capture", "--instrument", "vllm", "--out", out, "--", OTHER_PYTHON, "drive.py"],
             {"PYTHONPATH": str(engine), "PATH": _no_nsys_path(tmp_path)}, engine)
    assert r.returncode == 3, r.stderr
    assert "nsys is not installed: capturing with --backend probe" in r.stderr
    assert sorted(_spans(t).count("loop.step") for t in out.parent.glob("cap.pid*.json.gz")) == [3, 5]


@pytest.mark.parametrize("args, needle", [
    (["--instrument", "vllm", "--backend", "nsys"], "use --backend probe (the --instrument stages' own spans"),
    ([], "use --backend torch to capture with torch.profiler instead"),
])
def test_capture_without_nsys_names_the_backend_that_works(engine, tmp_path, args, needle):
    r = _run([*CLI, "capture", *args, "--out", tmp_path / "cap", "--", OTHER_PYTHON, "drive.py"],
             {"PYTHONPATH": str(engine), "PATH": _no_nsys_path(tmp_path)}, engine)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln != "user sitecustomize ran"]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


@pytest.mark.parametrize("modules, boot, noted", [
    ({"sglang", "sglang.srt"}, None, ["sglang"]),                        # SGLang's scheduler: a process apart
    ({"sglang"}, json.dumps({"instrument": ["sglang"]}), []),            # instrumented: its process traced
    ({"sglang"}, json.dumps({"instrument": ["vllm"]}), ["sglang"]),
    ({"vllm"}, None, []),                 # vLLM may run its engine in process (no claim made)
    ({"torch"}, None, []),                # no engine imported
    ({"sglang"}, "not json", ["sglang"]),
])
def test_torch_backend_says_which_engines_steps_it_cannot_see(modules, boot, noted):
    from srtscope.cli.torch_profile import engines_unseen

    lines = engines_unseen(modules, boot)
    assert [ln.split("note: ")[1].split(" ")[0] for ln in lines] == noted
    for ln in lines:
        assert "\n" not in ln and "--instrument sglang" in ln


def test_capture_torch_of_an_sglang_script_without_instrument_says_so(tmp_path):
    pytest.importorskip("torch")
    from srtscope.probes.engine_tables import SGLANG

    root = tmp_path / "engine"
    write_fake_engine(root, SGLANG, "0.5.23")
    base = [*CLI, "capture", "--backend", "torch", "--out", tmp_path / "t.json.gz"]
    cmd = ["--", sys.executable, "-c", "import sglang, torch; torch.ones(2) + 1"]
    env = {"PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    r = _run([*base, *cmd], env, root)
    assert r.returncode == 0, r.stderr
    assert "srtscope: note: sglang ran its scheduler in a process of its own" in r.stderr
    r = _run([*base, "--instrument", "sglang", *cmd], env, root)
    assert r.returncode == 0 and "note: sglang" not in r.stderr, r.stderr


# The scripts' main: a spawned scheduler, then SGLang's Engine.shutdown, which SIGKILLs it
SHUTDOWN_MAIN = """
if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=scheduler, args=(q,))
    child.start()
    pid = q.get()
    HOOKS["Engine.shutdown"] = lambda x: (os.kill(child.pid, signal.SIGKILL), child.join())
    Engine().shutdown()
    print("scheduler pid:", pid, "exit:", child.exitcode, flush=True)
"""


def _sigkilled_scheduler(tmp_path, script: str, backend: str, python: str, env: dict[str, str]) -> tuple:
    """``capture --backend BACKEND --instrument sglang --out t`` of ``script`` on the fake SGLang:
    (the capture's result, the scheduler's pid, its trace), checked SIGKILLed and its trace there."""
    from srtscope.probes.engine_tables import SGLANG

    root = tmp_path / "engine"
    write_fake_engine(root, SGLANG, "0.5.23")
    (root / "script.py").write_text(script)
    r = _run([*CLI, "capture", "--backend", backend, "--instrument", "sglang", "--out", tmp_path / "t", "--",
              python, "script.py"], {"PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), **env}, root)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("scheduler pid:")][0].split()
    pid, code = int(line[2]), int(line[4])
    assert code == -9                                          # SIGKILLed, as SGLang does
    trace = tmp_path / f"t.pid{pid}.json.gz"
    assert trace.exists(), r.stderr
    return r, pid, trace


# SGLang's Engine.shutdown SIGKILLs the scheduler's process tree: under --backend torch the
# scheduler's profiler would never write. The shutdown is hooked: it asks for the trace first.
SGLANG_SHUTDOWN = """\
import multiprocessing, os, signal, time
import torch
from sglang._fake_out import HOOKS
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.model_runner import ModelRunner

def scheduler(q):
    s, m = Scheduler(), ModelRunner()
    for _ in range(4):
        s.get_next_batch_to_run("decode", sleep_s=0.002)
        m.forward(sleep_s=0.002)
        s.process_batch_result(sleep_s=0.001)
    q.put(os.getpid())
    time.sleep(60)                          # idle until killed
""" + SHUTDOWN_MAIN


def test_torch_backend_keeps_the_trace_of_a_scheduler_the_engines_shutdown_sigkills(tmp_path):
    pytest.importorskip("torch")
    _, _, trace = _sigkilled_scheduler(tmp_path, SGLANG_SHUTDOWN, "torch", sys.executable, {})
    names = [e["name"].split(" ")[0] for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
             if e.get("cat") == "user_annotation"]
    assert names.count("sched.schedule") == 4 and names.count("run.eager") == 4, sorted(set(names))


# The same shutdown under --backend probe, with a scheduler that never goes quiet (it steps until
# killed) and a flush interval longer than the run: only the shutdown's request flushes it
SGLANG_SHUTDOWN_BUSY = """\
import multiprocessing, os, signal, time
from sglang._fake_out import HOOKS
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.model_runner import ModelRunner

def scheduler(q):
    s, m = Scheduler(), ModelRunner()
    n = 0
    while True:
        s.get_next_batch_to_run("decode", sleep_s=0.002)
        m.forward(sleep_s=0.002)
        n += 1
        if n == 4:
            q.put(os.getpid())
""" + SHUTDOWN_MAIN


def test_probe_backend_flushes_a_scheduler_before_the_engines_shutdown_sigkills_it(tmp_path):
    # a flush interval longer than the run: no periodic or quiet flush, the trace is the shutdown's
    r, pid, trace = _sigkilled_scheduler(tmp_path, SGLANG_SHUTDOWN_BUSY, "probe", OTHER_PYTHON,
                                         {"SRTSCOPE_PROBE_FLUSH_S": "60"})
    names = _spans(trace)
    assert names.count("sched.schedule") >= 4 and names.count("run.eager") >= 4, sorted(set(names))
    assert f"process {pid} ended without its exit flush" in r.stderr
