"""A Kineto trace read once into time-ordered pieces on disk: the reading half of a diagnosis of a
Kineto trace in bounded memory, as ``nsys_spill`` is an nsys export's.

``read_kineto_spilled`` streams the trace with the batched reader (``kineto_stream`` +
``kineto_columns``), adding its device and API rows to two ``TimeSpool``s every ``FLUSH_ROWS`` rows;
the ranges (annotations, operators, Python frames: int64 columns and name codes, ~40 bytes a row
before the DataFrame) and the metadata come back whole and equal to ``read_kineto``'s. The
``KinetoSpilled`` it gives is a ``SpilledTrace``: ``iter_device`` / ``iter_api`` give the two
tables back in ascending start, whose concatenation is ``read_kineto(path).device`` / ``.api``
exactly (the base time, the host pid and the rank, known only at the end of the file, are added
as the chunks are read back). ``pipeline/stream.diagnose_streamed`` takes it as it takes an nsys
export's spill: one pipeline.

Not windowed (``NotWindowable``, the caller reads the file whole): a file the batched reader does
not take (``Fallback``), rows linked to their launch by flows only (no ``args.correlation``: the
flow may come after the row is on disk), no device rows (a CPU capture's stand-ins).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import ID_COLUMNS, WarningCode, validate_table
from srtscope.analyzers.pipeline.first_pass import NotWindowable
from srtscope.analyzers.readers.kineto import cut_at_stop, new_rows
from srtscope.analyzers.readers.kineto_build import Facts, Frames, kineto_meta
from srtscope.analyzers.readers.kineto_stream import Fallback, event_batches
from srtscope.analyzers.readers.profiler_stop import stop_message
from srtscope.analyzers.spill.nsys_spill import DEFAULT_CHUNK_ROWS, SpilledTrace, _remove_quietly
from srtscope.analyzers.spill.time_spool import TimeSpool

#: device or API rows gathered before they go to the spool (a DataFrame of them in memory)
FLUSH_ROWS = 1 << 18


class KinetoSpilled(SpilledTrace):
    """A Kineto trace read by ``read_kineto_spilled`` (``SpilledTrace``'s interface). The spools
    hold times before the base time and no pid or rank columns: ``frames`` adds them."""

    def __init__(self, frames: Frames, facts: Facts, device: TimeSpool, api: TimeSpool, **kw) -> None:
        super().__init__(device=device, api=api, rank_pids=[], rank=frames.rank, **kw)
        self.frames, self.facts = frames, facts

    def _finish_columns(self, table: str, chunk: dict[str, np.ndarray], cols: dict, wide: bool) -> None:
        """What a chunk's columns lack, in place: times past the trace's base time, the host pid of
        the device rows, the rank."""
        fr = self.frames
        n = len(chunk["start_ns"])
        cols["start_ns"] = chunk["start_ns"] + np.int64(fr.base_ns)
        cols["end_ns"] = chunk["end_ns"] + np.int64(fr.base_ns)
        if table == "device":
            cols["pid"] = np.full(n, fr.host_pid, np.int64)
        cols["rank"] = np.full(n, fr.rank, np.int64 if wide else np.int32)


def _flush(rows, table: str, spool: TimeSpool, fr0: Frames, facts: Facts) -> None:
    """The rows gathered of ``table`` into ``spool`` (times before the base time)."""
    c = rows.table(table)
    if not len(c["start_ns"]):
        return
    if table == "dev":
        df = fr0.device(c).drop(columns=["pid", "rank"])
        facts.add_device(df)
    else:
        df = fr0.api(c).drop(columns=["rank"])
        facts.add_api(df)
    spool.add({k: (df[k].array if isinstance(df[k].dtype, pd.CategoricalDtype) else df[k].to_numpy())
               for k in df.columns})


def read_kineto_spilled(path: str | Path, rank: int = 0, *, folder: str | Path,
                        chunk_rows: int = DEFAULT_CHUNK_ROWS, flush_rows: int = FLUSH_ROWS) -> KinetoSpilled:
    """Read one Kineto trace as ``read_kineto`` does, its device and API rows spilled to ``folder``
    (made if missing) in buckets of at most ``chunk_rows`` rows, every ``flush_rows`` rows.
    ``NotWindowable`` for what the module doc lists; the read's own errors as ``read_kineto``'s; on
    any error the files written so far are removed."""
    path, folder = Path(path), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    device = TimeSpool(folder, "device", chunk_rows, narrow=ID_COLUMNS)
    api = TimeSpool(folder, "api", chunk_rows, narrow=ID_COLUMNS)
    device.start_part()
    api.start_part()
    fr0 = Frames(0, 0, 1, -1, 0)            # base, rank and host pid come at read-back
    facts = Facts()
    header: dict = {}
    rows = new_rows()
    rows.keep_flows = False                 # a row linked by a flow only is NotWindowable: none is needed
    try:
        try:
            for batch in event_batches(path, header.__setitem__):
                rows.add(batch)
                if rows.unlinked:
                    raise NotWindowable("rows linked to their launch by flows only (no args.correlation)")
                for table, spool in (("dev", device), ("api", api)):
                    if rows.held(table) >= flush_rows:
                        _flush(rows, table, spool, fr0, facts)
        except (Fallback, TypeError) as exc:
            raise NotWindowable(f"not read in batches ({exc})") from None
        # NOTE: the API rows first: the device's graph kernels are counted against their launches
        _flush(rows, "api", api, fr0, facts)
        _flush(rows, "dev", device, fr0, facts)
        if not device.rows:
            raise NotWindowable("no device rows (a CPU capture's stand-ins are made from the whole ranges)")
        for table, spool in (("device", device), ("api", api)):
            if spool.bad_rows:
                from srtscope.analyzers.model.timeline import TimelineError
                raise TimelineError(f"{table} table has {spool.bad_rows} row(s) with end_ns < start_ns")
        if facts.graph_corr:                # kernels spilled before their graph launch was read: all again
            kernel, graph = _kernel_label(device), np.asarray(sorted(facts.graph_corr), np.int64)
            facts.graph_kernels = sum(int((np.isin(ch["correlation"], graph) & (ch["kind"] == kernel)).sum())
                                      for ch in device.chunks())
        fr = Frames.of(header, rank, rows.host())
        rng = rows.table("rng")
        ranges, cut = cut_at_stop(fr.ranges(rng) if len(rng["start_ns"]) else None, rows.stop_ns, fr.base_ns)
        facts.spans = {k: (a + fr.base_ns, b + fr.base_ns) for k, (a, b) in facts.spans.items()}
        meta = kineto_meta(path, header, fr, facts, ranges, rows.cats, rows.thread_names, rows.n_events)
        if cut:
            meta.warn(WarningCode.PROFILER_STOP, stop_message(cut))
    except BaseException:
        _remove_quietly(device, api)
        raise
    ranges = validate_table(ranges, "ranges", copy=False)      # this read's arrays alone: no copy
    return KinetoSpilled(fr, facts, device, api, meta=meta, ranges=ranges, counters=validate_table(None, "counters"),
                         one_device=len(facts.devices) <= 1, graph_launches=facts.graph_launches > 0,
                         spans=tuple(facts.spans.values()))


def _kernel_label(spool: TimeSpool) -> int:
    """The spool's label id of the ``kernel`` kind (-1 when none)."""
    from srtscope.analyzers.model.timeline import DeviceKind
    return spool._labels.get("kind", {}).get(DeviceKind.KERNEL.value, -1)
