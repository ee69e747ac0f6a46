"""The profiler's own stop is no engine work: a trailing range still open when the profiler stopped is cut.

A range open at the stop ends, in the export, at the record window's end (Kineto's ``Record Window
End`` instant): its end is the stop, not the work's. When such a range holds no complete annotation
or operator of its thread (no work recorded inside it; Python frames do not count: the stop's own
frames sit there), all it holds is the wait for, and the call of, the stop:
SGLang handles ``stop_profile`` inside ``scheduler.process_input_requests``, so every SGLang trace
ended with one such range of 20 ms to 0.9 s, which the step finder counted as a step of scheduler
time. It is cut, with what ran on its thread after its start; a range open at the stop that does
hold complete work (an outer loop, a ``ProfilerStep#N`` with its operators), or that is its
thread's only range, is kept as it is.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import GPU_DOMAIN, OP_DOMAIN

#: a range ending this close to the record window's end was open at the stop, ns (export rounding)
STOP_TOLERANCE_NS = 2_000


def cut_open_at_stop(ranges: pd.DataFrame, stop_ns: int) -> tuple[pd.DataFrame, list[tuple[str, int]]]:
    """(``ranges`` less the trailing ranges open at ``stop_ns`` and what their threads ran after
    their start, [(name, duration ns)] of the ranges cut). Needs columns start_ns, end_ns, pid,
    tid, name, domain (annotations are domain ``""``)."""
    if len(ranges) == 0:
        return ranges, []
    s, e = ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)
    domain = ranges["domain"].astype(str).to_numpy()
    host = domain != GPU_DOMAIN
    open_ = host & (e >= stop_ns - STOP_TOLERANCE_NS)
    if not open_.any():
        return ranges, []
    pid, tid = ranges["pid"].to_numpy(), ranges["tid"].to_numpy()
    work = ((domain == "") | (domain == OP_DOMAIN)) & ~open_
    drop = np.zeros(len(ranges), bool)
    cut: list[tuple[str, int]] = []
    for i in np.flatnonzero(open_ & (domain == "")):
        same = (pid == pid[i]) & (tid == tid[i])
        if (work & same & (s >= s[i]) & (e <= e[i])).any():
            continue                     # it holds complete work: an outer range, kept
        if not (work & same & (e <= s[i])).any():
            continue                     # nothing ran on its thread before it: no trailing range
        drop |= same & (s >= s[i])
        cut.append((str(ranges["name"].iat[int(i)]), int(e[i] - s[i])))
    if not drop.any():
        return ranges, []
    return ranges[~drop].reset_index(drop=True), cut


def stop_message(cut: list[tuple[str, int]]) -> str:
    """The capture note for the ranges cut."""
    shown = ", ".join(f"{n} ({d / 1e6:.1f} ms)" for n, d in cut[:3]) + (f" and {len(cut) - 3} more"
                                                                        if len(cut) > 3 else "")
    return (f"the trace ends inside {shown}, still open when the profiler stopped: it holds the "
            "profiler's own stop and export, not the engine's work, and is left out")
