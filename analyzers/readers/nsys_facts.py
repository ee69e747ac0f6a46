"""What an nsys export's metadata needs of its device and API tables, gathered from the whole
tables at once (``read_nsys``) or chunk by chunk (``read_nsys_spilled``): the same facts either way.

Each ``add_*`` takes one table's columns (name -> array; ``kind`` a categorical) as the reader
builds them; counts add up, pid/device sets unite, start/end bounds widen.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import ApiKind, DeviceKind
from srtscope.analyzers.readers.nsys_window import Facts


def _lo(old: int | None, new: int) -> int:
    return new if old is None else min(old, new)


def _hi(old: int | None, new: int) -> int:
    return new if old is None else max(old, new)


@dataclass
class TableFacts:
    """Row counts, pid and device sets, time bounds (ns) and kind counts of the device and API tables."""

    dev_rows: int = 0
    api_rows: int = 0
    dev_pids: set[int] = field(default_factory=set)
    api_pids: set[int] = field(default_factory=set)
    devices: set[int] = field(default_factory=set)
    dev_start_ns: int | None = None     # lowest start of a device row
    dev_end_ns: int | None = None       # highest end of a device row
    api_start_ns: int | None = None
    api_end_ns: int | None = None
    dev_kinds: dict[str, int] = field(default_factory=dict)   # DeviceKind value -> rows
    graph_launches: int = 0             # API rows of kind graph_launch
    node_kernels: int = 0               # device rows traced per graph node (graph_node >= 0)

    @classmethod
    def of(cls, device: dict | None, api: dict | None) -> TableFacts:
        facts = cls()
        facts.add_device(device)
        facts.add_api(api)
        return facts

    def add_device(self, cols: dict | None) -> None:
        n = 0 if cols is None else len(cols["start_ns"])
        if not n or cols is None:
            return
        self.dev_rows += n
        self.dev_pids.update(pd.unique(cols["pid"]).tolist())
        self.devices.update(pd.unique(cols["device"]).tolist())
        self.dev_start_ns = _lo(self.dev_start_ns, int(cols["start_ns"].min()))
        self.dev_end_ns = _hi(self.dev_end_ns, int(cols["end_ns"].max()))
        kind = cols["kind"]
        counts = np.bincount(np.asarray(kind.codes, np.int64), minlength=len(kind.categories))
        for name, c in zip(kind.categories.tolist(), counts.tolist()):
            if c:
                self.dev_kinds[str(name)] = self.dev_kinds.get(str(name), 0) + int(c)
        self.node_kernels += int((cols["graph_node"] >= 0).sum())

    def add_api(self, cols: dict | None) -> None:
        n = 0 if cols is None else len(cols["start_ns"])
        if not n or cols is None:
            return
        self.api_rows += n
        self.api_pids.update(pd.unique(cols["pid"]).tolist())
        self.api_start_ns = _lo(self.api_start_ns, int(cols["start_ns"].min()))
        self.api_end_ns = _hi(self.api_end_ns, int(cols["end_ns"].max()))
        self.graph_launches += int((cols["kind"] == ApiKind.GRAPH_LAUNCH.value).sum())

    def kind_rows(self, kind: DeviceKind) -> int:
        return self.dev_kinds.get(kind.value, 0)

    def rank_pids(self) -> list[int]:
        """The pids that get ranks, in rank order: those with device rows (else those calling the API)."""
        return sorted(self.dev_pids) if self.dev_rows else sorted(self.api_pids)

    def spans(self) -> list[tuple[int, int]]:
        """(lowest start, highest end) of each non-empty table, ns."""
        out = []
        for lo, hi in ((self.dev_start_ns, self.dev_end_ns), (self.api_start_ns, self.api_end_ns)):
            if lo is not None and hi is not None:
                out.append((lo, hi))
        return out

    def as_facts(self, ranges: dict | None) -> Facts:
        """The reader's ``nsys_window.Facts`` of these tables and the NVTX ``ranges`` columns."""
        n_rng = 0 if ranges is None else len(ranges["start_ns"])
        spans = self.spans() + ([(int(ranges["start_ns"].min()), int(ranges["end_ns"].max()))]
                                if ranges is not None and n_rng else [])
        return Facts(n_dev=self.dev_rows, n_api=self.api_rows, n_rng=n_rng, dev_pids=sorted(self.dev_pids),
                     api_pids=sorted(self.api_pids), devices=set(self.devices), dev_first=self.dev_start_ns,
                     dev_last=self.dev_end_ns, kinds=dict(self.dev_kinds), graph_launches=self.graph_launches,
                     node_rows=self.node_kernels, spans=spans)
