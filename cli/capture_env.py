"""What ``srtscope capture`` puts into the profiled command's environment, and the checks before.

- The interpreter the user named runs the command (``python`` is the one on PATH, as without
  srtscope). A Python command under ``--backend torch`` runs as
  ``PYTHON [options] -m srtscope.cli.torch_profile --out TRACE -- TARGET...``.
- A temporary folder (removed afterwards; one a killed capture left behind is removed by the next
  capture: ``sweep_boot_dirs``) goes first on the command's ``PYTHONPATH``. It holds
  only ``srtscope``: a copy of the parts that run inside the command (``import_path``), so an
  engine's venv imports the same srtscope as the command line without an install into it, without
  the user's or the checkout's other folders on its path, and nothing is written into the checkout. With
  ``--instrument`` it also holds a generated ``sitecustomize``: every Python process of the command
  runs ``srtscope.probes.capture_boot.boot()`` at start-up, then the ``sitecustomize`` it shadows.
- Before the run, that interpreter must import srtscope's modules through that folder (one short
  check); if it cannot (an older Python), one error line says why.
- The engines' own profiling switches are set unless the user set them (``ENGINE_SWITCHES``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from srtscope.analyzers.spill.spill_folder import owner_alive, owner_stamp
from srtscope.cli.errors import fail, one_line
from srtscope.probes.capture_boot import BOOT_ENV, PROTOCOL

#: Set for every capture unless already in the environment: extra ranges the engines emit
#: themselves (vLLM: ``record_function`` scopes in its scheduler and model runner).
ENGINE_SWITCHES: dict[str, str] = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}
#: Also set under nsys: the engines' NVTX ranges (SGLang's ``scheduler.*``, vLLM's scopes).
NSYS_ENGINE_SWITCHES: dict[str, str] = {"VLLM_NVTX_SCOPES_FOR_PROFILING": "1",
                                        "SGLANG_ENABLE_NVTX_SCHEDULER": "1"}
PREFLIGHT_TIMEOUT_S = 60.0

#: Interpreter options that take a value (``-X dev``, ``-W error``); other options are flags.
_OPTS_WITH_VALUE = ("-X", "-W")

SITECUSTOMIZE = '''\
"""Written by srtscope capture (removed when the capture ends): the capture bootstrap, then the
sitecustomize this file shadows."""
import os as _os
import sys as _sys


def _srtscope_chain():
    here = _os.path.dirname(_os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        _sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n"
                          "%s: %s\\n" % (type(exc).__name__, exc))


def _srtscope_boot():
    try:
        from srtscope.probes import capture_boot
    except Exception as exc:
        _sys.stderr.write("srtscope: warning: srtscope is not importable by %s (%s: %s): process %d "
                          "is not instrumented\\n" % (_sys.executable, type(exc).__name__, exc,
                                                       _os.getpid()))
        return
    capture_boot.boot()


_srtscope_chain()
_srtscope_boot()
'''


@dataclass(frozen=True)
class PythonCommand:
    """``python [OPTIONS] TARGET...``: the interpreter (resolved), its options, and the target
    (``script ARGS``, ``-m module ARGS`` or ``-c code ARGS``)."""

    python: str
    options: list[str]
    target: list[str]


def split_python(command: list[str]) -> PythonCommand | None:
    """The parts of a Python command, or None when ``command`` does not start with an
    interpreter named ``python*``. An incomplete one (``python``, ``python -m``, ``python -c``,
    ``python -``) is refused with one error line."""
    exe = Path(command[0]).name
    if not exe.startswith("python"):
        return None
    python = shutil.which(command[0]) or command[0]
    options: list[str] = []
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] not in ("-m", "-c", "-"):
        opt = command[i]
        options.append(opt)
        if opt in _OPTS_WITH_VALUE:
            if i + 1 >= len(command):
                fail(f"{' '.join(command)}: {opt} needs a value")
            options.append(command[i + 1])
            i += 1
        i += 1
    target = command[i:]
    usage = "python script.py ARGS, python -m module ARGS or python -c CODE"
    if not target:
        fail(f"'{' '.join(command)}' names no script to profile; give {usage}")
    if target[0] == "-":
        fail(f"'{' '.join(command)}': a script read from stdin cannot be profiled; give {usage}")
    if target[0] in ("-m", "-c") and (len(target) < 2 or not target[1]):
        what = "a module" if target[0] == "-m" else "code"
        fail(f"'{' '.join(command)}': {target[0]} needs {what}; give {usage}")
    return PythonCommand(python, options, target)


def interpreter_of(command: list[str]) -> str | None:
    """The Python interpreter that runs ``command``: a ``python*`` named first, or the
    interpreter of a script whose ``#!`` line names Python (console scripts such as ``vllm``);
    None otherwise."""
    exe = Path(command[0]).name
    if exe.startswith("python"):
        return shutil.which(command[0]) or command[0]
    path = shutil.which(command[0])
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = words[1:]
    if words and Path(words[0]).name.startswith("python"):
        return shutil.which(words[0]) or words[0]
    return None


def srtscope_fix(python: str) -> str:
    """What ``python`` needs to import the srtscope the capture puts on its path."""
    return ("srtscope runs there from the capture's own import path (nothing is installed into that "
            "interpreter) and needs Python >= 3.10; for an older one install srtscope into an "
            "interpreter of 3.10 or newer that runs the engine")


def preflight(python: str, env: dict[str, str], modules: list[str]) -> None:
    """``python`` must import ``modules`` (srtscope's, in the command's environment); else one
    error line with the fix (exit 2). Bounded by ``PREFLIGHT_TIMEOUT_S``."""
    code = "import " + ", ".join(modules)
    try:
        done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                              timeout=PREFLIGHT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        fail(f"command not found: {python}")
    except PermissionError:
        fail(f"command not executable: {python}")
    except OSError as exc:
        fail(f"cannot run {python}: {exc.strerror or exc}")
    except subprocess.TimeoutExpired:
        fail(f"{python} did not import srtscope within {PREFLIGHT_TIMEOUT_S:.0f} s")
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        why = one_line(lines[-1]) if lines else f"exit code {done.returncode}"
        fail(f"srtscope is not importable by {python} ({why}); the capture bootstrap runs inside "
             f"that interpreter: {srtscope_fix(python)}")


def engine_switches(env: dict[str, str], nsys: bool) -> list[str]:
    """Set the engines' profiling switches the user did not set; returns the names set."""
    wanted = dict(ENGINE_SWITCHES)
    if nsys:
        wanted.update(NSYS_ENGINE_SWITCHES)
    set_now = []
    for key, value in wanted.items():
        if key not in env:
            env[key] = value
            set_now.append(key)
    return set_now


#: what of srtscope runs inside a captured command: the package's ``__init__``, the probes (the
#: capture bootstrap, stage ranges, recorder, engine tables) and the torch backend's runner
ENGINE_SIDE = ("probes", "cli/__init__.py", "cli/torch_profile.py")


def import_path(folder: Path) -> Path:
    """A copy of the srtscope a captured command runs (``ENGINE_SIDE``, this srtscope's own files:
    no install into the engine's interpreter, nothing written into a checkout, none of the user's or
    the checkout's other folders on its path) as ``folder/srtscope``; returns it."""
    import srtscope
    import srtscope.cli
    import srtscope.probes

    root = folder / "srtscope"
    root.mkdir()
    shutil.copy2(srtscope.__file__, root / "__init__.py")
    sources = {"probes": Path(srtscope.probes.__file__).parent, "cli": Path(srtscope.cli.__file__).parent}
    for part in ENGINE_SIDE:
        top, _, name = part.partition("/")
        src = sources[top]
        (root / top).mkdir(exist_ok=True)
        if name:
            shutil.copy2(src / name, root / top / name)
            continue
        for f in src.iterdir():
            if f.is_file() and (f.suffix == ".py" or f.suffix == ".so"):
                shutil.copy2(f, root / top / f.name)
    return root


BOOT_PREFIX = "srtscope-boot-"
#: in each boot folder: the pid of the capture that made it
BOOT_OWNER = "owner.pid"


def sweep_boot_dirs(tmp: Path) -> list[Path]:
    """Remove the boot folders in ``tmp`` whose capture is gone (a SIGKILL runs no clean-up): those
    of this user whose ``BOOT_OWNER`` names a process no longer running (the spill's owner files,
    ``spill_folder.owner_alive``); returns them. NOTE: a folder without that file is left alone."""
    gone = []
    for d in sorted(tmp.glob(BOOT_PREFIX + "*")):
        try:
            owner = d / BOOT_OWNER
            if d.is_symlink() or d.stat().st_uid != os.getuid() or owner.is_symlink() \
                    or owner_alive(owner.read_text()):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    return gone


@contextmanager
def boot_dir(env: dict[str, str], backend: str, out: Path, engines: list[str]) -> Iterator[Path]:
    """A temporary folder put first on ``env``'s PYTHONPATH, removed on exit: srtscope's own import
    path (``import_path``) and, with ``engines``, the generated ``sitecustomize`` and ``BOOT_ENV``
    describing the capture."""
    sweep_boot_dirs(Path(tempfile.gettempdir()))
    folder = Path(tempfile.mkdtemp(prefix=BOOT_PREFIX))
    try:
        (folder / BOOT_OWNER).write_text(owner_stamp())
        import_path(folder)
        if engines:
            (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
            # the folder is also the capture's control folder: traces written on request
            # (probes.flush_request) before a signal goes on
            env[BOOT_ENV] = json.dumps({"protocol": PROTOCOL, "backend": backend,
                                        "out": str(out.resolve()), "instrument": engines,
                                        "control": str(folder)})
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(folder) + (os.pathsep + old if old else "")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
