"""The capture bootstrap: run at start-up of every Python process of a ``srtscope capture``.

``srtscope capture`` puts a generated ``sitecustomize`` first on the command's ``PYTHONPATH``; it
calls ``boot()``, which reads ``BOOT_ENV`` (JSON: ``backend``, ``out``, ``instrument``) and, with
engines to instrument:

- wraps their functions in stage ranges (``probes.instrument``) and turns the ranges on: NVTX too
  under nsys; a torch ``record_function`` too (torch and probe backends, once the engine has
  imported torch), so the ranges also land in a profiler the engine runs itself;
- torch backend: a process in which an instrumented function runs and that is not profiled yet
  (a server's engine-core process, a script started without ``python``) profiles itself from then
  on into ``process_trace_path(out, pid)``, written at exit or when srtscope asks before passing a
  signal on (``probes.flush_request``: a server's processes are SIGKILLed at shutdown);
- probe backend: a process that recorded spans appends them to a probe stream at the same path
  (``probes.export.ProbeStreamWriter``: the rows since the last flush, O(new rows)) every
  ``flush_interval()`` seconds (0.2) and as soon as it goes quiet, from its first instrumented
  call on, and a final chunk at exit: an engine's children are often SIGKILLed at shutdown
  (SGLang's scheduler, vLLM's workers), and such a trace keeps every flush before the kill; an
  engine's own shutdown (``EngineTable.shutdown``) asks for one more flush before it kills;
- at exit, one line per process with the instrumented calls it made.

Everything here is best effort: a failure is a warning line, never the engine's exception.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

BOOT_ENV = "SRTSCOPE_CAPTURE"
BACKENDS = ("nsys", "torch", "probe")
PROTOCOL = 1   # the BOOT_ENV document's version; the CLI and this module must agree
FLUSH_ENV = "SRTSCOPE_PROBE_FLUSH_S"   # probe backend: seconds between flushes (default FLUSH_S)
# NOTE: a flush appends only the new rows (about 2 us a span, in the flusher's thread), so a short
# interval costs little more than a long one and bounds what a SIGKILL loses
FLUSH_S = 0.2


def flush_interval() -> float:
    """``FLUSH_ENV`` when it is a number in [0.1, 3600], else ``FLUSH_S``."""
    try:
        v = float(os.environ.get(FLUSH_ENV, FLUSH_S))
    except ValueError:
        return FLUSH_S
    return v if 0.1 <= v <= 3600 else FLUSH_S


def process_trace_path(out: Path, pid: int) -> Path:
    """``NAME.json.gz`` (or ``NAME.json``, or ``NAME``) -> ``NAME.pid<PID>.json.gz``."""
    name = out.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    return out.with_name(f"{name}.pid{pid}.json.gz")


def _warn(message: str) -> None:
    sys.stderr.write(f"srtscope: warning: {message}\n")
    sys.stderr.flush()


class _Session:
    """This process's part of the capture."""

    def __init__(self, backend: str, out: Path, engines: list[str], control: Path | None = None) -> None:
        from srtscope.probes import ranges
        from srtscope.probes.engine_tables import ENGINES
        from srtscope.probes.instrument import Instrumenter

        self.backend = backend
        self.out = out
        self.engines = engines
        self.ranges = ranges
        self.started_pid = 0      # the process whose first instrumented call has been seen
        self.finished_pid = 0
        self.profile: Any = None  # a torch_profiling context this process started itself
        self.control = control    # the capture's control folder (``flush_request``), if any
        self.lock = threading.Lock()   # the profiler is stopped once: at exit or on request
        self.flusher: Any = None  # probe backend: this process's AutoFlusher
        ranges.enable(nvtx=backend == "nsys")
        if backend == "nsys" and ranges.nvtx_status().startswith("unavailable"):
            _warn(f"the nvtx package is not importable by {sys.executable} "
                  f"({ranges.nvtx_status()[len('unavailable: '):]}): the instrumented stages are "
                  f"not in the nsys trace; install it there: {sys.executable} -m pip install nvtx")
        self.inst = Instrumenter([ENGINES[e] for e in engines])
        self.inst.on_call = self.on_call
        self.inst.on_shutdown = self.before_shutdown
        self.inst.install()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)
        atexit.register(self.finish)

    def _forked(self) -> None:
        """A forked child starts with no spans and no profiler of its own."""
        from srtscope.probes import torch_capture
        from srtscope.probes.recorder import get_recorder

        rec = get_recorder()
        rec.clear()
        rec.pid = os.getpid()
        self.profile = None
        self.lock = threading.Lock()    # a thread of the parent may have held it
        self.flusher = None       # its thread was not forked
        torch_capture._active = False   # the parent's profiler does not run in this process

    def on_call(self) -> None:
        """Before each instrumented call: the first one in a process sets the process up."""
        pid = os.getpid()
        if self.started_pid == pid:
            return
        self.started_pid = pid
        try:
            # NOTE: the multiprocessing finalizers run where atexit does not (a forked child ends
            # with os._exit after them)
            from multiprocessing import util

            util.Finalize(None, self.finish, exitpriority=100)
        except Exception:
            pass
        if self.backend in ("torch", "probe") and "torch" in sys.modules:
            try:
                self.ranges.torch_annotations(True)
            except Exception as exc:
                _warn(f"torch annotations unavailable: {type(exc).__name__}: {exc}")
        if self.backend == "torch":
            self._start_profiler(pid)
        elif self.backend == "probe":
            self._start_flusher(pid)

    def _start_flusher(self, pid: int) -> None:
        from srtscope.probes.export import AutoFlusher
        from srtscope.probes.recorder import get_recorder

        rec = get_recorder()
        rec.meta.setdefault("instrumented", "+".join(self.engines))
        try:
            self.flusher = AutoFlusher(rec, process_trace_path(self.out, pid), flush_interval()).start()
        except Exception as exc:
            _warn(f"probe trace of process {pid} is written only at exit: {type(exc).__name__}: {exc}")
            return
        if self.control is not None:
            from srtscope.probes import flush_request

            # NOTE: an engine's shutdown may SIGKILL this process before its quiet flush (SGLang's
            # scheduler: 3 of 64 forwards lost once); asked first, it writes its last spans
            try:
                flush_request.watch(self.control, pid, lambda: self._flush_on_request(pid))
            except OSError:
                pass                    # the periodic and quiet flushes still run

    def _flush_on_request(self, pid: int) -> None:
        """The engine is about to SIGKILL this process: append its spans since the last flush now."""
        flusher = self.flusher
        if flusher is None:
            return
        try:
            flusher.writer.flush()
        except Exception as exc:
            _warn(f"probe trace of process {pid} not flushed on request: {type(exc).__name__}: {exc}")

    def _start_profiler(self, pid: int) -> None:
        from srtscope.probes import torch_capture

        if torch_capture._active:
            return
        try:
            ctx = torch_capture.torch_profiling(process_trace_path(self.out, pid))
            ctx.__enter__()
            self.profile = ctx
        except Exception as exc:
            _warn(f"could not start torch.profiler in process {pid}: {type(exc).__name__}: {exc}")
            return
        if self.control is not None:
            from srtscope.probes import flush_request

            try:
                flush_request.watch(self.control, pid, lambda: self._on_request(pid))
            except OSError as exc:
                _warn(f"process {pid} writes its torch.profiler trace only at exit: {exc.strerror or exc}")

    def _stop_profiler(self, pid: int) -> Path | None:
        """Stop this process's profiler and write its trace (once: at exit or on request)."""
        with self.lock:
            ctx, self.profile = self.profile, None
            if ctx is None:
                return None
            try:
                ctx.__exit__(None, None, None)
                return process_trace_path(self.out, pid)
            except Exception as exc:
                _warn(f"torch.profiler trace of process {pid} not written: {type(exc).__name__}: {exc}")
                return None
            finally:
                if self.control is not None:
                    from srtscope.probes import flush_request

                    flush_request.unmark(self.control, pid)

    def _on_request(self, pid: int) -> None:
        """srtscope is about to pass a signal on: write the trace now (the process may be SIGKILLed)."""
        try:
            wrote = self._stop_profiler(pid)
        except Exception:
            return
        if wrote is not None:
            sys.stderr.write(f"srtscope: process {pid} wrote {wrote} before its engine stopped it\n")
            sys.stderr.flush()

    def before_shutdown(self) -> None:
        """The engine is about to SIGKILL its own processes (``EngineTable.shutdown``): under
        ``--backend torch`` ask those whose profiler runs to write their traces first, and under
        ``--backend probe`` those with a probe stream to flush it, and wait for them
        (``flush_request.WAIT_S`` at most). The request is taken back after, so an engine made
        later in the same command profiles anew."""
        if self.backend not in ("torch", "probe") or self.control is None:
            return
        import time

        from srtscope.probes import flush_request

        request = flush_request.FlushRequest(self.control)
        if not request.ask():
            return
        try:
            while not request.settled():
                time.sleep(flush_request.POLL_S)
        finally:
            (self.control / flush_request.STOP).unlink(missing_ok=True)

    def finish(self) -> None:
        """At exit (once per process): stop this process's profiler, write its probe trace, and
        say what was instrumented."""
        pid = os.getpid()
        if self.finished_pid == pid:
            return
        self.finished_pid = pid
        wrote = self._stop_profiler(pid)
        if self.backend == "probe":
            wrote = self._write_probe(pid)
        calls = dict(self.inst.calls)
        if calls:
            counts = ", ".join(f"{name} {n}" for name, n in sorted(calls.items()))
            where = f"; wrote {wrote}" if wrote is not None else ""
            sys.stderr.write(f"srtscope: --instrument {'+'.join(self.engines)} in process {pid}: "
                             f"{counts} calls{where}\n")
            sys.stderr.flush()

    def _write_probe(self, pid: int) -> Path | None:
        from srtscope.probes.export import ProbeStreamWriter
        from srtscope.probes.recorder import get_recorder

        flusher, self.flusher = self.flusher, None
        path = process_trace_path(self.out, pid)
        if self.control is not None:
            from srtscope.probes import flush_request

            flush_request.unmark(self.control, pid)       # written now, at exit
        rec = get_recorder()
        if not rec.raw_spans():
            if flusher is not None:
                flusher.stop(final_flush=False)
            return None
        rec.meta.setdefault("instrumented", "+".join(self.engines))
        try:
            if flusher is not None:
                flusher.stop(final_flush=True)
            else:
                ProbeStreamWriter(rec, path).flush(final=True)
            return path
        except OSError as exc:
            _warn(f"probe trace of process {pid} not written to {path}: {exc.strerror or exc}")
            return None


_session: _Session | None = None


def boot() -> None:
    """Set up this process as ``BOOT_ENV`` says; a no-op when it is unset, and once per process."""
    global _session
    raw = os.environ.get(BOOT_ENV)
    if not raw or _session is not None:
        return
    try:
        cfg = json.loads(raw)
        if cfg.get("protocol") != PROTOCOL:
            raise ValueError(f"protocol {cfg.get('protocol')!r}, expected {PROTOCOL}")
        backend, out, engines = cfg["backend"], Path(cfg["out"]), list(cfg.get("instrument") or [])
        control = Path(cfg["control"]) if cfg.get("control") else None
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}")
    except (ValueError, KeyError, TypeError) as exc:
        _warn(f"{BOOT_ENV} unreadable ({exc}); this process is not instrumented")
        return
    if not engines:
        return
    try:
        _session = _Session(backend, out, engines, control)
    except Exception as exc:
        _warn(f"--instrument could not be set up in process {os.getpid()}: {type(exc).__name__}: {exc}")
