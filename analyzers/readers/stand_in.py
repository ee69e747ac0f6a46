"""CPU stand-ins for device activity.

On a CPU run of an engine of ours there is no device: the worker's forward spans (``run.eager``,
``run.graph_replay``, ``comm.all_reduce``) are the closest thing to device activity, so readers add
them as device rows of kind ``cpu_forward`` (warning ``cpu_stand_in``). Probe traces always do;
Kineto traces do when they hold no device activity but carry these stage annotations.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.timeline import GPU_DOMAIN, DeviceKind, TimelineMeta, Traced, WarningCode
from srtscope.probes.stages import Stage

FORWARD_STAGES = (Stage.RUN_EAGER.value, Stage.RUN_GRAPH_REPLAY.value, Stage.COMM_ALL_REDUCE.value)


def forward_stand_ins(ranges: pd.DataFrame | None, device: int) -> pd.DataFrame:
    """Device rows (kind ``cpu_forward``, on ``device``, stream 0) for the host ranges named after
    a forward stage; empty when there are none."""
    if ranges is None or len(ranges) == 0:
        return pd.DataFrame()
    names = ranges["name"].to_numpy()
    fwd = np.isin(np.asarray(names, dtype=object), FORWARD_STAGES)
    if "domain" in ranges:
        fwd &= ranges["domain"].to_numpy() != GPU_DOMAIN
    r = ranges[fwd]
    return pd.DataFrame({"start_ns": r["start_ns"].to_numpy(), "end_ns": r["end_ns"].to_numpy(),
                         "kind": DeviceKind.CPU_FORWARD.value,
                         "name": pd.Categorical(np.asarray(r["name"], dtype=object)),
                         "device": device, "stream": 0, "pid": r["pid"].to_numpy(),
                         "rank": r["rank"].to_numpy()})


def note_stand_ins(meta: TimelineMeta) -> None:
    """Record in ``meta`` that its device rows are stand-ins."""
    meta.traced.add(Traced.KERNELS)
    meta.warn(WarningCode.CPU_STAND_IN, "device rows are the worker's forward spans on the CPU "
              "(run.eager / run.graph_replay / comm.all_reduce), not GPU kernels")
