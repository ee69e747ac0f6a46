"""Batches of Kineto events (``kineto_stream``) -> the reader's columns, with numpy: no Python object
kept per event, and no Python bytecode run per event where a C loop does (``map`` over a dict's
lookup, ``Counter``, ``zip``); per event in Python only thread names.

    rows = KinetoRows(...); rows.add(batch) ...; rows.finish()   # rows.table("dev" | "api" | "rng")

The mapping is ``kineto.py``'s, to the value: the same rows in the same order, the same integers
(``_int``), names (``name_text``), domains, categories counted and flows linked. A time the bulk
does not convert (``kineto_times``) is decoded alone as the streaming parser would; what that
cannot take raises ``Fallback`` (the exact reader then says what is wrong).
NOTE: JSON ``true`` and ``1`` (and ``1.0``) hash alike: pids, tids, ids and names are mapped per
distinct value, so where both occur in one column one mapping serves both (the exact reader maps
a boolean to -1); no profiler writes a boolean there.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

import numpy as np
from msgspec import UNSET

from srtscope.analyzers.model.timeline import GPU_DOMAIN, OP_DOMAIN, PYTHON_DOMAIN, DeviceKind, narrow_ids
from srtscope.analyzers.model.units import name_text
from srtscope.analyzers.readers.jsonstream import _parse_float, us_to_ns
from srtscope.analyzers.readers.kineto_stream import Args, Event, Fallback
from srtscope.analyzers.readers.kineto_times import literals_ns

try:
    from srtscope.analyzers.readers import _kineto_fields as _FC
except ImportError:         # not built (optional in setup.py): a pass a member
    _FC = None  # type: ignore[assignment]

#: range domains by code (a range table's ``domain`` holds these codes)
DOMAINS = ["", GPU_DOMAIN, OP_DOMAIN, PYTHON_DOMAIN]
#: device kinds by code (a device table's ``kind`` holds these codes)
KINDS = [k.value for k in DeviceKind]
_D_NONE, _D_GPU, _D_OP, _D_PY = range(4)
#: what an ``X`` event's category makes of it
_OTHER, _DEV, _API, _RANGE, _OP, _PY = range(6)
_I64 = np.iinfo(np.int64)
_X = frozenset({"X"})
_NO_ARGS = Args()
COLUMNS = {"dev": ("start_ns", "dur_ns", "kind", "name", "device", "stream", "correlation", "bytes"),
           "api": ("start_ns", "dur_ns", "pid", "tid", "name", "correlation"),
           "rng": ("start_ns", "dur_ns", "pid", "tid", "name", "domain")}


def _int(v: Any, default: int = -1) -> int:
    """Ints, numeric strings and ``"stream 7"``-style strings -> int (bools, None, others: ``default``)."""
    if isinstance(v, bool) or v is None:
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, str):
        digits = v.rsplit(" ", 1)[-1]
        return int(digits) if digits.lstrip("-").isdigit() else default
    return default


def _get(member: str, items: list) -> list:
    """``[x.member for x in items]`` in a C loop (``attrgetter`` mapped: ~2x faster)."""
    return list(map(_GETTERS.get(member) or _GETTERS.setdefault(member, attrgetter(member)), items))


_GETTERS: dict[str, Any] = {}


def objects(values: list) -> np.ndarray:
    """``values`` as a 1-D object array (lists among them stay elements)."""
    return np.fromiter(values, dtype=object, count=len(values))


def _ints(values: list, seen: dict) -> np.ndarray:
    """``_int`` of each value (absent: -1), once per distinct value (``seen`` keeps them)."""
    n = len(values)
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, np.int64)
        except OverflowError:
            pass
    for v in set(values) - seen.keys():
        seen[v] = _int(None if v is UNSET else v)
    out = np.fromiter(map(seen.__getitem__, values), np.int64, n)
    if len(seen) > 1 << 16:
        seen.clear()
    return out


def _absent(values: list) -> np.ndarray:
    """Which values are absent (``UNSET``)."""
    return np.fromiter(map(is_, values, repeat(UNSET)), bool, len(values))


def _or_raw(values: list, fallback: list) -> list:
    """``values``, each absent one replaced by ``fallback``'s (``args.get("device", ev.get("pid"))``)."""
    if not _absent(values).any():
        return values
    return [f if v is UNSET else v for v, f in zip(values, fallback)]


def _raws(values: list) -> list:
    """Members as ``dict.get`` gives them: None where absent."""
    return [None if v is UNSET else v for v in values] if _absent(values).any() else values


class _Names:
    """Distinct names of one table: raw value -> code of its text (``name_text``); texts unique."""

    def __init__(self) -> None:
        self.raw: dict[Any, int] = {}
        self.code: dict[str, int] = {}

    def codes(self, raw: list) -> np.ndarray:
        for v in set(raw) - self.raw.keys():
            t = "" if v is UNSET else name_text(v)
            self.raw[v] = self.code.setdefault(t, len(self.code))
        return np.fromiter(map(self.raw.__getitem__, raw), np.int32, len(raw))     # codes: 4 bytes a row

    @property
    def texts(self) -> list[str]:
        return list(self.code)


def _exact_ns(raw: Any) -> int:
    """One raw literal's ns as the streaming parser and ``us_to_ns`` give it; ``Fallback`` when they
    would raise or the ns pass int64."""
    try:
        ns = us_to_ns(json.loads(bytes(raw), parse_float=_parse_float))
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise Fallback("a time value that is not a number") from None
    if not _I64.min <= ns <= _I64.max:
        raise Fallback("a time value out of range")
    return ns


def _ns(raws: list, absent: int | None) -> np.ndarray:
    """int64 ns of raw literals; an absent one: ``absent`` (None: ``Fallback``, as a ``KeyError``)."""
    try:
        ns, ok = literals_ns(raws)
    except TypeError:                           # some absent
        ns, ok = literals_ns([b"" if r is UNSET else r for r in raws])
    for j in np.flatnonzero(~ok).tolist():
        raw = raws[j]
        if raw is UNSET:
            if absent is None:
                raise Fallback("an event without ts")
            ns[j] = absent
        else:
            ns[j] = _exact_ns(raw)
    return ns


class _Fields:
    """The members of a batch's events (``_fields``): ``x`` where ``ph`` is ``"X"``; ``ts`` /
    ``dur`` ns with their state (0: absent, 1: converted, 2: to decode alone); the others as lists."""

    __slots__ = ("x", "ts", "ts_state", "dur", "dur_state", "cats", "names", "pids", "tids")

    def __init__(self, n: int) -> None:
        self.x = np.empty(n, np.uint8)
        self.ts, self.dur = np.empty(n, np.int64), np.empty(n, np.int64)
        self.ts_state, self.dur_state = np.empty(n, np.uint8), np.empty(n, np.uint8)
        self.cats: list = []
        self.names: list = []
        self.pids: list = []
        self.tids: list = []


def _fields(evs: list[Event]) -> _Fields:
    """Every event's members: in one C pass over the structs (``_kineto_fields.c``) where it was
    built, else a pass a member."""
    f = _Fields(len(evs))
    if _FC is not None:
        f.cats, f.names, f.pids, f.tids = _FC.fields(evs, UNSET, f.x, f.ts, f.ts_state, f.dur, f.dur_state)
    else:
        f.x[:] = np.fromiter(map(_X.__contains__, _get("ph", evs)), bool, len(evs))
        for raws, ns, st in ((_get("ts", evs), f.ts, f.ts_state), (_get("dur", evs), f.dur, f.dur_state)):
            got, ok = literals_ns([b"" if r is UNSET else r for r in raws])
            ns[:] = got
            st[:] = np.where(ok, 1, np.where(_absent(raws), 0, 2))
        f.cats, f.names, f.pids, f.tids = (_get(m, evs) for m in ("cat", "name", "pid", "tid"))
    f.x = f.x.view(bool)
    return f


def _picker(at: list[int]) -> Callable[[list], list]:
    return lambda lst: list(map(lst.__getitem__, at))


def _exact(ns: np.ndarray, state: np.ndarray, rows: np.ndarray | None, pick: Callable[[list], list],
           xs: list[Event], take: np.ndarray, member: str) -> np.ndarray:
    """The ns of ``rows`` (None: all), those the bulk did not convert decoded alone: an absent
    ``ts`` is ``Fallback`` (the exact reader's ``KeyError``), an absent ``dur`` 0."""
    out = ns.copy() if rows is None else ns[rows]
    st = state if rows is None else state[rows]
    for j in np.flatnonzero(st != 1).tolist():
        raw = getattr(xs[int(take[j])], member)
        if raw is UNSET:
            if member == "ts":
                raise Fallback("an event without ts")
            out[j] = 0
        else:
            out[j] = _exact_ns(raw)
    return out


class KinetoRows:
    """The columns of a Kineto trace's device, API and range rows, added a batch at a time."""

    def __init__(self, device_cats: dict[str, DeviceKind], api_cats: set[str], range_cats: dict[str, str],
                 op_cats: set[str], flow_cats: set[str], is_stage: Callable[[str], bool], max_non_events: int) -> None:
        self.device_cats, self.api_cats, self.range_cats = device_cats, api_cats, range_cats
        self.op_cats, self.flow_cats, self.is_stage = op_cats, flow_cats, is_stage
        self.max_non_events = max_non_events
        self.cats: Counter = Counter()
        self.thread_names: dict[str, str] = {}
        self.n_events = self.non_events = 0
        self.flows: dict[tuple, int] = {}
        #: False: flows are not kept (a reader that refuses rows without ``args.correlation`` needs none:
        #: a million flows of a long capture are ~200 MiB of dict)
        self.keep_flows = True
        self.unlinked: list[tuple[str, int, tuple]] = []      # (table, row, flow key)
        self.stop_ns: int | None = None         # the profiler's Record Window End (no base time), ns
        self.parts: dict[str, dict[str, list[np.ndarray]]] = {t: {c: [] for c in cols} for t, cols in COLUMNS.items()}
        self.rows = dict.fromkeys(COLUMNS, 0)
        self.names = {t: _Names() for t in COLUMNS}
        self._class: dict[Any, int] = {}
        self._stage: list[bool] = []
        self._ints: dict[str, dict] = {k: {} for k in ("pid", "tid", "device", "stream", "corr", "bytes", "id")}
        self._api_pids: dict[int, int] = {}      # pid -> API rows, in order of first appearance

    def _cat_class(self, cat: Any) -> int:
        return (_DEV if cat in self.device_cats else _API if cat in self.api_cats
                else _RANGE if cat in self.range_cats else _OP if cat in self.op_cats
                else _PY if cat == "python_function" else _OTHER)

    def add(self, evs: list[Event]) -> None:
        """One batch of events, in file order."""
        n = len(evs)
        self.n_events += n
        f = _fields(evs)
        if f.x.all():
            xi: list[int] | None = None
            xs, cats = evs, f.cats
        else:
            self._others(list(map(evs.__getitem__, np.flatnonzero(~f.x).tolist())))
            xi = np.flatnonzero(f.x).tolist()
            xs, cats = list(map(evs.__getitem__, xi)), list(map(f.cats.__getitem__, xi))
        if not xs:
            return
        counts = Counter(cats)
        for c, k in counts.items():
            self.cats["" if c is UNSET else c] += k
        for c in counts.keys() - self._class.keys():
            self._class[c] = self._cat_class("" if c is UNSET else c)
        cls = np.fromiter(map(self._class.__getitem__, cats), np.int8, len(cats))
        for kind, table in ((_DEV, "dev"), (_API, "api")):
            take = np.flatnonzero(cls == kind)
            if len(take):
                at = take.tolist()
                self._device_or_api(table, list(map(xs.__getitem__, at)), list(map(cats.__getitem__, at)))
        take = np.flatnonzero(cls >= _RANGE)
        if len(take):
            rows = take if xi is None else np.asarray(xi, np.int64)[take]
            self._ranges(f, None if len(rows) == n else rows, cls[take], xs, take)

    def _others(self, evs: list[Event]) -> None:
        """Events that are not ``X``: no event at all (no ``ph``), flows, thread names, the
        profiler's stop (``Record Window End``)."""
        absent = int(_absent(_get("ph", evs)).sum())
        self.non_events += absent
        if self.non_events > self.max_non_events:
            raise Fallback("too many elements that are no event")
        fl = [e for e in evs if (e.ph == "s" or e.ph == "f") and e.id is not UNSET and e.cat in self.flow_cats] \
            if self.keep_flows else []
        if fl:
            ts = _ns(_get("ts", fl), None)
            keys = zip(_get("ph", fl), _raws(_get("pid", fl)), _raws(_get("tid", fl)), ts.tolist())
            self.flows.update(zip(keys, _ints(_get("id", fl), self._ints["id"]).tolist()))
        for e in evs:
            if e.ph == "M" and e.name == "thread_name":
                nm = e.args.name if isinstance(e.args, Args) else UNSET
                if nm is not UNSET and nm:
                    self.thread_names[f"{_raw(e.pid)}:{_raw(e.tid)}"] = str(nm)
            elif e.ph == "i" and e.name == "Record Window End" and e.ts is not UNSET:
                self.stop_ns = int(_ns([e.ts], None)[0])

    def _device_or_api(self, table: str, evs: list[Event], cats: list) -> None:
        m = len(evs)
        row0 = self.rows[table]
        start = _ns(_get("ts", evs), None)
        dur = _ns(_get("dur", evs), 0)
        args = [a if a.__class__ is Args else _NO_ARGS for a in _get("args", evs)]
        corr_raw = _get("correlation", args)
        unlinked = _absent(corr_raw)
        pids, tids = _get("pid", evs), _get("tid", evs)
        if unlinked.any():
            ph = "f" if table == "dev" else "s"
            for j in np.flatnonzero(unlinked).tolist():
                self.unlinked.append((table, row0 + j, (ph, _raw(pids[j]), _raw(tids[j]), int(start[j]))))
        cols = self.parts[table]
        cols["start_ns"].append(start)
        cols["dur_ns"].append(dur)
        cols["name"].append(self.names[table].codes(_get("name", evs)))
        cols["correlation"].append(_ints(corr_raw, self._ints["corr"]))
        if table == "dev":
            kinds = {c: KINDS.index(self.device_cats[c].value) for c in set(cats)}
            cols["kind"].append(np.fromiter(map(kinds.__getitem__, cats), np.int64, m))
            cols["device"].append(_ints(_or_raw(_get("device", args), pids), self._ints["device"]))
            cols["stream"].append(_ints(_or_raw(_get("stream", args), tids), self._ints["stream"]))
            cols["bytes"].append(_ints(_get("bytes", args), self._ints["bytes"]))
        else:
            pid = _ints(pids, self._ints["pid"])
            uniq, first, counts = np.unique(pid, return_index=True, return_counts=True)
            for i in np.argsort(first, kind="stable").tolist():
                p = int(uniq[i])
                self._api_pids[p] = self._api_pids.get(p, 0) + int(counts[i])
            cols["pid"].append(pid)
            cols["tid"].append(_ints(tids, self._ints["tid"]))
        self.rows[table] += m

    def _ranges(self, f: _Fields, rows: np.ndarray | None, cls: np.ndarray, xs: list[Event], take: np.ndarray) -> None:
        """The range rows: ``rows`` of the batch (None: all of it), ``cls`` their classes, ``xs[take]``
        their events."""
        cols = self.parts["rng"]
        pick = (lambda lst: lst) if rows is None else _picker(rows.tolist())
        cols["start_ns"].append(_exact(f.ts, f.ts_state, rows, pick, xs, take, "ts"))
        cols["dur_ns"].append(_exact(f.dur, f.dur_state, rows, pick, xs, take, "dur"))
        # NOTE: ids narrowed as they come (``narrow_ids``): millions of frames held until the end
        ids = narrow_ids({"pid": _ints(pick(f.pids), self._ints["pid"]), "tid": _ints(pick(f.tids), self._ints["tid"])})
        cols["pid"].append(ids["pid"])
        cols["tid"].append(ids["tid"])
        names = self.names["rng"]
        codes = names.codes(pick(f.names))
        cols["name"].append(codes)
        # the domain by category; an operator's by its name (a stage alias: the default domain)
        dom = np.full(len(cls), _D_PY, np.int8)
        dom[cls == _OP] = _D_OP
        rng = np.flatnonzero(cls == _RANGE)
        if len(rng):
            by = {c: DOMAINS.index(self.range_cats[c]) for c in self.range_cats}
            dom[rng] = np.fromiter((by[xs[j].cat] for j in take[rng].tolist()), np.int8, len(rng))
        ops = np.flatnonzero(cls == _OP)
        if len(ops):
            texts = names.texts
            self._stage += [self.is_stage(t) for t in texts[len(self._stage):]]
            stage = np.asarray(self._stage, bool)
            dom[ops] = np.where(stage[codes[ops]], _D_NONE, _D_OP)
        cols["domain"].append(dom)
        self.rows["rng"] += len(cls)

    def host(self) -> tuple[int, int]:
        """(the most common pid of the API rows, the earliest first where counts tie; distinct
        pids): ``kineto_build.host_pid`` of all API rows, whatever was taken of them."""
        if not self._api_pids:
            return -1, 0
        most = max(self._api_pids.values())
        return next(p for p, c in self._api_pids.items() if c == most), len(self._api_pids)

    def held(self, table: str) -> int:
        """Rows of ``table`` gathered and not yet taken (``table``)."""
        return sum(len(a) for a in self.parts[table]["start_ns"])

    def finish(self) -> None:
        """Flows linked to the rows without ``args.correlation``."""
        if not self.unlinked:
            return
        for t in ("dev", "api"):
            parts = self.parts[t]["correlation"]
            parts[:] = [np.concatenate(parts)] if parts else []
        for table, row, key in self.unlinked:
            self.parts[table]["correlation"][0][row] = self.flows.get(key, -1)
        self.unlinked = []

    def table(self, name: str) -> dict[str, Any]:
        """One table's columns whole (``name``: codes into ``names``; ``kind`` / ``domain``: codes
        into ``KINDS`` / ``DOMAINS``), its parts let go."""
        out: dict[str, Any] = {}
        for k, v in self.parts[name].items():
            out[k] = np.concatenate(v) if v else np.zeros(0, np.int64)
            v.clear()
        out["names"] = self.names[name].texts
        return out


def _raw(v: Any) -> Any:
    """A member as ``dict.get`` gives it: None when absent."""
    return None if v is UNSET else v
