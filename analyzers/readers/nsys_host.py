"""The host side of an nsys export: CUDA runtime and driver calls (``CUPTI_ACTIVITY_KIND_RUNTIME``),
OS runtime calls (``OSRT_API``) as API columns, NVTX ranges with their domains and nesting
depths (``NVTX_EVENTS``), and the thread names.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable

import numpy as np
import pandas as pd

from srtscope.analyzers.model.names import api_kind, os_kind, strip_api_suffix
from srtscope.analyzers.model.timeline import ApiKind
from srtscope.analyzers.readers.columnar import arrow_query, fetch_ints, nesting_depth
from srtscope.analyzers.readers.labels import split_coded_labels
from srtscope.analyzers.readers.nsys_strings import NsysStrings, capped
from srtscope.analyzers.readers.nsys_tables import _MASK24, _pid_of

NVTX_PUSH_RANGE, NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 35, 59, 60, 75


class HostTables(NsysStrings):
    """The host tables as API columns (``Timeline.api``) and NVTX ranges, and the thread names."""

    def graph_launch_rows(self, counts: dict[int, int]) -> int:
        """Rows of CUDA graph launches among API rows counted by name id (``counts``)."""
        lut = self.strings(np.asarray(list(counts), np.int64)) if counts else {}
        return sum(c for i, c in counts.items() if api_kind(strip_api_suffix(lut.get(i, ""))) is ApiKind.GRAPH_LAUNCH)

    def api(self) -> dict | None:
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        if not self.has(t):
            return None
        # 0 = CUDA runtime, 1 = CUDA driver; 2022.2 adds a duplicate row per call with class 67.
        where = "eventClass IN (0, 1)" if "eventClass" in self.columns(t) else ""
        s, e, gtid, corr, name = self.fetch(
            t, ["start", "end", "COALESCE(globalTid,0)", "COALESCE(correlationId,-1)", "nameId"], where,
            track={"pid": _pid_of(2), "name": lambda c: c[4]})
        names = self.categorical(name, strip_api_suffix, table=t)
        del name
        kinds = _kinds(names, api_kind)
        return {"start_ns": s, "end_ns": e, "pid": (gtid >> 24) & _MASK24, "tid": gtid & _MASK24,
                "name": names, "kind": kinds, "correlation": corr}

    def osrt(self) -> dict | None:
        """OS runtime calls (``OSRT_API``) as API rows of kind os_io / os_wait / os_other."""
        t = "OSRT_API"
        if not self.has(t) or not self.count(t):
            return None
        s, e, gtid, name = self.fetch(t, ["start", "end", "COALESCE(globalTid,0)", "nameId"],
                                      track={"pid": _pid_of(2), "name": lambda c: c[3]})
        names = self.categorical(name, table=t)
        kinds = _kinds(names, lambda c: os_kind(str(c)))
        return {"start_ns": s, "end_ns": e, "pid": (gtid >> 24) & _MASK24, "tid": gtid & _MASK24,
                "name": names, "kind": kinds, "correlation": np.full(len(s), -1, np.int64)}

    def nvtx(self) -> tuple[dict | None, int]:
        """(ranges, number of marks). Marks (end NULL) are excluded from ranges."""
        t = "NVTX_EVENTS"
        if not self.has(t):
            return None, 0
        cols = self.columns(t)
        types = f"({NVTX_PUSH_RANGE}, {NVTX_PUSH_POP}, {NVTX_START_END})"
        where = f"WHERE n.eventType IN {types} AND n.end IS NOT NULL"
        dom_sql = "COALESCE(domainId,0)" if "domainId" in cols else "0"
        # NOTE: read whole in a windowed read too (it is small, and the nesting depths and the
        # steps are those of the whole table); cut to the window after
        s, e, etype, gtid, dom = fetch_ints(
            self.arrow, t, ["start", "end", "eventType", "COALESCE(globalTid,0)", dom_sql],
            where.replace("WHERE ", "").replace("n.", ""), max_rows=self.max_rows)
        has_tid = "textId" in cols
        label = capped("COALESCE(n.text, s.value, '')" if has_tid else "COALESCE(n.text, '')")
        label_sql = (f"{label} FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId" if has_tid
                     else f"{label} FROM NVTX_EVENTS n")
        codes, uniq = self._labels(f"SELECT {label_sql} {where} ORDER BY n.rowid", len(s))
        marks = self.count(t, "WHERE end IS NULL AND eventType = 34")
        pid, tid = (gtid >> 24) & _MASK24, gtid & _MASK24
        names, attrs = split_coded_labels(codes, uniq)
        del codes
        domains = self._domain_names(dom, pid)
        depth = nesting_depth(s, e, gtid, np.isin(etype, (NVTX_PUSH_RANGE, NVTX_PUSH_POP)))
        return {"start_ns": s, "end_ns": e, "pid": pid, "tid": tid, "name": names,
                "domain": domains, "attrs": attrs, "depth": depth}, marks

    def _labels(self, sql: str, n: int) -> tuple[np.ndarray, list[str]]:
        """The one text column of ``sql`` as (codes, distinct strings), dictionary-encoded in Arrow:
        no Python string per row. ``n``: the rows expected (else the table changed under us)."""
        codes: list[np.ndarray] = []
        uniq: list[str] = []
        index: dict[str, int] = {}
        for batch in arrow_query(self.arrow, sql, "NVTX_EVENTS"):
            col = batch.column(0)
            if col.null_count or str(col.type) not in ("string", "large_string"):
                raise sqlite3.DatabaseError(f"malformed values in NVTX_EVENTS: {col.type} labels")
            enc = col.dictionary_encode()
            remap = np.fromiter((index.setdefault(v, len(index)) for v in enc.dictionary.to_pylist()),
                                np.int64, len(enc.dictionary))
            codes.append(remap[enc.indices.to_numpy(zero_copy_only=False)])
        uniq = list(index)
        out = np.concatenate(codes) if codes else np.zeros(0, np.int64)
        if len(out) != n:
            raise sqlite3.DatabaseError("NVTX label count mismatch")
        return out, uniq

    def _domain_names(self, dom: np.ndarray, pid: np.ndarray) -> pd.Categorical:
        """domainId -> name from domain-create rows (per process, then any process)."""
        by_pid: dict[tuple[int, int], str] = {}
        by_id: dict[int, str] = {}
        if "textId" in self.columns("NVTX_EVENTS"):
            q = (f"SELECT COALESCE(n.globalTid,0), n.domainId, {capped('COALESCE(n.text, s.value)')} FROM "
                 "NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = ?")
        else:
            q = "SELECT COALESCE(globalTid,0), domainId, text FROM NVTX_EVENTS WHERE eventType = ?"
        for g, d, name in self.con.execute(q, (NVTX_DOMAIN_CREATE,)):
            if d is None or name is None:
                continue
            by_pid[((int(g) >> 24) & _MASK24, int(d))] = str(name)
            by_id.setdefault(int(d), str(name))
        # NOTE: (pid, domain) pairs hashed, not sorted: a row-wise np.unique of 2 M ranges took ~1 s
        pc, pu = pd.factorize(pid)
        dc, du = pd.factorize(dom)
        m = max(len(du), 1)
        inv, pairs = pd.factorize(pc.astype(np.int64) * m + dc)
        vals = []
        for k in pairs.tolist():
            p, d = int(pu[k // m]), int(du[k % m])
            vals.append("" if d == 0 else by_pid.get((p, d), by_id.get(d, f"domain{d}")))
        cats, codes = np.unique(np.asarray(vals, dtype=object), return_inverse=True)
        return pd.Categorical.from_codes(codes.reshape(-1)[inv] if len(dom) else
                                         np.zeros(0, np.int64), categories=cats.tolist())

    def thread_names(self, pids: set[int]) -> dict[str, str]:
        if not self.has("ThreadNames"):
            return {}
        rows = self.con.execute(f"SELECT t.globalTid, {capped('s.value')} FROM ThreadNames t "
                                "JOIN StringIds s ON s.id = t.nameId").fetchall()
        return {f"{(int(g) >> 24) & _MASK24}:{int(g) & _MASK24}": str(v)
                for g, v in rows if g is not None and ((int(g) >> 24) & _MASK24) in pids}


def _kinds(names: pd.Categorical, kind_of: Callable[[str], ApiKind]) -> pd.Categorical:
    """ApiKind per row of the categorical ``names``, mapped once per distinct name (codes to codes:
    no string per row)."""
    order = [k.value for k in ApiKind]
    lut = np.asarray([order.index(kind_of(c).value) for c in names.categories], dtype=np.int8)
    codes = lut[names.codes] if len(lut) else np.zeros(len(names), np.int8)
    return pd.Categorical.from_codes(codes, categories=order)  # type: ignore[call-overload]
