"""``stage()``: one range = an NVTX push/pop in the ``srtscope`` domain + a span in the recorder
(+ a ``record_function`` while a torch-profiler capture asks for it, see ``torch_annotations``).

    with stage("sched.schedule", bs=32) as r:
        ...
        r.set(admitted=4)          # attributes known only later; recorded at exit

    @stage("run.sample")
    def sample(...): ...

Disabled (the default), ``stage()`` returns a cached no-op object: a call and two method calls.
As a decorator it checks ``enabled`` at each call, so decorating at import time is fine.

Two implementations of the same spans: the C extension ``_fastrange`` (probes/_fastrange.c), used
where it is built, and this module's Python path, used for NVTX with a collector attached (under
nsys; without one NVTX is idle and the ranges stay in C) and torch annotations (the C range
delegates to it then), where the extension is missing, and always with ``SRTSCOPE_PROBES_PURE=1``
in the environment at import. Both share one per-thread depth and record the same 6 values per span.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from srtscope.probes import recorder as _recorder_mod
from srtscope.probes.stages import DOMAIN, format_message


def _load_c() -> Any:
    """The C extension, or None: not built, not Linux, or ``SRTSCOPE_PROBES_PURE=1``.

    NOTE: the C ranges read CLOCK_MONOTONIC, which is ``perf_counter_ns``'s clock on Linux only;
    one reading between two of ``perf_counter_ns`` checks it at import.
    """
    if os.environ.get("SRTSCOPE_PROBES_PURE", "") not in ("", "0") or not sys.platform.startswith("linux"):
        return None
    try:
        import srtscope.probes._fastrange as _fastrange
    except ImportError:
        return None
    a = perf_counter_ns()
    b = _fastrange.clock_ns()
    return _fastrange if a <= b <= perf_counter_ns() else None


_C = _load_c()
_PURE = _C is None  # the Python path for every range (set_pure switches it in-process, for tests)


class _State:
    __slots__ = ("enabled", "nvtx", "nvtx_error", "nvtx_idle", "domain", "torch_rf")

    def __init__(self) -> None:
        self.enabled = False
        self.nvtx = False
        self.nvtx_error: str | None = None
        self.nvtx_idle = False   # NVTX asked for, but no collector attached
        self.domain: Any = None   # nvtx.Domain while NVTX is on
        self.torch_rf: tuple[Any, Any] | None = None  # (enter, exit) of torch's record_function ops while annotating

    def __setattr__(self, key: str, value: Any) -> None:
        # NOTE: every change (enable, torch_annotations, a test's monkeypatch) re-derives the C
        # path's mode, so the C stage() can never miss that NVTX or annotations went on
        object.__setattr__(self, key, value)
        _sync_c(self)


def _sync_c(st: _State) -> None:
    """Tell the C stage() what to do: 0 disabled, 1 recorder-only fast path, 2 the Python path."""
    if _C is None:
        return
    if _PURE or getattr(st, "nvtx", False) or getattr(st, "torch_rf", None) is not None:
        _C.set_mode(2)
    else:
        _C.set_mode(1 if getattr(st, "enabled", False) else 0)


_STATE = _State()
_ENABLED = False  # mirrors _STATE.enabled as a plain global: the disabled check is one load
_tls = threading.local()


def _thread_state() -> Any:
    """This thread's (tid, depth) object; with the C path on, the very object the C ranges use."""
    try:
        return _tls.s
    except AttributeError:
        s = _TLS() if _PURE else _C.thread_state()
        _tls.s = s
        return s


class _TLS:
    __slots__ = ("tid", "depth")

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        self.depth = 0


def enable(nvtx: bool = True) -> bool:
    """Turn recording on. With ``nvtx`` the ranges also go to NVTX; returns whether NVTX is
    available (``nvtx_status``: live with a collector attached, idle without one)."""
    global _ENABLED
    _STATE.enabled = _ENABLED = True
    _STATE.nvtx = False
    _STATE.nvtx_error = None
    _STATE.nvtx_idle = False
    _STATE.domain = None
    if not nvtx:
        return False
    try:
        import nvtx as _nvtx  # type: ignore

        domain = _nvtx.get_domain(DOMAIN)
    except Exception as exc:  # nvtx missing or broken: record without it
        _STATE.nvtx_error = f"{type(exc).__name__}: {exc}"
        return False
    _NVTX_ATTRS.clear()
    if _collector_attached(domain):
        _STATE.domain = domain
        _STATE.nvtx = True
    else:
        # NOTE: no collector (no nsys): every NVTX call would be a no-op costing ~1 us a range, so
        # the ranges take the recorder's path. A collector is attached at process start (nsys
        # puts its injection library in the environment), so this holds for the process.
        _STATE.nvtx_idle = True
    return True


def _collector_attached(domain: Any) -> bool:
    """Whether NVTX calls on ``domain`` reach a tool. nvtx hands out a no-op domain when none is
    attached; a domain that cannot tell is taken as live."""
    handle = getattr(domain, "handle", None)
    if handle is not None and hasattr(handle, "enabled"):
        return bool(handle.enabled())
    return type(domain).__name__ != "DummyDomain"


def nvtx_status() -> str:
    """``"on"`` (a collector records the ranges), ``"idle"`` (asked for, but no collector is
    attached: nothing to send them to), ``"off"`` (not asked for) or ``"unavailable: <why>"``,
    since the last ``enable``."""
    if _STATE.nvtx:
        return "on"
    if _STATE.nvtx_idle:
        return "idle"
    return f"unavailable: {_STATE.nvtx_error}" if _STATE.nvtx_error else "off"


def disable() -> None:
    global _ENABLED
    _STATE.enabled = _ENABLED = False
    _STATE.nvtx = False
    _STATE.nvtx_idle = False
    _STATE.domain = None


def is_enabled() -> bool:
    return _ENABLED


def torch_annotations(on: bool) -> None:
    """Also open a torch ``record_function`` per enabled range, so a torch-profiler (Kineto) trace
    carries the stage names as ``user_annotation`` events. Set by ``srtscope capture --backend
    torch``; independent of ``enable``/``disable``.

    NOTE: costs a few µs per range, so it is on only while such a capture runs.
    """
    if not on:
        _STATE.torch_rf = None
        return
    import torch

    _STATE.torch_rf = _record_function_calls(torch)


def _record_function_calls(torch: Any) -> tuple[Callable[[str, Any], Any], Callable[[Any], None]]:
    """(enter(name, args) -> handle, exit(handle)): torch's ``record_function`` at its cheapest.

    NOTE: the ``torch.ops.profiler`` ops called bare cost ~20 µs a range (their exit goes through
    the ``__torch_function__`` dispatch of its ScriptObject argument), 5x a wrapped engine function
    as small as vLLM's ``KVCacheManager.allocate_slots``, called per request per step: an
    instrumented capture read that cost as the engine's batch preparation. The autograd entry
    points make the same ``user_annotation`` event for ~4 µs; older torch: the ops, the exit with
    that dispatch off."""
    enter = getattr(torch.autograd, "_record_function_with_args_enter", None)
    leave = getattr(torch.autograd, "_record_function_with_args_exit", None)
    if enter is not None and leave is not None:
        return (lambda name, args: enter(name)), leave
    ops = torch.ops.profiler
    enter_op, exit_op = ops._record_function_enter_new, ops._record_function_exit._RecordFunction
    no_dispatch = torch._C.DisableTorchFunctionSubclass

    def exit_fast(handle: Any) -> None:
        with no_dispatch():
            exit_op(handle)

    return enter_op, exit_fast


class _NullRange:
    """Disabled range. Cached per name so the disabled path allocates nothing."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, fn: Callable) -> Callable:
        return _Decorator(self.name, {})(fn)

    def __enter__(self) -> _NullRange:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def set(self, **attrs: Any) -> None:
        return None


_NULLS: dict[str, _NullRange] = {}
_NVTX_ATTRS: dict[str, object] = {}  # cached NVTX event attributes of attribute-less ranges


class _Range:
    __slots__ = ("name", "attrs", "t0", "ts", "pushed", "rf")

    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        self.name = name
        self.attrs = attrs

    def set(self, **attrs: Any) -> None:
        self.attrs.update(attrs)

    def __call__(self, fn: Callable) -> Callable:
        return _Decorator(self.name, dict(self.attrs))(fn)

    def __enter__(self) -> _Range:
        try:
            ts = _tls.s
        except AttributeError:
            ts = _thread_state()
        self.ts = ts
        ts.depth += 1
        st = _STATE
        if st.nvtx:
            dom = st.domain
            if self.attrs:
                ev = dom.get_event_attributes(message=format_message(self.name, self.attrs))
            else:
                ev = _NVTX_ATTRS.get(self.name)
                if ev is None:
                    ev = _NVTX_ATTRS[self.name] = dom.get_event_attributes(message=self.name)
            dom.push_range(ev)
            self.pushed = True
        else:
            self.pushed = False
        self.t0 = perf_counter_ns()
        rf = st.torch_rf
        # NOTE: inside the span, so that a capture's annotation cost is charged to the stage that
        # pays it, not left between stages where it would read as unannotated host time
        self.rf = None if rf is None else (
            rf, rf[0](format_message(self.name, self.attrs) if self.attrs else self.name, None))
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.rf is not None:
            self.rf[0][1](self.rf[1])
        t1 = perf_counter_ns()
        ts = self.ts
        ts.depth -= 1
        if self.pushed:
            _STATE.domain.pop_range()
        _recorder_mod._DEFAULT._spans.extend(
            (self.name, self.t0, t1, ts.tid, ts.depth, self.attrs or None))


class _NullAttrs(_NullRange):
    """Disabled range that carries attributes (only needed to decorate lazily)."""

    __slots__ = ("attrs",)

    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        self.name = name
        self.attrs = attrs

    def __call__(self, fn: Callable) -> Callable:
        return _Decorator(self.name, self.attrs)(fn)


class _Decorator:
    __slots__ = ("name", "attrs")

    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        self.name = name
        self.attrs = attrs

    def __call__(self, fn: Callable) -> Callable:
        name, attrs = self.name, self.attrs

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _ENABLED:
                return fn(*args, **kwargs)
            with stage(name, **attrs):  # a fresh attrs dict per call, C or Python range
                return fn(*args, **kwargs)

        return wrapper


def _py_stage(name: str, **attrs: Any) -> Any:
    """A probe range named after a taxonomy stage (see ``probes.stages``).

    Usable as ``with stage(...)`` or ``@stage(...)``. Attribute values should be scalars.
    """
    if _ENABLED:
        return _Range(name, attrs)
    if attrs:
        return _NullAttrs(name, attrs)
    try:
        return _NULLS[name]
    except KeyError:
        null = _NULLS[name] = _NullRange(name)
        return null


#: ``stage(name, **attrs)``: the C function where the extension is loaded (it hands NVTX, torch
#: annotations and the forced pure path to ``_py_stage``), else ``_py_stage`` itself
stage: Callable[..., Any] = _py_stage
if _C is not None:
    _C.bind(vars(_recorder_mod), _py_stage, _Decorator)
    stage = _C.stage
    _sync_c(_STATE)


def implementation() -> str:
    """``"C"`` or ``"Python"``: which path an enabled recorder-only range takes now."""
    return "Python" if _PURE else "C"


def set_pure(pure: bool) -> bool:
    """Force the Python path (True) or use the C one where built (False); returns whether the Python
    path is now in use. For tests and benchmarks comparing the two in one process.

    NOTE: switch only with no range open: each path keeps its own per-thread depth.
    """
    global _PURE, _tls
    _PURE = pure or _C is None
    _tls = threading.local()
    _sync_c(_STATE)
    return _PURE


def recorder_only() -> bool:
    """Whether enabled ranges reach the recorder alone (no NVTX; torch annotations on only while no
    torch profiler records them): a span may then be recorded after the fact (``record_span``) as
    well as around its work."""
    if not _ENABLED or _STATE.nvtx:
        return False
    if _STATE.torch_rf is None:
        return True
    try:
        import torch

        from srtscope.probes import torch_capture

        # NOTE: srtscope's own profiler records all threads, which torch's per-thread flag misses
        return not (torch_capture._active or torch.autograd._profiler_enabled())
    except Exception:
        return False


def record_span(name: str, start_ns: int, end_ns: int, **attrs: Any) -> None:
    """Record a span whose times were measured elsewhere (e.g. a CUDA-event device time)."""
    if _ENABLED:
        ts = _thread_state()
        _recorder_mod._DEFAULT.add_span(name, start_ns, end_ns, ts.tid, ts.depth, attrs)


