"""A tiny stand-in for a real engine, written from an ``EngineTable``: every module the table names,
with every class and function it names, plus a ``*.dist-info`` of the version asked for. So the
tests run exactly the names ``--instrument`` declares, without vLLM or SGLang installed.

Each generated method ``f(self, x=0, *, fail=False, sleep_s=0.0)`` sleeps ``sleep_s``, raises
``ValueError("<qualname> failed")`` when ``fail``, returns None when ``x`` is None (a call that found
nothing: SGLang's idle get_next_batch_to_run), else returns ``Out(x, "<qualname>")``: a result
that says who computed it and carries ``num_scheduled_tokens`` / ``forward_mode`` (what the tables'
``mode_from`` readers look at) from ``x`` when ``x`` is a dict / a str. ``<package>._fake_out.HOOKS``
maps a qualname to a function of ``x`` run inside that method first (how a driver makes one engine
step call the others). The table's ``shutdown`` is written the same way.
"""
from __future__ import annotations

import sys
from pathlib import Path

from srtscope.probes.engine_tables import EngineTable

_OUT = '''
import enum
import time


class Mode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4


class Out:
    def __init__(self, x, who):
        self.x = x
        self.who = who
        self.num_scheduled_tokens = x if isinstance(x, dict) else None
        self.forward_mode = Mode[x.upper()] if isinstance(x, str) and x.upper() in Mode.__members__ else None

    def __eq__(self, other):
        return isinstance(other, Out) and (self.x, self.who) == (other.x, other.who)

    def __repr__(self):
        return f"Out({self.x!r}, {self.who!r})"


HOOKS = {}   # qualname -> function(x) run inside the method (a driver builds an engine step with it)


def body(who, x, fail, sleep_s):
    hook = HOOKS.get(who)
    if hook is not None:
        hook(x)
    if sleep_s:
        time.sleep(sleep_s)
    if fail:
        raise ValueError(f"{who} failed")
    return None if x is None else Out(x, who)
'''


def write_fake_engine(root: Path, table: EngineTable, version: str,
                      skip: tuple[str, ...] = ()) -> Path:
    """Write the engine's package under ``root`` (put ``root`` on sys.path); ``skip``: qualnames
    left out (a version whose functions moved)."""
    modules: dict[str, dict[str, list[str]]] = {}
    for t in table.targets:
        if t.qualname in skip:
            continue
        cls, _, meth = t.qualname.rpartition(".")
        modules.setdefault(t.module, {}).setdefault(cls, []).append(meth)
    for t in table.targets:        # a module whose every target was skipped still exists
        modules.setdefault(t.module, {})
    if table.shutdown:             # the engine's shutdown, hooked like the others
        module, _, qualname = table.shutdown.partition(":")
        cls, _, meth = qualname.rpartition(".")
        modules.setdefault(module, {}).setdefault(cls, []).append(meth)
    pkg = root / table.package
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_fake_out.py").write_text(_OUT)
    for module, classes in modules.items():
        parts = module.split(".")
        folder = root.joinpath(*parts[:-1])
        for i in range(1, len(parts)):
            init = root.joinpath(*parts[:i], "__init__.py")
            init.parent.mkdir(parents=True, exist_ok=True)
            if not init.exists():
                init.write_text("")
        lines = [f"from {table.package}._fake_out import body\n"]
        for cls, methods in classes.items():
            if not cls:
                for m in methods:
                    lines.append(f"def {m}(x=0, *, fail=False, sleep_s=0.0):\n"
                                 f"    return body({m!r}, x, fail, sleep_s)\n")
                continue
            lines.append(f"class {cls}:\n")
            for m in methods:
                lines.append(f"    def {m}(self, x=0, *, fail=False, sleep_s=0.0):\n"
                             f"        return body({cls + '.' + m!r}, x, fail, sleep_s)\n")
        (folder / f"{parts[-1]}.py").write_text("\n".join(lines))
    dist = table.distributions[0]
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return pkg


def forget(package: str) -> None:
    """Drop the package's modules from ``sys.modules`` (the next import runs them again)."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
