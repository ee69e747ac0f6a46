"""CPU stand-ins for device activity.

On a CPU run of an engine there is no device: the engine's forward ranges are the closest thing to
device activity, so readers add them as device rows of kind ``cpu_forward`` (warning
``cpu_stand_in``). Which ranges are forwards is ``probes.stages.name_role``: ours (``run.eager``,
``run.graph_replay``, ``run.sample``: the model's sampling is its work too, as vLLM's own
``gpu_model_runner: sample`` scope is read; ``comm.all_reduce``) and real engines' forward scopes (vLLM's
``gpu_model_runner: forward``, SGLang's ``step[DECODE bs=8]`` (0.5.23) and
``cuda_graph_runner.replay``) are FORWARD; where a trace has none, the engine's whole model-step
ranges (vLLM's ``execute_*``, SGLang's ``scheduler.run_batch``: EXECUTE) stand in, and the batch
preparation inside them cannot be told apart from the forward.
Probe traces always get stand-ins; Kineto traces do when they hold no device activity.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.model.columns import str_codes
from srtscope.analyzers.model.timeline import GPU_DOMAIN, DeviceKind, TimelineMeta, Traced, WarningCode
from srtscope.probes.stages import NameRole, Stage, engine_name, name_role

#: Our own engine's forward stages (probe traces).
FORWARD_STAGES = (Stage.RUN_EAGER.value, Stage.RUN_GRAPH_REPLAY.value, Stage.RUN_SAMPLE.value,
                  Stage.COMM_ALL_REDUCE.value)


def _stand_in_rows(ranges: pd.DataFrame) -> tuple[np.ndarray, NameRole | None]:
    """(mask of the ranges that stand in, the role used: FORWARD, else EXECUTE, else None)."""
    codes, names = str_codes(ranges["name"])
    roles = [name_role(str(n)) for n in names]
    host = ranges["domain"].to_numpy() != GPU_DOMAIN if "domain" in ranges else np.ones(len(ranges), bool)
    for role in (NameRole.FORWARD, NameRole.EXECUTE):
        lut = np.array([r is role for r in roles] + [False], dtype=bool)
        m = lut[codes] & host
        if m.any():
            return m, role
    return np.zeros(len(ranges), bool), None


def forward_stand_ins(ranges: pd.DataFrame | None, device: int) -> pd.DataFrame:
    """Device rows (kind ``cpu_forward``, on ``device``, stream 0) for the host ranges that are an
    engine's forward (else its whole model step), and the model's work after a forward inside its
    model step (``_after_forward``); empty when there are none."""
    if ranges is None or len(ranges) == 0:
        return pd.DataFrame()
    fwd, role = _stand_in_rows(ranges)
    r = ranges[fwd]
    start, end = r["start_ns"].to_numpy(), r["end_ns"].to_numpy()
    names, pid, rank = np.asarray(r["name"], dtype=object), r["pid"].to_numpy(), r["rank"].to_numpy()
    if role is NameRole.FORWARD:
        t = _after_forward(ranges, fwd)
        if len(t):
            start = np.concatenate([start, t["start_ns"].to_numpy()])
            end = np.concatenate([end, t["end_ns"].to_numpy()])
            names = np.concatenate([names, np.asarray(t["name"], dtype=object)])
            pid, rank = np.concatenate([pid, t["pid"].to_numpy()]), np.concatenate([rank, t["rank"].to_numpy()])
            order = np.argsort(start, kind="stable")
            start, end, names, pid, rank = start[order], end[order], names[order], pid[order], rank[order]
    return pd.DataFrame({"start_ns": start, "end_ns": end, "kind": DeviceKind.CPU_FORWARD.value,
                         "name": pd.Categorical(names), "device": device, "stream": 0, "pid": pid, "rank": rank})


def _after_forward(ranges: pd.DataFrame, fwd: np.ndarray) -> pd.DataFrame:
    """The model's work after the last forward inside each model-step range that declares it
    (``EngineName.model_after_forward``: SGLang's ``scheduler.run_batch`` samples after its
    ``step[...]``), on the same thread: (start_ns, end_ns, name, pid, rank) rows, named
    ``"<step range> after the forward"``."""
    codes, names = str_codes(ranges["name"])
    lut = np.array([bool((e := engine_name(str(n))) is not None and e.model_after_forward) for n in names]
                   + [False], dtype=bool)
    host = ranges["domain"].to_numpy() != GPU_DOMAIN if "domain" in ranges else np.ones(len(ranges), bool)
    outer = lut[codes] & host
    if not outer.any():
        return pd.DataFrame()
    tid = ranges["tid"].to_numpy() if "tid" in ranges else np.zeros(len(ranges), np.int64)
    pid = ranges["pid"].to_numpy()
    start, end = ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)
    ranks = ranges["rank"].to_numpy(np.int64)
    parts = []
    for key in {(int(p), int(t)) for p, t in zip(pid[outer], tid[outer])}:
        mine = (pid == key[0]) & (tid == key[1])
        f = np.flatnonzero(fwd & mine)
        f = f[np.argsort(start[f], kind="stable")]
        i = np.flatnonzero(outer & mine)
        if not len(f):
            continue
        # the last forward starting inside each model step: the model's work runs from its end on
        j = np.searchsorted(start[f], end[i], side="left") - 1
        last = f[np.maximum(j, 0)]
        ok = (j >= 0) & (start[last] >= start[i]) & (end[last] < end[i])
        i, last = i[ok], last[ok]
        parts.append(pd.DataFrame({"start_ns": end[last], "end_ns": end[i],
                                   "name": [f"{names[c]} after the forward" for c in codes[i]],
                                   "pid": key[0], "rank": ranks[i]}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def note_stand_ins(meta: TimelineMeta, stand_ins: pd.DataFrame | None = None) -> None:
    """Record in ``meta`` that its device rows are stand-ins, naming the ranges that stood in."""
    meta.traced.add(Traced.KERNELS)
    names = sorted({str(n) for n in stand_ins["name"].unique()}) if stand_ins is not None and len(stand_ins) \
        else list(FORWARD_STAGES)
    if all(n in FORWARD_STAGES for n in names):
        meta.warn(WarningCode.CPU_STAND_IN, "device rows are the worker's forward spans on the CPU "
                  "(run.eager / run.graph_replay / run.sample / comm.all_reduce), not GPU kernels")
        return
    roles = {name_role(n) for n in names}
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if NameRole.FORWARD in roles:
        meta.warn(WarningCode.CPU_STAND_IN, f"no device activity: the engine's forward scopes ({shown}) "
                  "stand in for the device on the CPU")
    else:
        meta.warn(WarningCode.CPU_STAND_IN, f"no device activity and no forward scope: the engine's "
                  f"whole model-step ranges ({shown}) stand in for the device, so batch preparation "
                  "inside them cannot be separated from the forward (vLLM: set "
                  "VLLM_CUSTOM_SCOPES_FOR_PROFILING=1)")


def no_device_message(ranges: pd.DataFrame | None, api: bool = True) -> str:
    """Why a trace without device activity cannot be diagnosed: in general; with no CUDA calls
    either (``api`` False), that the profiled process ran no model; or — when it holds a real engine's
    ranges but none that marks the model's work — which ranges that engine needs."""
    generic = ("trace has zero kernels and no other device activity (was CUDA/GPU tracing enabled?)" if api
               else "trace has zero kernels, no CUDA calls and no engine step or forward range: the profiled "
                    "process ran no model step (an engine whose scheduler or model runs in processes of its "
                    "own, as SGLang's and vLLM's servers do, needs those profiled: srtscope capture "
                    "--instrument sglang|vllm, or the engine's own profiler)")
    if ranges is None or len(ranges) == 0:
        return generic
    _, names = str_codes(ranges["name"])
    engines = sorted({e.engine for n in names if (e := engine_name(str(n))) is not None})
    if not engines:
        own = sorted({str(n).split(" ", 1)[0] for n in names} & {s.value for s in Stage})
        if not own:
            return generic
        # NOTE: an engine's front end or scheduler process (vLLM's API server, its engine core) writes
        # its stages but runs no forward: alone it cannot be diagnosed, only with the model's process
        return (f"trace has zero kernels and no forward span ({' / '.join(FORWARD_STAGES[:3])}) to stand in "
                f"for them, only srtscope stages {', '.join(own[:4])}{' ...' if len(own) > 4 else ''}: the "
                "process that wrote it ran no model step (an engine's front end or scheduler process); diagnose "
                "it with the process that ran the model (a --backend probe capture of several processes "
                "merges them into NAME.json.gz)")
    return (f"trace has zero kernels and holds {' and '.join(engines)} ranges, but none that marks the "
            "model's work to stand in for the device (vLLM: gpu_model_runner: forward or execute_*, "
            "with VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 and the worker profiled; SGLang: "
            "step[...], scheduler.run_batch or cuda_graph_runner.replay)")
