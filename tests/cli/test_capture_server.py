"""``srtscope capture --server URL`` against a stand-in server on 127.0.0.1 (a threaded
http.server in the test): the order of calls, the load it sends, the trace it finds and diagnoses,
and one-line errors, each bounded in time, for servers that lack the endpoints or never answer."""
from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_proc import CLI, SAMPLES

from srtscope.cli.server_capture import ServerError, ServerPlan, capture_server, wait_for_traces

TRACE = SAMPLES / "profiler_steps.json.gz"       # a small Kineto trace; diagnosed kernel/compute


class StandIn(ThreadingHTTPServer):
    """Records every call; ``profiler``: whether it has /start_profile and /stop_profile (as a
    vLLM server started without VLLM_TORCH_PROFILER_DIR has not); on stop it writes a trace into
    ``trace_dir`` (or into the ``output_dir`` it was sent, as SGLang does)."""

    daemon_threads = True

    def __init__(self, trace_dir: Path, profiler: bool = True, write_trace: bool = True,
                 frontend: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.trace_dir, self.profiler, self.write_trace = trace_dir, profiler, write_trace
        self.frontend = frontend          # also a trace of the API process, as vLLM writes
        self.calls: list[str] = []
        self.bodies: dict[str, object] = {}
        self.profiling = False
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, doc: object) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.calls.append(f"GET {self.path}")
        if self.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]})
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        srv = self.server
        with srv.lock:
            srv.calls.append(f"POST {self.path}")
            srv.bodies[self.path] = body
        if self.path in ("/start_profile", "/stop_profile") and not srv.profiler:
            self._reply(404, {"detail": "Not Found"})
        elif self.path == "/start_profile":
            srv.profiling = True
            self._reply(200, {})
        elif self.path == "/stop_profile":
            srv.profiling = False
            if srv.write_trace:
                folder = Path(body["output_dir"]) if body and "output_dir" in body else srv.trace_dir
                folder.mkdir(parents=True, exist_ok=True)      # as vLLM and SGLang make theirs
                shutil.copyfile(TRACE, folder / f"{int(time.time())}-TP-0.trace.json.gz")
                if srv.frontend:
                    shutil.copyfile(TRACE, folder / "vm_1.async_llm.1796.pt.trace.json.gz")
            self._reply(200, {})
        elif self.path == "/v1/completions":
            assert srv.profiling, "load sent while the profiler was off"
            n = int(body["max_tokens"])
            self._reply(200, {"choices": [{"text": "x" * n}],
                              "usage": {"prompt_tokens": 5, "completion_tokens": n}})
        else:
            self._reply(404, {"detail": "Not Found"})


@pytest.fixture
def serve(tmp_path):
    made: list[StandIn] = []

    def start(**kw: object) -> StandIn:
        folder = tmp_path / f"traces{len(made)}"
        folder.mkdir()
        srv = StandIn(folder, **kw)   # type: ignore[arg-type]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def test_server_capture_profiles_the_load_and_finds_the_trace(serve):
    srv = serve()
    said: list[str] = []
    plan = ServerPlan(srv.url, trace_dir=srv.trace_dir, load=10, concurrency=3, max_tokens=8,
                      timeout_s=10, wait_s=10)
    traces = capture_server(plan, said.append).traces
    assert [p.parent for p in traces] == [srv.trace_dir]
    calls = srv.calls
    assert calls[0] == "GET /v1/models" and calls[1] == "POST /start_profile" and calls[-1] == "POST /stop_profile"
    assert calls.count("POST /v1/completions") == 10
    # SGLang takes the trace folder and the stacks setting with the start; vLLM ignores the body
    assert srv.bodies["/start_profile"] == {"output_dir": str(srv.trace_dir), "with_stack": False}
    assert any("10/10 requests answered, 80 tokens" in line for line in said), said


def test_server_capture_cli_diagnoses_the_trace(serve, tmp_path):
    import subprocess

    srv = serve(frontend=True)
    p = subprocess.run([*CLI, "capture", "--server", srv.url, "--trace-dir", str(srv.trace_dir),
                        "--load", "4", "--timeout", "10", "--wait", "10"],
                       capture_output=True, text=True, timeout=120, env={"COLUMNS": "100",
                                                                           "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert "the server wrote" in p.stderr and "4/4 requests answered" in p.stderr
    assert "async_llm.1796.pt.trace.json.gz (its front end: not diagnosed)" in p.stderr
    assert " · 1 file · " in p.stdout             # the engine's trace only
    assert "Bottleneck: KERNEL / compute" in p.stdout


def test_server_capture_trace_dir_the_server_makes(serve, tmp_path):
    """A --trace-dir not there yet (vLLM's torch_profiler_dir before its first profile) is the
    server's to make; one that is a file is an error before any call."""
    srv = serve()
    later = srv.trace_dir = tmp_path / "made" / "by" / "server"      # the stand-in makes it at its stop
    traces = capture_server(ServerPlan(srv.url, trace_dir=later, load=2, timeout_s=10, wait_s=10),
                            lambda s: None).traces
    assert [p.parent for p in traces] == [later]
    assert srv.bodies["/start_profile"] == {"output_dir": str(later), "with_stack": False}
    afile = tmp_path / "afile"
    afile.write_text("")
    calls = len(srv.calls)
    with pytest.raises(ServerError, match="not a folder"):
        capture_server(ServerPlan(srv.url, trace_dir=afile, load=2, timeout_s=10), lambda s: None)
    assert len(srv.calls) == calls


def test_server_capture_without_load_waits_for_the_duration(serve):
    srv = serve()
    t0 = time.monotonic()
    capture_server(ServerPlan(srv.url, trace_dir=srv.trace_dir, load=0, duration_s=0.3,
                              timeout_s=10, wait_s=10), lambda s: None)
    assert time.monotonic() - t0 >= 0.3
    assert srv.calls == ["POST /start_profile", "POST /stop_profile"]


def test_server_without_profiler_endpoints_names_vllm_switch(serve):
    srv = serve(profiler=False)
    with pytest.raises(ServerError) as exc:
        capture_server(ServerPlan(srv.url, trace_dir=srv.trace_dir, load=2, timeout_s=10), lambda s: None)
    assert "VLLM_TORCH_PROFILER_DIR" in str(exc.value) and "404" in str(exc.value)
    assert "--probe NAME" in str(exc.value)         # a server started under the probes needs no profiler
    assert "\n" not in str(exc.value)
    assert "POST /v1/completions" not in srv.calls


def test_server_that_writes_no_trace_is_an_error_after_the_wait(serve):
    srv = serve(write_trace=False)
    t0 = time.monotonic()
    with pytest.raises(ServerError) as exc:
        capture_server(ServerPlan(srv.url, trace_dir=srv.trace_dir, load=1, timeout_s=10, wait_s=1.0),
                       lambda s: None)
    assert "wrote no trace" in str(exc.value) and 1.0 <= time.monotonic() - t0 < 10
    assert srv.calls[-1] == "POST /stop_profile"


def test_server_that_never_answers_is_bounded_by_the_timeout(tmp_path):
    # scenario: a socket that accepts connections (the kernel's backlog) but never replies
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        import subprocess

        t0 = time.monotonic()
        p = subprocess.run([*CLI, "capture", "--server", url, "--load", "0", "--timeout", "1"],
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
    finally:
        sock.close()
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "POST" in lines[0] and "start_profile got no answer within 1 s" in lines[0]
    assert took < 30


def test_server_refused_connection_is_one_line(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()                              # nothing listens there now
    with pytest.raises(ServerError) as exc:
        capture_server(ServerPlan(f"http://127.0.0.1:{port}", load=0, timeout_s=5), lambda s: None)
    assert "refused" in str(exc.value).lower()


@pytest.mark.parametrize("kw, needle", [
    ({"url": "localhost:8000"}, "http://HOST:PORT"), ({"url": "ftp://x"}, "http://HOST:PORT"),
    ({"load": -1}, "--load"), ({"concurrency": 0}, "--concurrency"), ({"max_tokens": 0}, "--max-tokens"),
    ({"timeout_s": 0}, "--timeout"), ({"timeout_s": float("nan")}, "--timeout"),
    ({"duration_s": -1}, "--duration"), ({"wait_s": 1e9}, "--wait"),
])
def test_server_plan_validation(kw, needle):
    args = {"url": "http://127.0.0.1:8000", **kw}
    with pytest.raises(ValueError, match=needle.replace("-", r"\-")):
        ServerPlan(**args)


def test_wait_for_traces_waits_until_the_size_settles(tmp_path):
    # scenario: the server is still writing its trace when the stop returns
    part = tmp_path / "w.json.gz"
    part.write_bytes(b"x" * 10)
    sizes = iter([20, 30, 30])

    def sleep(_s: float) -> None:
        part.write_bytes(b"x" * next(sizes, 30))

    assert wait_for_traces(tmp_path, time.time() - 5, 30, sleep=sleep) == [part]
    assert part.stat().st_size == 30
