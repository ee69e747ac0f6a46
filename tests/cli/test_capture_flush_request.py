"""``capture --backend torch --instrument`` against a server: its engine processes profile themselves
and would write their traces at exit, but a server stopped by Ctrl-C SIGKILLs them (vLLM's API
server does, in its ``abort`` shutdown). srtscope holds the first signal back, asks them to write
their traces (``probes.flush_request``), then passes it on: the traces are there, in bounded time.

The server here is a fake shaped by vLLM's declared table (``tests/probes/fake_engine.py``): a top
process that forks an engine core, which steps, then idles ignoring SIGINT and SIGTERM, and that the
top process SIGKILLs when the signal reaches it."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes"))
from fake_engine import write_fake_engine  # noqa: E402

from srtscope.probes import flush_request  # noqa: E402
from srtscope.probes.engine_tables import VLLM  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "srtscope"]
READY_S = 120
EXIT_S = 60
STEPS = 4

SERVER = f"""\
import multiprocessing, os, signal, sys, time
from vllm._fake_out import HOOKS
from vllm.v1.engine.core import EngineCore
from vllm.v1.core.sched.scheduler import Scheduler

def step(x):
    Scheduler().schedule({{"r1": 1}}, sleep_s=0.002)

HOOKS["EngineCore.step"] = step

def engine_core():
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)          # only the top process's SIGKILL ends it
    for _ in range({STEPS}):
        EngineCore().step()
    print("ready", os.getpid(), flush=True)
    while True:
        time.sleep(0.05)

core = multiprocessing.get_context("fork").Process(target=engine_core)
core.start()
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    os.kill(core.pid, signal.SIGKILL)             # vLLM's abort shutdown: no time to write anything
    core.join()
    raise
"""


def test_a_server_killed_on_ctrl_c_still_writes_its_engine_process_trace(tmp_path):
    pytest.importorskip("torch")
    root = tmp_path / "engine"
    write_fake_engine(root, VLLM, "0.32.0")
    (root / "serve.py").write_text(SERVER)
    trace = tmp_path / "t.json.gz"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "PYTHONDONTWRITEBYTECODE": "1"})
    proc = subprocess.Popen([*CLI, "capture", "--backend", "torch", "--instrument", "vllm", "--out", str(trace),
                             "--", sys.executable, "-c",
                             "import torch, runpy; runpy.run_path('serve.py', run_name='__main__')"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + READY_S
        line = ""
        while not line.startswith("ready") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert line.startswith("ready"), proc.stderr.read() if proc.poll() is not None else "not ready"
        core = int(line.split()[1])
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=EXIT_S)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "asking 1 profiled process to write its trace before passing SIGINT on" in err, err
    written = trace.with_name(f"t.pid{core}.json.gz")
    assert written.exists() and f"process {core} wrote {written}" in err, err
    names = [e["name"].split(" ")[0] for e in json.loads(gzip.decompress(written.read_bytes()))["traceEvents"]
             if e.get("cat") == "user_annotation"]
    assert names.count("loop.step") == STEPS, sorted(set(names))
    assert took < flush_request.WAIT_S, took      # written on request, not at the deadline


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"])


@pytest.mark.parametrize("case, asked, settled_at_once", [
    ("no mark", 0, True),                  # nothing profiles itself: the signal goes on at once
    ("dead pid", 0, True),                 # a marked process that died writes nothing
    ("live pid", 1, False),                # held until it writes (removes its mark) or the time is up
])
def test_flush_request_waits_only_for_live_marked_processes(tmp_path, case, asked, settled_at_once):
    live = _sleeper()
    try:
        if case == "dead pid":
            dead = _sleeper()
            dead.kill()
            dead.wait()
            flush_request.mark(tmp_path, dead.pid)
        elif case == "live pid":
            flush_request.mark(tmp_path, live.pid)
        req = flush_request.FlushRequest(tmp_path, wait_s=0.3)
        assert req.ask() == asked
        assert (tmp_path / flush_request.STOP).exists() == bool(asked)
        assert req.settled() == settled_at_once
        if not settled_at_once:
            time.sleep(0.4)                 # the mark stays: the deadline lets the signal go on
            assert req.settled()
    finally:
        live.kill()
        live.wait()


def test_a_marked_process_writes_once_on_request_and_unmarks(tmp_path):
    calls: list[int] = []
    th = flush_request.watch(tmp_path, os.getpid(), lambda: calls.append(1))
    req = flush_request.FlushRequest(tmp_path, wait_s=5)
    assert req.pending() == [os.getpid()] and not calls
    assert req.ask() == 1
    th.join(timeout=5)
    assert calls == [1] and req.pending() == [] and req.settled()


def test_flush_request_refuses_a_wait_that_is_not_positive(tmp_path):
    with pytest.raises(ValueError, match="wait_s"):
        flush_request.FlushRequest(tmp_path, wait_s=0)
