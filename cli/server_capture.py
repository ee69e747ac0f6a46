"""``srtscope capture --server URL``: a capture of a running SGLang or vLLM server by its own profiler.

POST ``URL/start_profile``; then either a small built-in load sent to the OpenAI-compatible
``URL/v1/completions`` (``load`` requests, ``concurrency`` at a time) or a wait of ``duration_s``
while the server serves its own traffic; POST ``URL/stop_profile`` (also after a failure or Ctrl-C,
so the server never keeps profiling); then the trace files the server wrote at or after the start
are looked for in the trace folder until their sizes settle. Every HTTP call has one total deadline
(connect, headers and body together: ``http_call.exchange``), redirects are not followed, and
``user:password@`` in the URL is sent as basic auth and never printed; text from the server (a
model name, an error body, a file name) is escaped and cut before it is printed.

vLLM exposes the two endpoints only when started with its torch profiler on (``--profiler-config``
with ``profiler: torch`` and ``torch_profiler_dir``; older versions: ``VLLM_TORCH_PROFILER_DIR``);
SGLang always does, and is sent ``output_dir`` when the folder is given. Both are sent
``with_stack: false`` unless ``with_stack`` (SGLang honours it; vLLM takes it from its own
``torch_profiler_with_stack``, on by default: with it a vLLM server can take many minutes and GB to
stop, so srtscope's deadline names it).

No call can hang: from ``/stop_profile`` on, one total deadline (``wait_s``) covers the server's
answer, its trace files settling and the probe traces' last flush.

``probe``: the ``-o NAME`` of the server's own ``srtscope capture --backend probe --instrument``;
its processes' probe traces, cut to the capture, are the trace diagnosed (``server_probe``): they
hold the process where the scheduler runs (vLLM's engine core) as well as the model runner's,
which vLLM's profiler (the worker's alone) does not. With it the server needs no profiler.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srtscope.analyzers.model.units import plural
from srtscope.cli.http_call import Answer, CallError, Target, exchange, parse_target, redacted, shown

#: Environment variables naming a server's trace folder (read here when --trace-dir is not given:
#: a server started from the same shell shares them).
TRACE_DIR_ENV = ("VLLM_TORCH_PROFILER_DIR", "SGLANG_TORCH_PROFILER_DIR")
SGLANG_DEFAULT_DIR = Path("/tmp")
#: Names of traces a server writes for its front end (no engine steps): listed, not diagnosed.
FRONTEND_MARKERS = (".async_llm.",)      # vLLM's AsyncLLM process
TRACE_SUFFIXES = (".json", ".json.gz")
SETTLE_S = 0.5          # a trace file is complete once its size holds for this long
PROMPTS = ("The capital of France is", "Write a short poem about the sea.",
           "List three prime numbers:", "Once upon a time, in a small village,")


class ServerError(Exception):
    """A one-line reason the server capture failed."""


@dataclass(frozen=True)
class ServerPlan:
    """``url``: the server's base URL (http or https, optionally ``user:password@``: basic auth);
    ``timeout_s``: each HTTP call's total deadline (connect, headers and body, s);
    ``load``: requests of built-in load (0: none, then ``duration_s`` of the server's own traffic);
    ``max_tokens``: per load request; ``wait_s``: one total deadline from ``/stop_profile`` on (the
    server answers once it has written its trace), over its answer, the trace files settling and
    the probe traces' flush; ``probe``: the server's own capture name (``server_probe``);
    ``with_stack``: ask for Python stacks (SGLang; vLLM's are its own setting)."""

    url: str
    trace_dir: Path | None = None
    load: int = 32
    concurrency: int = 4
    max_tokens: int = 32
    duration_s: float = 10.0
    timeout_s: float = 60.0
    wait_s: float = 120.0
    probe: Path | None = None
    with_stack: bool = False

    def __post_init__(self) -> None:
        parse_target(self.url)
        if not 0 <= self.load <= 100_000:
            raise ValueError(f"--load {self.load}: expected 0..100000 requests")
        if not 1 <= self.concurrency <= 256:
            raise ValueError(f"--concurrency {self.concurrency}: expected 1..256")
        if not 1 <= self.max_tokens <= 4096:
            raise ValueError(f"--max-tokens {self.max_tokens}: expected 1..4096")
        for name, v, hi in (("--duration", self.duration_s, 86_400.0), ("--timeout", self.timeout_s, 3_600.0),
                            ("--wait", self.wait_s, 3_600.0)):
            if not (v == v and 0 < v <= hi):        # NOTE: v == v refuses NaN
                raise ValueError(f"{name} {v}: expected more than 0 and at most {hi:g} s")

    @property
    def target(self) -> Target:
        return parse_target(self.url)

    @property
    def base(self) -> str:
        """The URL as messages print it: no ``user:password@`` (sent as basic auth instead)."""
        return self.target.shown


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    tokens: int = 0
    first_error: str | None = None
    seconds: float = 0.0


def _call(plan: ServerPlan, method: str, path: str, body: Any, timeout_s: float) -> Answer:
    """One HTTP call within ``timeout_s`` in all; ServerError (one line, no credentials) on no answer."""
    data = None if body is None else json.dumps(body).encode()
    try:
        return exchange(plan.target, method, path, data, timeout_s)
    except CallError as exc:
        raise ServerError(f"{method} {plan.base}{path} {exc}") from None


def refusal(method: str, url: str, answer: Answer) -> str:
    """The line for an answer that is no success (not 2xx), naming a redirect's target: srtscope
    never follows one (a POST sent on would be lost or sent twice)."""
    line = f"{method} {url}: HTTP {answer.status}"
    if 300 <= answer.status < 400:
        where = redacted(answer.location) if answer.location else "nowhere (no Location)"
        return (f"{line} {shown(answer.reason, 60)}, a redirect to {where}: srtscope does not "
                f"follow redirects; give the server's own address as --server")
    return f"{line} {shown(answer.text) or shown(answer.reason, 60)}".rstrip()


def ok(answer: Answer) -> bool:
    return 200 <= answer.status < 300


def start_profile(plan: ServerPlan) -> bool:
    """Start the server's profiler; False when it has none and ``plan.probe`` stands in for it."""
    body: dict[str, Any] = {"with_stack": plan.with_stack}
    if plan.trace_dir is not None:
        body["output_dir"] = str(plan.trace_dir)
    answer = _call(plan, "POST", "/start_profile", body, plan.timeout_s)
    if answer.status == 404 and plan.probe is not None:
        return False
    if answer.status == 404:
        raise ServerError(f"{plan.base} has no /start_profile (HTTP 404): a vLLM server has it only "
                          f"when started with its profiler on: --profiler-config "
                          f"'{{\"profiler\": \"torch\", \"torch_profiler_dir\": \"DIR\"}}' "
                          f"(older vLLM: VLLM_TORCH_PROFILER_DIR=DIR set); give the same DIR "
                          f"as --trace-dir. SGLang servers always have it. A server started under "
                          f"srtscope capture --backend probe -o NAME needs no profiler: --probe NAME")
    if not ok(answer):
        raise ServerError(refusal("POST", f"{plan.base}/start_profile", answer))
    return True


STACKS_HINT = ("a vLLM server started with Python stacks (torch_profiler_with_stack, vLLM's default) can "
               "take many minutes and GB to write its trace: start it with --profiler-config "
               "'{\"profiler\": \"torch\", \"torch_profiler_dir\": \"DIR\", \"torch_profiler_with_stack\": "
               "false}', or give a longer --wait")


def stop_profile(plan: ServerPlan, timeout_s: float | None = None) -> None:
    try:
        answer = _call(plan, "POST", "/stop_profile", None, plan.wait_s if timeout_s is None else timeout_s)
    except ServerError as exc:
        if "within" in str(exc):
            raise ServerError(f"{exc}: {STACKS_HINT}") from None
        raise
    if not ok(answer):
        raise ServerError(refusal("POST", f"{plan.base}/stop_profile", answer))


def model_name(plan: ServerPlan) -> str:
    """The first model the server lists at ``/v1/models`` (as the server spells it: escape it
    before printing)."""
    answer = _call(plan, "GET", "/v1/models", None, plan.timeout_s)
    if not ok(answer):
        raise ServerError(refusal("GET", f"{plan.base}/v1/models", answer) + ": not an "
                          "OpenAI-compatible server? use --load 0 and send your own requests")
    try:
        return str(json.loads(answer.text)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerError(f"GET {plan.base}/v1/models (HTTP {answer.status}) names no model: "
                          f"not an OpenAI-compatible server; use --load 0 and send your own "
                          f"requests") from None


def send_load(plan: ServerPlan, model: str) -> LoadResult:
    """``plan.load`` completions, ``plan.concurrency`` at a time; each with the call deadline. The
    first call that gets no answer (a timeout, a broken connection) ends the load: no new request
    is sent, so a server that stopped answering costs one more deadline, not one per request."""
    result = LoadResult()
    lock = threading.Lock()
    next_i = iter(range(plan.load))
    gone = threading.Event()

    def worker() -> None:
        while not gone.is_set():
            with lock:
                i = next(next_i, None)
                if i is None:
                    return
                result.sent += 1
            body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": plan.max_tokens,
                    "temperature": 0.0, "ignore_eos": True}
            try:
                answer = _call(plan, "POST", "/v1/completions", body, plan.timeout_s)
                error = None if ok(answer) else refusal("POST", f"{plan.base}/v1/completions", answer)
                tokens = int(json.loads(answer.text)["usage"]["completion_tokens"]) if ok(answer) else -1
            except ServerError as exc:
                tokens, error = -1, str(exc)
                gone.set()
            except (ValueError, KeyError, TypeError):
                tokens, error = 0, None      # answered, without usage figures
            with lock:
                if error is None:
                    result.ok += 1
                    result.tokens += max(tokens, 0)
                elif result.first_error is None:
                    result.first_error = error

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(plan.concurrency, plan.load))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - t0
    return result


def trace_dir_of(plan: ServerPlan) -> Path:
    """Where the server writes its traces: ``--trace-dir``, else the folder the profiler variables
    of this environment name, else SGLang's default (/tmp)."""
    if plan.trace_dir is not None:
        return plan.trace_dir
    for var in TRACE_DIR_ENV:
        if os.environ.get(var):
            return Path(os.environ[var])
    return SGLANG_DEFAULT_DIR


def fresh_traces(folder: Path, since: float) -> dict[Path, int]:
    """Trace files (``TRACE_SUFFIXES``) in ``folder`` or one level below, modified at or after
    ``since`` (epoch s); path -> size in bytes."""
    found: dict[Path, int] = {}
    for pattern in ("*", "*/*"):
        for p in folder.glob(pattern):
            if not p.name.endswith(TRACE_SUFFIXES) or ".tmp" in p.name:
                continue
            try:
                st = p.stat()
            except OSError:
                continue
            if st.st_mtime >= since and st.st_size > 0 and p.is_file():
                found[p] = st.st_size
    return found


def wait_for_traces(folder: Path, since: float, wait_s: float,
                    sleep: Callable[[float], None] = time.sleep) -> list[Path]:
    """The fresh traces once some exist and their sizes held for ``SETTLE_S``; [] after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    last: dict[Path, int] = {}
    while True:
        now = fresh_traces(folder, since)
        if now and now == last:
            return sorted(now)
        if time.monotonic() >= deadline:
            return []
        last = now
        sleep(SETTLE_S)


@dataclass
class ServerCapture:
    """What a server capture gave: the traces the server's profiler wrote (``traces``), and the
    probe trace cut to the capture (``probe``, with ``--probe``)."""

    traces: list[Path]
    probe: Path | None = None


def capture_server(plan: ServerPlan, say: Callable[[str], None]) -> ServerCapture:
    """Profile the server at ``plan.url``; what it wrote. Raises ServerError (one line)."""
    from srtscope.cli.server_probe import ProbeError, server_probe_trace

    folder = trace_dir_of(plan)
    # NOTE: a folder not there yet is fine: vLLM and SGLang make their trace folder when they profile
    if plan.trace_dir is not None and folder.exists() and not folder.is_dir():
        raise ServerError(f"--trace-dir {folder}: not a folder")
    model = model_name(plan) if plan.load else None
    since = time.time() - 1.0            # NOTE: file systems with coarse timestamps
    start_s = time.time()
    # NOTE: with --probe the stage spans are the trace; the server's own profiler (SGLang always has
    # one) would only slow its steps and write a trace nobody reads, unless --trace-dir asks for it
    profiled = start_profile(plan) if plan.probe is None or plan.trace_dir is not None else False
    if not profiled:
        say(f"{plan.base}'s own profiler not started (--probe without --trace-dir)" if plan.trace_dir is None
            and plan.probe is not None else
            f"{plan.base} has no /start_profile (its profiler is off): only the --probe traces are read")
    doing = (f" while sending {plan.load} requests to /v1/completions (model {shown(model)})"
             if model is not None else f" for {plan.duration_s:g} s")
    say(f"profiling {plan.base}{doing}")
    try:
        if model is not None:
            load = send_load(plan, model)
            say(f"load: {load.ok}/{load.sent} requests answered, {load.tokens} tokens in "
                f"{load.seconds:.1f} s" + (f"; first failure: {load.first_error}" if load.first_error else ""))
        else:
            time.sleep(plan.duration_s)
    finally:
        end_s = time.time()
        deadline = time.monotonic() + plan.wait_s
        if profiled:
            stop_profile(plan)
    traces: list[Path] = []
    if profiled:
        traces = wait_for_traces(folder, since, max(deadline - time.monotonic(), 0.1))
        if not traces and plan.probe is None:
            raise ServerError(f"the server wrote no trace into {shown(folder, 1000)} within {plan.wait_s:g} s of "
                              f"/stop_profile; give the folder its profiler writes to as --trace-dir "
                              f"(vLLM: its torch_profiler_dir)")
    probe = None
    if plan.probe is not None:
        try:
            probe, procs, spans = server_probe_trace(plan.probe, start_s, end_s, deadline)
        except ProbeError as exc:
            raise ServerError(str(exc)) from None
        say(f"--probe: {spans} stage spans of {plural(procs, 'server process', 'server processes')} in the "
            f"capture's {end_s - start_s:.1f} s, written to {shown(probe, 1000)}")
    return ServerCapture(traces, probe)


#: The one line for a vLLM server's worker trace with no scheduler in it: its scheduler runs in the
#: engine-core process, which vLLM's profiler does not trace.
WORKER_ONLY = ("the trace is vLLM's worker process's: the scheduler runs in the engine-core process, which "
               "vLLM's profiler does not trace, so scheduler time reads as host / host_unattributed; to name "
               "it, start the server under `srtscope capture --backend probe --instrument vllm -o NAME -- ...` "
               "and add --probe NAME")


def worker_only(names: set[str]) -> bool:
    """Whether a trace's range names are a vLLM worker's alone: its per-step ``execute_*`` or
    ``gpu_model_runner: *`` ranges and nothing of the engine core (``llm_engine step: *``,
    ``schedule: *``, srtscope's ``sched.*`` / ``loop.step`` stages)."""
    vllm_worker = any(n.startswith(("execute_context", "gpu_model_runner:")) for n in names)
    core = any(n.startswith(("llm_engine step", "schedule:", "sched.", "loop.step")) for n in names)
    return vllm_worker and not core


def engine_traces(traces: list[Path]) -> tuple[list[Path], list[Path]]:
    """(the engine's traces, the front end's): vLLM also traces its API process (``*.async_llm.*``),
    which runs no engine step and is no rank of the engine."""
    front = [p for p in traces if any(m in p.name for m in FRONTEND_MARKERS)]
    return [p for p in traces if p not in front], front
