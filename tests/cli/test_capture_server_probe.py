"""``srtscope capture --server URL --probe NAME`` and the deadlines of a server capture: a stand-in
server whose "processes" (an engine core that schedules, a worker that runs the model) write probe
traces as a server started under ``capture --backend probe --instrument`` does (every flush
interval); the capture cuts them to its own time and diagnoses the scheduler's process with the
worker's. And a /stop_profile that never answers ends at the deadline, naming vLLM's stacks."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_proc import CLI

from srtscope.cli.server_capture import WORKER_ONLY, ServerError, ServerPlan, capture_server, worker_only
from srtscope.probes.export import write_probe_trace
from srtscope.probes.recorder import Recorder

MS = 1_000_000
SCHED_MS, FORWARD_MS = 12, 4


class Engine:
    """Two processes' recorders (engine core: ``loop.step`` > ``sched.schedule``; worker:
    ``prep.batch``, ``run.eager``), flushed to ``NAME.pid<N>.json.gz`` every ``flush_s``."""

    def __init__(self, name: Path, flush_s: float = 0.2, one_process: bool = False) -> None:
        self.name, self.flush_s = name, flush_s
        self.core = Recorder()
        self.worker = self.core if one_process else Recorder()      # SGLang: the scheduler runs the model
        self.core.pid, self.worker.pid = 1001, 1001 if one_process else 1002
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._flush, daemon=True)

    def step(self, sched_ms: float = SCHED_MS) -> None:
        with self.lock:
            t0 = time.perf_counter_ns()
            time.sleep(sched_ms / 1e3)
            t1 = time.perf_counter_ns()
            time.sleep(0.0005)
            t2 = time.perf_counter_ns()
            time.sleep(FORWARD_MS / 1e3)
            t3 = time.perf_counter_ns()
            self.core.add_span("loop.step", t0, t3, 11)
            self.core.add_span("sched.schedule", t0, t1, 11, 1)
            self.worker.add_span("prep.batch", t1, t2, 12)
            self.worker.add_span("run.eager", t2, t3, 12)

    def _flush_once(self) -> None:
        with self.lock:
            for rec in {id(r): r for r in (self.core, self.worker)}.values():
                write_probe_trace(rec, self.name.with_name(f"{self.name.name}.pid{rec.pid}.json.gz"))

    def _flush(self) -> None:
        while not self.stop.wait(self.flush_s):
            self._flush_once()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: Engine, stop_hangs: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.engine, self.stop_hangs = engine, stop_hangs
        self.calls: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, doc: object) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.calls.append(f"GET {self.path}")
        self._reply(200, {"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.calls.append(f"POST {self.path}")
        if self.path == "/stop_profile" and self.server.stop_hangs:
            time.sleep(30)
        if self.path in ("/start_profile", "/stop_profile"):
            self._reply(404 if not self.server.stop_hangs else 200, {"detail": "Not Found"})
            return
        for _ in range(3):                      # each request: three engine steps
            self.server.engine.step()
        self._reply(200, {"usage": {"completion_tokens": 3}})


@pytest.fixture
def server(tmp_path, monkeypatch):
    # the server's processes flush every 0.2 s here (SRTSCOPE_PROBE_FLUSH_S in their environment,
    # which --server reads in its own to know how long a first flush can take)
    monkeypatch.setenv("SRTSCOPE_PROBE_FLUSH_S", "0.2")
    made: list[Server] = []

    def start(one_process: bool = False, **kw: object) -> Server:
        eng = Engine(tmp_path / "srv", one_process=one_process)
        for _ in range(4):                      # steps before the capture (a warm-up): cut away
            eng.step(sched_ms=40)
        eng.thread.start()
        srv = Server(eng, **kw)                 # type: ignore[arg-type]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.engine.stop.set()
        srv.shutdown()
        srv.server_close()


def test_probe_traces_of_the_server_cut_to_the_capture_and_merged(server, tmp_path):
    srv = server()
    said: list[str] = []
    got = capture_server(ServerPlan(srv.url, load=4, concurrency=1, timeout_s=10, wait_s=10,
                                    probe=tmp_path / "srv"), said.append)
    # --probe without --trace-dir: the server's own profiler is not asked for (SGLang's would slow the
    # steps and write a trace nobody reads), and the capture says so
    assert got.traces == [] and any("own profiler not started" in s for s in said), said
    assert "POST /start_profile" not in srv.calls and "POST /stop_profile" not in srv.calls
    assert got.probe is not None and got.probe.name.startswith("srv.server")
    doc = json.loads(__import__("gzip").decompress(got.probe.read_bytes()))
    names = [doc["strings"][i] for i in doc["spans"]["name"]]
    # 4 requests x 3 steps inside the capture; the 4 steps before it are cut
    assert names.count("loop.step") == 12 and names.count("run.eager") == 12
    assert sorted(doc["meta"]["pids"]) == [1001, 1002]
    assert any("stage spans of 2 server processes" in s for s in said), said


def test_probe_trace_of_a_one_process_server_says_one_process(server, tmp_path):
    """SGLang's scheduler process runs the model too: one process wrote spans, said as one."""
    srv = server(one_process=True)
    said: list[str] = []
    got = capture_server(ServerPlan(srv.url, load=2, concurrency=1, timeout_s=10, wait_s=10,
                                    probe=tmp_path / "srv"), said.append)
    assert got.probe is not None
    doc = json.loads(__import__("gzip").decompress(got.probe.read_bytes()))
    assert doc["meta"]["pids"] == [1001]
    assert any("stage spans of 1 server process in the capture" in s for s in said), said


def test_server_probe_cli_names_the_scheduler_of_the_other_process(server, tmp_path):
    srv = server()
    env = {**os.environ, "COLUMNS": "100"}          # SRTSCOPE_PROBE_FLUSH_S=0.2 from the fixture
    p = subprocess.run([*CLI, "capture", "--server", srv.url, "--probe", str(tmp_path / "srv"), "--load", "4",
                        "--concurrency", "1", "--timeout", "10", "--wait", "10"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert "Bottleneck: SCHEDULER" in p.stdout, p.stdout
    assert WORKER_ONLY not in p.stderr


def test_a_first_flush_after_the_capture_is_awaited(server, tmp_path):
    # scenario: the processes' first instrumented calls come with the capture's load, and their
    # first traces are written after it ends (as a server that was idle until then)
    srv = server()
    srv.engine.stop.set()
    srv.engine.thread.join()
    for p in tmp_path.glob("srv.pid*.json.gz"):
        p.unlink()
    late = threading.Timer(0.6, srv.engine._flush_once)
    late.start()
    got = capture_server(ServerPlan(srv.url, load=2, concurrency=1, timeout_s=10, wait_s=10,
                                    probe=tmp_path / "srv"), lambda s: None)
    late.join()
    assert got.probe is not None
    doc = json.loads(__import__("gzip").decompress(got.probe.read_bytes()))
    assert [doc["strings"][i] for i in doc["spans"]["name"]].count("loop.step") == 6


def test_probe_without_a_flush_after_the_capture_is_one_line_at_the_deadline(server, tmp_path):
    srv = server()
    time.sleep(0.5)
    srv.engine.stop.set()                       # the server's processes wrote, then stopped writing
    t0 = time.monotonic()
    with pytest.raises(ServerError) as exc:
        capture_server(ServerPlan(srv.url, load=1, timeout_s=10, wait_s=1.0, probe=tmp_path / "srv"),
                       lambda s: None)
    assert 1.0 <= time.monotonic() - t0 < 10
    msg = str(exc.value)
    assert "\n" not in msg and "2 of the 2 process traces were not written again after the capture's end" in msg


def test_a_stop_that_never_answers_ends_at_the_deadline_naming_vllm_stacks(server, tmp_path):
    srv = server(stop_hangs=True)
    t0 = time.monotonic()
    p = subprocess.run([*CLI, "capture", "--server", srv.url, "--load", "1", "--timeout", "10", "--wait", "1"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "100"})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and lines[-1].startswith("srtscope: error: POST"), p.stderr
    assert "stop_profile got no answer within 1 s" in lines[-1]
    assert '"torch_profiler_with_stack": false' in lines[-1]
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("names, expected", [
    ({"execute_context_0(0)_generation_8(8)", "gpu_model_runner: forward"}, True),   # a server's worker
    ({"execute_context_0(0)_generation_8(8)", "llm_engine step: get_output"}, False),  # in-process engine
    ({"execute_context_0(0)_generation_8(8)", "sched.schedule"}, False),   # instrumented engine core in it
    ({"scheduler.run_batch"}, False),                                       # not vLLM
])
def test_worker_only_traces_are_told_apart(names, expected):
    assert worker_only(names) is expected


def test_probe_and_with_stack_belong_to_server():
    p = subprocess.run([*CLI, "capture", "--probe", "x", "--", "python", "-c", "1"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--probe and --with-stack apply to --server" in p.stderr
