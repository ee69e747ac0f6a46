"""Run real SGLang 0.5.23 on the CPU, offline (``sgl.Engine``) or as a server (``python -m
sglang.launch_server``), with busy-waits injected into SGLang's own functions, clean runs alternated
with faulty ones, each run traced by SGLang's own profiler (``start_profile`` / ``/start_profile``,
activities ["CPU"], no Python stacks).

    python benchmarks/engines/sglang_driver.py --model DIR --out DIR [--mode offline|server]
        [--runs clean,sched,clean,prep,clean,result,clean,sched4] [--delay-ms 15] [--every-delay-ms 60]
        [--requests 8] [--tokens 16] [--delay-kind spin|sleep]

Runs in the rig's SGLang venv (``setup_sglang.sh``); imports nothing of srtscope.

Faults (the run's name; ``NAME<k>``: intermittent, every k-th call, ``--every-delay-ms`` long), patched
into the scheduler process's SGLang functions, inside SGLang's own scheduler ranges:
- ``sched``: ``Scheduler.process_pending_chunked_abort``, the first call of every
  ``get_next_batch_to_run`` (range ``scheduler.get_next_batch_to_run``), when work is queued or running;
- ``prep``: inside ``ForwardBatch.init_new`` (its call of ``_init_num_token_non_padded``; in
  ``scheduler.run_batch``, before the forward ``step[...]``);
- ``alloc``: ``alloc_for_decode`` as ``ScheduleBatch.prepare_for_decode`` calls it (KV slot allocation,
  inside ``get_next_batch_to_run``);
- ``result``: ``Scheduler.publish_load_snapshot``, the first call of ``process_batch_result``.
Each sits in a callee of the function named, so that under ``capture --instrument sglang`` (which
wraps ``get_next_batch_to_run``, ``init_new``, ``process_batch_result``, ``prepare_for_decode``) it
lies inside the stage's range too.
SGLang runs its scheduler in a spawned process: this file is that process's ``__main__`` too, so the
patches go in at import there (``SRTSCOPE_RIG_CONTROL`` set). The parent switches the active fault
through a one-page control file. Each fire is a ``record_function("srtscope.rig.inject fault=...")``
range in the trace, and its measured time (ns, ``perf_counter_ns`` around the busy-wait) is appended
to ``OUT/inject.jsonl``: the ground truth, kept apart from the trace.

Writes ``OUT/runNN_<fault>.trace.json.gz`` per run and ``OUT/manifest.json``: per run, the fault,
the delay, the fired count and the measured time inside the faults, the wall time, the command line.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

FAULTS = ("clean", "sched", "prep", "alloc", "result")
INJECT_RANGE = "srtscope.rig.inject"
CONTROL_ENV = "SRTSCOPE_RIG_CONTROL"
LOG_ENV = "SRTSCOPE_RIG_INJECT_LOG"
_CONTROL_BYTES = 64
SERVE_CHILD = "--serve-child"
_RUN = re.compile(r"^([a-z]+)(\d*)$")


class FaultSwitch:
    """The rig's side of the control file (``_Control`` reads it in SGLang's processes): made at
    ``path`` with no fault, then ``set`` between runs."""

    def __init__(self, path: Path, kind: str = "spin") -> None:
        path.write_bytes(b"\0" * _CONTROL_BYTES)
        self.kind = kind
        self._fd = os.open(path, os.O_RDWR)
        self._mm = mmap.mmap(self._fd, _CONTROL_BYTES)
        self.set("clean", 1, 0)             # what ``_Control`` parses from the start

    def set(self, fault: str, every: int, delay_ms: float) -> None:
        text = f"{fault} {every} {int(delay_ms * 1e6)} {self.kind}".encode()
        self._mm[:_CONTROL_BYTES] = text.ljust(_CONTROL_BYTES, b"\0")

    def close(self) -> None:
        self._mm.close()
        os.close(self._fd)


# --- inside SGLang's processes ------------------------------------------------------------------

class _Control:
    """The active fault, read from the control file (``"fault every delay_ns spin"``) at each call."""

    def __init__(self, path: str, log: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._mm = mmap.mmap(self._fd, _CONTROL_BYTES, prot=mmap.PROT_READ)
        self._raw = b""
        self.fault, self.every, self.delay_ns, self.spin = "clean", 1, 0, True
        self.calls: dict[str, int] = {}
        self._log = log

    def current(self) -> str:
        raw = self._mm[:_CONTROL_BYTES]
        if raw != self._raw:
            self._raw = raw
            fault, every, delay, kind = raw.rstrip(b"\0 ").decode().split()
            self.fault, self.every, self.delay_ns, self.spin = fault, int(every), int(delay), kind == "spin"
            self.calls = {}
        return self.fault

    def fire(self, fault: str) -> None:
        import torch

        n = self.calls.get(fault, 0) + 1
        self.calls[fault] = n
        if n % self.every:
            return
        t0 = time.perf_counter_ns()
        with torch.profiler.record_function(f"{INJECT_RANGE} fault={fault}"):
            if self.spin:
                end = t0 + self.delay_ns
                while time.perf_counter_ns() < end:     # busy: host CPU work
                    pass
            else:
                time.sleep(self.delay_ns / 1e9)
        t1 = time.perf_counter_ns()
        with open(self._log, "a") as f:     # t0, t1: perf_counter_ns, a probe trace's clock
            f.write(json.dumps({"fault": fault, "pid": os.getpid(), "ns": t1 - t0, "t0": t0, "t1": t1}) + "\n")


def _wrap(ctl: _Control, owner: type, attr: str, fault: str, when=None) -> None:
    import inspect

    static = inspect.getattr_static(owner, attr)
    is_cm = isinstance(static, classmethod)
    orig = static.__func__ if is_cm else static

    def patched(*args, **kwargs):
        if ctl.current() == fault and (when is None or when(*args)):
            ctl.fire(fault)
        return orig(*args, **kwargs)

    patched.__wrapped__ = orig  # type: ignore[attr-defined]
    setattr(owner, attr, classmethod(patched) if is_cm else patched)


def _install_faults() -> None:
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    ctl = _Control(os.environ[CONTROL_ENV], os.environ[LOG_ENV])

    def busy(self) -> bool:
        return bool(self.waiting_queue) or not self.running_batch.is_empty()

    _wrap(ctl, Scheduler, "process_pending_chunked_abort", "sched", busy)
    _wrap(ctl, ForwardBatch, "_init_num_token_non_padded", "prep")      # called by init_new only
    _wrap(ctl, schedule_batch, "alloc_for_decode", "alloc")     # the KV slots, inside prepare_for_decode
    _wrap(ctl, Scheduler, "publish_load_snapshot", "result")


if os.environ.get(CONTROL_ENV) and os.environ.get("SRTSCOPE_RIG_NO_FAULTS") != "1":
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    _install_faults()


# --- the parent -----------------------------------------------------------------------------------

def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=("offline", "server"), default="offline")
    p.add_argument("--runs", default="clean,sched,clean,prep,clean,result,clean,sched4,clean")
    p.add_argument("--delay-ms", type=float, default=15.0, help="every-call faults' busy-wait")
    p.add_argument("--every-delay-ms", type=float, default=60.0, help="intermittent faults' busy-wait")
    p.add_argument("--delay-kind", choices=("spin", "sleep"), default="spin")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16, help="tokens generated per request (= decode steps + 1)")
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--sampling", choices=("greedy", "default"), default="greedy",
                   help="greedy (temperature 0: an argmax) or SGLang's default sampling parameters (temperature "
                        "1: softmax and a draw over the vocabulary each step, after the forward)")
    p.add_argument("--port", type=int, default=30571)
    p.add_argument("--profiler", choices=("sglang", "none"), default="sglang",
                   help="sglang: SGLang's own profiler, a trace per run; none: no profiler (the driver runs under "
                        "srtscope capture, which traces it whole)")
    p.add_argument("--pause-s", type=float, default=0.5, help="idle time between runs (a whole-driver capture "
                   "is cut into its runs at these pauses)")
    a = p.parse_args(argv)
    runs = []
    for r in (x.strip() for x in a.runs.split(",") if x.strip()):
        m = _RUN.match(r)
        if not m or m.group(1) not in FAULTS or (m.group(1) == "clean" and m.group(2)) or m.group(2) in ("0", "1"):
            p.error(f"--runs takes {', '.join(FAULTS)}, each optionally followed by k >= 2 (every k-th call); "
                    f"got {r!r}")
        runs.append((r, m.group(1), int(m.group(2) or 1)))
    if not runs or a.delay_ms < 0 or a.every_delay_ms < 0 or a.requests < 1 or a.tokens < 2 or a.pause_s < 0:
        p.error("--runs non-empty, delays >= 0, --requests >= 1, --tokens >= 2, --pause-s >= 0")
    a.run_list = runs
    return a


def _engine_kwargs(model: str) -> dict:
    return dict(model_path=model, device="cpu", attention_backend="torch_native", disable_cuda_graph=True,
                disable_overlap_schedule=True, max_total_tokens=8192, max_running_requests=64,
                random_seed=0, log_level="error")


def _server_args(model: str, port: int) -> list[str]:
    return ["--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
            "--disable-cuda-graph", "--disable-overlap-schedule", "--max-total-tokens", "8192",
            "--max-running-requests", "64", "--random-seed", "0", "--log-level", "error",
            "--host", "127.0.0.1", "--port", str(port)]


class _Offline:
    def __init__(self, model: str) -> None:
        import sglang as sgl

        self.engine = sgl.Engine(**_engine_kwargs(model))

    def generate(self, prompts: list[str], sp: dict) -> int:
        outs = self.engine.generate(prompts, sp)
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def start_profile(self, out_dir: str, pid: str) -> None:
        self.engine.start_profile(output_dir=out_dir, activities=["CPU"], with_stack=False, record_shapes=False,
                                  profile_id=pid)

    def stop_profile(self) -> None:
        self.engine.stop_profile()

    def close(self) -> None:
        self.engine.shutdown()


class _Server:
    def __init__(self, model: str, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, str(Path(__file__).resolve()), SERVE_CHILD, *_server_args(model, port)]
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"sglang_driver: the server exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=60) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"sglang_driver: the server did not come up in 600 s; see {log}")
            time.sleep(1.0)

    def _post(self, path: str, body: dict, timeout: float = 600) -> bytes:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()

    def generate(self, prompts: list[str], sp: dict) -> int:
        outs = json.loads(self._post("/generate", {"text": prompts, "sampling_params": sp}))
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def start_profile(self, out_dir: str, pid: str) -> None:
        self._post("/start_profile", {"output_dir": out_dir, "activities": ["CPU"], "with_stack": False,
                                      "record_shapes": False, "profile_id": pid})

    def stop_profile(self) -> None:
        self._post("/stop_profile", {})

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _end_children(wait_s: float = 120.0) -> None:
    """SIGINT to this process's children (SGLang's scheduler and detokenizer), then wait for them:
    ``Engine.shutdown`` SIGKILLs them, so nothing of theirs runs at exit — under ``srtscope capture
    --backend torch`` the scheduler's own trace is written there (multiprocessing's exit finalizers,
    which a KeyboardInterrupt still runs)."""
    import psutil

    kids = [k for k in psutil.Process().children(recursive=False)     # not multiprocessing's resource tracker
            if not any("resource_tracker" in x for x in k.cmdline())]
    for k in kids:
        try:
            k.send_signal(signal.SIGINT)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(kids, timeout=wait_s)


def _serve_child(args: list[str]) -> int:
    """``python sglang_driver.py --serve-child ARGS``: ``python -m sglang.launch_server ARGS`` with this
    file as ``__main__`` (so its spawned scheduler process gets the faults)."""
    import runpy

    sys.argv = ["sglang.launch_server", *args]
    # alter_sys=False: this file stays __main__, which spawned children re-import
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SERVE_CHILD]:
        return _serve_child(argv[1:])
    a = _args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    prof_dir = out / "_sglang_profiler"
    shutil.rmtree(prof_dir, ignore_errors=True)
    control, log = out / ".control", out / "inject.jsonl"
    switch = FaultSwitch(control, a.delay_kind)
    log.write_text("")
    set_fault = switch.set
    os.environ.update({CONTROL_ENV: str(control), LOG_ENV: str(log), "SGLANG_USE_CPU_ENGINE": "1",
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    _install_faults()          # this process too: the same file is the spawned scheduler's __main__
    t0 = time.perf_counter()
    eng = _Offline(a.model) if a.mode == "offline" else _Server(a.model, a.port, out / "server.log")
    load_s = time.perf_counter() - t0
    sp = {"max_new_tokens": a.tokens, "ignore_eos": True, **({"temperature": 0.0} if a.sampling == "greedy" else {})}
    vocab = 31_000

    def prompts(run: int) -> list[str]:
        return [" ".join(f"w{(run * 997 + i * 131 + j * 7) % vocab}" for j in range(a.prompt_len))
                for i in range(a.requests)]

    runs = []
    try:
        eng.generate(prompts(999), sp)                       # warm-up, not traced
        load_before = os.getloadavg()[0]
        for i, (name, fault, every) in enumerate(a.run_list):
            delay = a.delay_ms if every == 1 else a.every_delay_ms
            mark = log.stat().st_size
            run_dir = prof_dir / f"run{i:02d}"
            time.sleep(a.pause_s)
            if a.profiler == "sglang":
                eng.start_profile(str(run_dir), f"run{i:02d}_{name}")
            set_fault(fault, every, delay)
            t = time.perf_counter()
            n_tok = eng.generate(prompts(i), sp)
            wall = time.perf_counter() - t
            set_fault("clean", 1, 0)
            if a.profiler == "sglang":
                eng.stop_profile()
            got = sorted(run_dir.glob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
            trace = None
            if got:
                trace = out / f"run{i:02d}_{name}.trace.json.gz"
                shutil.move(str(got[-1]), trace)
            with open(log) as f:
                f.seek(mark)
                fired = [json.loads(x) for x in f if x.strip()]
            fired = [x for x in fired if x["fault"] == fault]
            runs.append({"run": i, "name": name, "fault": fault, "every": every,
                         "delay_ms": delay if fault != "clean" else 0.0, "fired": len(fired),
                         "inside_fault_ns": sum(x["ns"] for x in fired), "wall_s": round(wall, 4),
                         "fires_ns": [[x["t0"], x["t1"]] for x in fired],
                         "tokens": n_tok, "trace": trace.name if trace else None})
            print(f"run {i:2d} {name:7s} fired {len(fired):3d}  inside {runs[-1]['inside_fault_ns'] / 1e6:8.1f} ms  "
                  f"wall {wall * 1e3:8.1f} ms  {n_tok} tokens  {trace.name if trace else 'NO TRACE'}", flush=True)
        if a.profiler == "none":
            time.sleep(max(a.pause_s, 2.0))     # a probe capture's processes flush once more before shutdown
            _end_children()
    finally:
        eng.close()
    shutil.rmtree(prof_dir, ignore_errors=True)
    control.unlink(missing_ok=True)
    from importlib.metadata import version

    manifest = {"sglang": version("sglang"), "torch": version("torch"), "mode": a.mode, "model": a.model,
                "requests": a.requests, "tokens": a.tokens, "prompt_len": a.prompt_len,
                "delay_kind": a.delay_kind, "sampling": a.sampling,
                "profiler": "sglang torch profiler, activities CPU, no stacks" if a.profiler == "sglang" else "none",
                "load_s": round(load_s, 1), "cpus": os.cpu_count(),
                "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                "command": " ".join([Path(sys.executable).name, *sys.argv]), "runs": runs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
