"""torch.profiler captures of our own processes, written as Kineto traces.

``srtscope capture --backend torch`` either wraps a Python script in ``torch_profiling`` or sets
``TORCH_PROFILE_ENV`` to the trace path for commands that profile themselves: the engine's run,
and each tensor-parallel rank (``trace.rank<N>.json.gz``, since ranks are separate processes).

While a capture runs, every host thread is profiled and srtscope stage ranges are also
``record_function`` ranges, so the trace names our stages.
"""
from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

TORCH_PROFILE_ENV = "SRTSCOPE_TORCH_PROFILE"
TRACE_SUFFIXES = (".json.gz", ".json")

_active = False  # a capture of this process is running (torch.profiler does not nest)


def rank_trace_path(path: Path, rank: int) -> Path:
    """``trace.json.gz`` -> ``trace.rank1.json.gz`` (the suffix kept)."""
    name = path.name
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix):
            return path.with_name(f"{name[:-len(suffix)]}.rank{rank}{suffix}")
    return path.with_name(f"{name}.rank{rank}.json.gz")


def rank_traces(path: Path, since: float = 0.0) -> list[Path]:
    """The ``rank_trace_path`` files of ``path`` written at or after ``since`` (epoch seconds)."""
    first = rank_trace_path(path, 0).name
    pattern = first.replace(".rank0.", ".rank*.", 1)
    return sorted(p for p in path.parent.glob(pattern) if p.stat().st_mtime >= since)


def _all_threads_config() -> Any:
    """Kineto config that profiles threads started by the profiled code (None on older torch,
    where only the calling thread's ops are recorded)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        return None


@contextmanager
def torch_profiling(out: Path, skip_export: Callable[[], bool] | None = None) -> Iterator[None]:
    """Profile the enclosed block (CPU + CUDA when available) and export a Kineto trace to ``out``
    (gzip when it ends in ``.gz``; written atomically, also when the block raises), unless
    ``skip_export()`` says at the end that there is nothing worth keeping."""
    global _active
    import torch
    from torch.profiler import ProfilerActivity, profile

    from srtscope.probes.ranges import torch_annotations

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, record_shapes=False, with_stack=False,
                   experimental_config=_all_threads_config())
    prof.__enter__()
    _active = True
    torch_annotations(True)
    try:
        yield
    finally:
        torch_annotations(False)
        _active = False
        prof.__exit__(None, None, None)
        # NOTE: no return in this finally: it would swallow the block's exception
        if skip_export is None or not skip_export():
            _export_chrome_trace(prof, out)


def _export_chrome_trace(prof: Any, out: Path) -> None:
    """Write ``prof``'s trace to ``out`` atomically (gzip when it ends in ``.gz``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.json")
    prof.export_chrome_trace(str(tmp))
    if out.name.endswith(".gz"):
        part = out.with_name(out.name + ".part")
        with open(tmp, "rb") as src, gzip.open(part, "wb", compresslevel=5) as dst:
            shutil.copyfileobj(src, dst)
        tmp.unlink()
        part.replace(out)
    else:
        tmp.replace(out)


def from_env(rank: int | None = None) -> AbstractContextManager[None]:
    """``torch_profiling`` into the path ``TORCH_PROFILE_ENV`` names (per rank when ``rank`` is
    given), or a no-op when it is unset or this process is already being captured."""
    path = os.environ.get(TORCH_PROFILE_ENV)
    if not path or _active:
        return nullcontext()
    out = Path(path) if rank is None else rank_trace_path(Path(path), rank)
    return torch_profiling(out)
