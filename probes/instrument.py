"""Wrap a real engine's own functions in srtscope stage ranges, without editing the engine.

    inst = Instrumenter([ENGINES["vllm"]]).install()

From then on, when a module of the engine's table (``probes/engine_tables.py``) is imported, its
named functions are replaced by wrappers that open the target's stage range around the original
(``probes.ranges.stage``: NVTX under nsys, a ``record_function`` while torch annotations are on, the
recorder's span always). Modules imported before ``install`` are patched at once.

Promises: the wrapped function's result and exceptions pass through unchanged (a range closes and
the exception goes on); while ranges are disabled a wrapper only calls the original; a function
that is missing, or an engine version the table was not checked against, gives one warning line
(stderr, ``srtscope: warning: ...``), never an exception. Warnings are given once per process tree
(an environment variable remembers them for child processes).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from srtscope.probes import loop_turn, ranges
from srtscope.probes.engine_tables import EngineTable, Target
from srtscope.probes.stages import Stage

WARNED_ENV = "SRTSCOPE_INSTRUMENT_WARNED"   # warnings already given in this process tree (|-separated)
_MARK = "__srtscope_target__"               # set on our wrappers: never wrapped twice
_SHUTDOWN_MARK = "__srtscope_shutdown__"     # set on our shutdown wrappers


def _stderr_warning(message: str) -> None:
    sys.stderr.write(f"srtscope: warning: {message}\n")
    sys.stderr.flush()


def engine_version(table: EngineTable) -> str | None:
    """The installed version of the engine (the first of its distributions found), or None."""
    for dist in table.distributions:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_checked(table: EngineTable, version: str) -> bool:
    """Whether ``version``'s ``major.minor`` is one the table was checked against."""
    parts = version.split(".")
    return ".".join(parts[:2]) in table.checked


class Instrumenter:
    """The patches for some engines' tables in this process. ``calls`` counts, per stage name,
    the wrapped calls made while ranges were enabled (reset in a forked child); ``on_call`` runs
    before each such call (e.g. to start a profiler in a new process)."""

    def __init__(self, tables: Sequence[EngineTable],
                 warn: Callable[[str], None] = _stderr_warning) -> None:
        self.tables = list(tables)
        self.warn = warn
        self.by_module: dict[str, list[tuple[EngineTable, Target]]] = {}
        for table in self.tables:
            for target in table.targets:
                self.by_module.setdefault(target.module, []).append((table, target))
        #: module -> qualnames of the engines' shutdowns (``EngineTable.shutdown``): ``on_shutdown``
        #: runs before each such call
        self.shutdowns: dict[str, list[str]] = {}
        for table in self.tables:
            module, _, qualname = table.shutdown.partition(":")
            if qualname:
                self.shutdowns.setdefault(module, []).append(qualname)
        self.on_shutdown: Callable[[], None] | None = None
        self.calls: dict[str, int] = {}
        self.steps = 0          # loop.step ranges opened in this process (their ``step`` attribute)
        self.patched: list[Target] = []
        self.missing: list[Target] = []
        self.on_call: Callable[[], None] | None = None
        self._undo: list[tuple[Any, str, Any]] = []   # (owner, attribute, own value or _ABSENT)
        self._placed: list[tuple[Any, str, Any, Target]] = []   # (owner, attribute, what we set, target)
        self._versions_seen: set[str] = set()
        self._finder: _Finder | None = None
        self._lock = threading.Lock()

    # -- installing ---------------------------------------------------------------------------
    def install(self) -> Instrumenter:
        """Patch the modules already imported and those imported from now on."""
        loop_turn.reset()               # this thread's loop turn starts afresh (no polls pending)
        if self._finder is None:
            self._finder = _Finder(self)
            sys.meta_path.insert(0, self._finder)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=self._forked)
        for name in {*self.by_module, *self.shutdowns}:
            module = sys.modules.get(name)
            if module is not None:
                self.patch_module(module)
        return self

    def _forked(self) -> None:
        self.calls.clear()
        self.steps = 0

    def uninstall(self) -> None:
        """Remove the import hook and restore every patched attribute (tests)."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for owner, attr, value in reversed(self._undo):
            if value is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)
        self._undo.clear()
        self._placed.clear()
        self.patched.clear()

    def patch_module(self, module: Any) -> None:
        """Wrap the targets that live in ``module``; one warning line for those not found."""
        for qualname in self.shutdowns.get(getattr(module, "__name__", ""), []):
            self._patch_shutdown(module, qualname)
        entries = self.by_module.get(getattr(module, "__name__", ""), [])
        if not entries:
            return
        with self._lock:
            missing: list[Target] = []
            for table, target in entries:
                self._check_version(table)
                why = self._patch(module, target)
                if why is None:
                    self.patched.append(target)
                else:
                    self.missing.append(target)
                    if not target.optional:
                        missing.append(target)
            if missing:
                table = entries[0][0]
                version = engine_version(table) or "of unknown version"
                names = ", ".join(t.qualname for t in missing)
                self._warn_once(f"missing:{module.__name__}:{names}",
                                f"--instrument {table.name}: {module.__name__} of {table.name} "
                                f"{version} has no {names}; those stages are not marked")

    def _patch_shutdown(self, module: Any, qualname: str) -> None:
        """Run ``on_shutdown`` before ``module.qualname`` (an engine's shutdown); silently nothing
        where it is not there (its stages are what the warnings speak of)."""
        *path, attr = qualname.split(".")
        owner: Any = module
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                return
        fn = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        if not inspect.isfunction(fn) or getattr(fn, _SHUTDOWN_MARK, False):
            return

        @functools.wraps(fn)
        def shutdown(*args: Any, **kwargs: Any) -> Any:
            hook = self.on_shutdown
            if hook is not None:
                try:
                    hook()
                except Exception as exc:     # never in the engine's way
                    self.warn(f"--instrument: before {qualname}: {type(exc).__name__}: {exc}")
            return fn(*args, **kwargs)

        setattr(shutdown, _SHUTDOWN_MARK, True)
        self._undo.append((owner, attr, owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type)
                           else fn))
        setattr(owner, attr, shutdown)

    def _check_version(self, table: EngineTable) -> None:
        if table.name in self._versions_seen:
            return
        self._versions_seen.add(table.name)
        version = engine_version(table)
        if version is None:
            self._warn_once(f"version:{table.name}",
                            f"--instrument {table.name}: its installed version is unknown; "
                            f"the functions are wrapped where found")
        elif not version_checked(table, version):
            self._warn_once(f"version:{table.name}",
                            f"--instrument {table.name}: {table.name} {version} is not a version "
                            f"srtscope's table was checked against ({', '.join(table.checked)}); "
                            f"the functions are wrapped where found")

    def _warn_once(self, key: str, message: str) -> None:
        given = os.environ.get(WARNED_ENV, "")
        if key in given.split("|"):
            return
        os.environ[WARNED_ENV] = f"{given}|{key}" if given else key
        self.warn(message)

    def refresh(self) -> int:
        """Wrap again each target whose attribute was replaced since it was wrapped (a plugin's, a
        test's or a fault injector's monkeypatch that calls the wrapper): the stage range then
        encloses what the attribute holds now. Returns how many were wrapped again. Cheap (one dict
        lookup per target): run at each engine step."""
        again = 0
        for i, (owner, attr, placed, target) in enumerate(self._placed):
            now = owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type) else getattr(owner, attr, _ABSENT)
            if now is placed or now is _ABSENT:
                continue
            with self._lock:
                if self._patch_attr(owner, attr, target, index=i) is None:
                    again += 1
        return again

    def _patch(self, module: Any, target: Target) -> str | None:
        """Wrap one target; None when done (or already done), else why not."""
        parts = target.qualname.split(".")
        owner: Any = module
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                return f"no {part}"
        return self._patch_attr(owner, parts[-1], target)

    def _patch_attr(self, owner: Any, attr: str, target: Target, index: int | None = None) -> str | None:
        """Wrap ``owner.attr``; ``index``: the ``_placed`` entry it replaces (a refresh)."""
        try:
            raw = inspect.getattr_static(owner, attr)
        except AttributeError:
            return f"no {attr}"
        kind: Callable[[Any], Any] | None = None
        if isinstance(raw, (classmethod, staticmethod)):
            kind, fn = type(raw), raw.__func__
        else:
            fn = raw
        if not inspect.isfunction(fn):
            return "not a Python function"
        if getattr(fn, _MARK, None) is not None:
            return None
        wrapper = _wrap(fn, target, self)
        own = owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type) else getattr(owner, attr)
        placed = kind(wrapper) if kind is not None else wrapper
        setattr(owner, attr, placed)
        if index is None:
            self._undo.append((owner, attr, own))
            self._placed.append((owner, attr, placed, target))
        else:
            self._placed[index] = (owner, attr, placed, target)
        return None


class _Absent:
    pass


_ABSENT = _Absent()
_open_steps = threading.local()   # the loop.step ranges open on this thread (innermost last)
_inside = threading.local()       # .targets: the targets whose range is open on this thread


def _steps() -> list:
    try:
        return _open_steps.stack
    except AttributeError:
        _open_steps.stack = []
        return _open_steps.stack


def _wrap(fn: Callable[..., Any], target: Target, inst: Instrumenter) -> Callable[..., Any]:
    name = target.stage.value
    attrs: dict[str, object] = dict(target.attrs)
    mode_from = target.mode_from
    attrs_from = target.attrs_from
    is_step = target.stage is Stage.LOOP_STEP
    calls = inst.calls
    key = id(target)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ranges.is_enabled():
            return fn(*args, **kwargs)
        try:
            open_now = _inside.targets
        except AttributeError:
            open_now = _inside.targets = set()
        if key in open_now:        # wrapped again around a monkeypatch (refresh): one range is enough
            return fn(*args, **kwargs)
        open_now.add(key)
        try:
            return _call(fn, args, kwargs)
        finally:
            open_now.discard(key)

    def _call(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        hook = inst.on_call
        if hook is not None:
            hook()
        if is_step and _steps():       # inside an open step (LLMEngine.step -> EngineCore.step)
            return fn(*args, **kwargs)
        calls[name] = calls.get(name, 0) + 1
        if target.turn is not None and ranges.recorder_only():
            return loop_turn.call(fn, args, kwargs, target, {**attrs, **_call_attrs(attrs_from, args, kwargs)}
                                  if attrs_from is not None else attrs, _mode_of)
        if is_step:
            if inst._placed:
                inst.refresh()
            # NOTE: numbered per process, like the engine's own loop.step (diagnose --steps A:B)
            inst.steps += 1
            step_attrs: dict[str, object] = {**attrs, "step": inst.steps - 1}
        else:
            step_attrs = attrs
        if attrs_from is not None:
            step_attrs = {**step_attrs, **_call_attrs(attrs_from, args, kwargs)}
        with ranges.stage(name, **step_attrs) as r:
            if is_step:
                stack = _steps()
                stack.append(r)
                try:
                    return fn(*args, **kwargs)
                finally:
                    stack.pop()
            result = fn(*args, **kwargs)
            if mode_from is not None:
                _set_mode(r, mode_from, result)
            return result

    setattr(wrapper, _MARK, target)
    return wrapper


def _mode_of(mode_from: Callable[[Any], str | None] | None, result: Any) -> str | None:
    """The step mode ``mode_from`` reads from ``result``, also set on the enclosing ``loop.step``; a
    reader that fails is ignored (the engine's result must not be touched)."""
    if mode_from is None:
        return None
    try:
        mode = mode_from(result)
    except Exception:
        return None
    stack = _steps()
    if mode is not None and stack:
        stack[-1].set(mode=mode)
    return mode


def _call_attrs(attrs_from: Callable[[tuple, dict], dict[str, object]], args: tuple, kwargs: dict
                ) -> dict[str, object]:
    """The attributes ``attrs_from`` reads from the call's arguments; {} when it fails (the engine's
    call must not be touched)."""
    try:
        return dict(attrs_from(args, kwargs))
    except Exception:
        return {}


def _set_mode(r: Any, mode_from: Callable[[Any], str | None], result: Any) -> None:
    """The step's mode on this range and on the enclosing ``loop.step`` (``_mode_of``)."""
    mode = _mode_of(mode_from, result)
    if mode is not None:
        r.set(mode=mode)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a target module with the other finders and hands back its spec with a loader that
    patches the module right after it ran."""

    def __init__(self, inst: Instrumenter) -> None:
        self.inst = inst
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if (fullname not in self.inst.by_module and fullname not in self.inst.shutdowns) \
                or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.inst)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    """Runs the module with its own loader (put back on the module and its spec first, so the
    module looks as if imported normally), then patches it."""

    def __init__(self, loader: Any, inst: Instrumenter) -> None:
        self._loader = loader
        self._inst = inst

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        try:
            self._inst.patch_module(module)
        except Exception as exc:   # never let instrumentation break the engine's import
            self._inst.warn(f"--instrument: could not patch {module.__name__}: "
                            f"{type(exc).__name__}: {exc}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
