"""Batches of Kineto events (``kineto_stream``) -> the reader's columns, with numpy: no Python object
kept per event, and per event only what the bulk cannot do (device and API rows, flows, metadata).

    rows = KinetoRows(); rows.add(batch) ...; rows.finish()   # rows.dev / rows.api / rows.rng

The mapping is ``kineto.py``'s, to the value: the same rows in the same order, the same integers
(``_int``), names (``name_text``), domains, categories counted and flows linked. A value the bulk
does not convert (``kineto_times``) is decoded alone as the streaming parser would; what that
cannot take raises ``Fallback`` (the exact reader then says what is wrong).
NOTE: a JSON ``true`` and ``1`` hash alike: pids, tids and names are mapped per distinct value, so a
boolean pid would read as 1 here (the exact reader: -1); no profiler writes one.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from msgspec import UNSET

from srtscope.analyzers.model.timeline import GPU_DOMAIN, OP_DOMAIN, PYTHON_DOMAIN, DeviceKind
from srtscope.analyzers.model.units import name_text
from srtscope.analyzers.readers.jsonstream import _parse_float, us_to_ns
from srtscope.analyzers.readers.kineto_stream import Args, Event, Fallback
from srtscope.analyzers.readers.kineto_times import literals_ns

#: range domains by code (``rng["domain"]`` holds these codes)
DOMAINS = ["", GPU_DOMAIN, OP_DOMAIN, PYTHON_DOMAIN]
_D_NONE, _D_GPU, _D_OP, _D_PY = range(4)
#: what an ``X`` event's category makes of it
_OTHER, _DEV, _API, _RANGE, _OP, _PY = range(6)
_I64 = np.iinfo(np.int64)


def _ints(values: list, conv: Callable[[Any], int]) -> np.ndarray:
    """``conv`` of each value, once per distinct value."""
    if not values:
        return np.zeros(0, np.int64)
    try:
        codes, uniq = pd.factorize(objects(values), use_na_sentinel=False)
    except TypeError:                       # an unhashable value (a list, an object)
        raise Fallback("an unhashable pid or tid") from None
    lut = np.fromiter((conv(None if u is UNSET else u) for u in uniq), np.int64, len(uniq))
    return lut[codes]


class _Names:
    """Distinct names of one table: code -> text (``name_text``); texts unique."""

    def __init__(self) -> None:
        self.code: dict[str, int] = {}
        self.texts: list[str] = []

    def codes(self, raw: list) -> tuple[np.ndarray, list[str]]:
        """Codes of ``raw`` names (``UNSET``: ""), and the distinct texts of this batch."""
        try:
            codes, uniq = pd.factorize(objects(raw), use_na_sentinel=False)
        except TypeError:
            raise Fallback("an unhashable name") from None
        texts = ["" if u is UNSET else name_text(u) for u in uniq]
        lut = np.fromiter((self.code.setdefault(t, len(self.code)) for t in texts), np.int64, len(texts))
        if len(self.texts) < len(self.code):
            self.texts.extend(list(self.code)[len(self.texts):])
        return lut[codes], texts


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
        self.unlinked: list[tuple[str, int, tuple]] = []      # (table, row, flow key)
        self.dev: dict[str, list] = {k: [] for k in ("start_ns", "dur_ns", "kind", "name", "device", "stream",
                                                     "correlation", "bytes")}
        self.api: dict[str, list] = {k: [] for k in ("start_ns", "dur_ns", "pid", "tid", "name", "correlation")}
        self.rng_parts: dict[str, list[np.ndarray]] = {k: [] for k in ("start_ns", "dur_ns", "pid", "tid",
                                                                       "name", "domain")}
        self.rng_names = _Names()
        self._class: dict[Any, int] = {}
        self._stage: dict[str, bool] = {}
        self.rng_rows = 0

    def _cat_class(self, cat: Any) -> int:
        got = self._class.get(cat)
        if got is None:
            got = (_DEV if cat in self.device_cats else _API if cat in self.api_cats
                   else _RANGE if cat in self.range_cats else _OP if cat in self.op_cats
                   else _PY if cat == "python_function" else _OTHER)
            self._class[cat] = got
        return got

    def add(self, evs: list[Event]) -> None:
        """One batch of events, in file order."""
        n = len(evs)
        self.n_events += n
        phs = objects([e.ph for e in evs])
        try:
            ph_codes, ph_uniq = pd.factorize(phs, use_na_sentinel=False)
        except TypeError:
            raise Fallback("an unhashable ph") from None
        lut_x = np.array([u == "X" for u in ph_uniq] + [False])
        lut_none = np.array([u is UNSET for u in ph_uniq] + [False])
        is_x = lut_x[ph_codes]
        missing = lut_none[ph_codes]
        self.non_events += int(missing.sum())
        if self.non_events > self.max_non_events:
            raise Fallback("too many elements that are no event")
        ts_ns, ts_ok = _times([e.ts for e in evs])
        xi = np.flatnonzero(is_x)
        others = np.flatnonzero(~is_x & ~missing)
        for i in others.tolist():               # flows and metadata (a few % of a trace)
            self._other(evs[i], ts_ns[i] if ts_ok[i] else None)
        if not len(xi):
            return
        xs = [evs[i] for i in xi.tolist()] if len(xi) < n else evs
        cats = [e.cat for e in xs]
        try:
            c_codes, c_uniq = pd.factorize(objects(cats), use_na_sentinel=False)
        except TypeError:
            raise Fallback("an unhashable cat") from None
        keys = ["" if u is UNSET else u for u in c_uniq]
        for k, c in zip(keys, np.bincount(c_codes, minlength=len(keys)).tolist()):
            self.cats[k] += c
        cls = np.array([self._cat_class(k) for k in keys] + [_OTHER], np.int8)[c_codes]
        used = cls != _OTHER
        if not used.any():
            return
        start = ts_ns[xi]
        bad = used & ~ts_ok[xi]
        for j in np.flatnonzero(bad).tolist():
            raw = xs[j].ts
            if raw is UNSET:
                raise Fallback("an event without ts")
            start[j] = _exact_ns(raw)
        dur_ns, dur_ok = _times([e.dur for e in xs])
        for j in np.flatnonzero(used & ~dur_ok).tolist():
            raw = xs[j].dur
            dur_ns[j] = 0 if raw is UNSET else _exact_ns(raw)
        for j in np.flatnonzero((cls == _DEV) | (cls == _API)).tolist():
            self._device_or_api(xs[j], keys[c_codes[j]], int(cls[j]), int(start[j]), int(dur_ns[j]))
        self._ranges(xs, keys, c_codes, cls, start, dur_ns)

    def _other(self, ev: Event, ts: int | None) -> None:
        ph = ev.ph
        if ph in ("s", "f") and ev.cat in self.flow_cats and ev.id is not UNSET:
            if ts is None:
                if ev.ts is UNSET:
                    raise Fallback("a flow without ts")
                ts = _exact_ns(ev.ts)
            self.flows[(ph, _raw(ev.pid), _raw(ev.tid), ts)] = _int(ev.id)
        elif ph == "M" and ev.name == "thread_name":
            nm = ev.args.name if isinstance(ev.args, Args) else UNSET
            if nm is not UNSET and nm:
                self.thread_names[f"{_raw(ev.pid)}:{_raw(ev.tid)}"] = str(nm)

    def _device_or_api(self, ev: Event, cat: str, cls: int, start: int, dur: int) -> None:
        a = ev.args if isinstance(ev.args, Args) else Args()
        pid, tid = _raw(ev.pid), _raw(ev.tid)
        linked = a.correlation is not UNSET
        name = "" if ev.name is UNSET else name_text(ev.name)
        corr = _int(a.correlation if linked else None)
        if cls == _DEV:
            d = self.dev
            if not linked:
                self.unlinked.append(("dev", len(d["start_ns"]), ("f", pid, tid, start)))
            d["start_ns"].append(start)
            d["dur_ns"].append(dur)
            d["kind"].append(self.device_cats[cat].value)
            d["name"].append(name)
            d["device"].append(_int(pid if a.device is UNSET else a.device))
            d["stream"].append(_int(tid if a.stream is UNSET else a.stream))
            d["correlation"].append(corr)
            d["bytes"].append(_int(None if a.bytes is UNSET else a.bytes))
        else:
            d = self.api
            if not linked:
                self.unlinked.append(("api", len(d["start_ns"]), ("s", pid, tid, start)))
            d["start_ns"].append(start)
            d["dur_ns"].append(dur)
            d["pid"].append(_int(pid))
            d["tid"].append(_int(tid))
            d["name"].append(name)
            d["correlation"].append(corr)

    def _ranges(self, xs: list[Event], keys: list, c_codes: np.ndarray, cls: np.ndarray, start: np.ndarray,
                dur: np.ndarray) -> None:
        take = np.flatnonzero((cls == _RANGE) | (cls == _OP) | (cls == _PY))
        if not len(take):
            return
        sub = [xs[j] for j in take.tolist()] if len(take) < len(xs) else xs
        p = self.rng_parts
        p["start_ns"].append(start[take])
        p["dur_ns"].append(dur[take])
        p["pid"].append(_ints([e.pid for e in sub], _int))
        p["tid"].append(_ints([e.tid for e in sub], _int))
        codes, texts = self.rng_names.codes([e.name for e in sub])
        p["name"].append(codes)
        # domain: by category; an operator's by its name (a stage alias: the default domain)
        by_cat = np.array([_cat_domain(self.range_cats, k, int(c)) for k, c in
                           zip(keys, np.array([self._cat_class(k) for k in keys]))] + [_D_NONE], np.int8)
        dom = by_cat[c_codes[take]]
        ops = np.flatnonzero(cls[take] == _OP)
        if len(ops):
            stage = np.array([self._stage.setdefault(t, self.is_stage(t)) for t in self.rng_names.texts], bool)
            dom[ops] = np.where(stage[codes[ops]], _D_NONE, _D_OP)
        p["domain"].append(dom)
        self.rng_rows += len(take)

    def finish(self) -> None:
        """Flows linked to the rows without ``args.correlation``."""
        for table, row, key in self.unlinked:
            (self.dev if table == "dev" else self.api)["correlation"][row] = self.flows.get(key, -1)
        self.unlinked = []

    def ranges(self) -> dict[str, np.ndarray]:
        """The range columns whole (``name``: codes into ``rng_names.texts``)."""
        p = self.rng_parts
        out = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in p.items()}
        for v in p.values():
            v.clear()
        return out


def _cat_domain(range_cats: dict[str, str], cat: Any, cls: int) -> int:
    if cls == _RANGE:
        return DOMAINS.index(range_cats[cat])
    return _D_PY if cls == _PY else _D_OP


def _raw(v: Any) -> Any:
    """A member as ``dict.get`` gives it: None when absent."""
    return None if v is UNSET else v


def _times(raws: list) -> tuple[np.ndarray, np.ndarray]:
    """``literals_ns`` of raw literals, absent ones (``UNSET``) not ok."""
    try:
        return literals_ns(raws)
    except TypeError:                           # some absent
        ns, ok = literals_ns([b"" if r is UNSET else r for r in raws])
        return ns, ok


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


def objects(values: list) -> np.ndarray:
    """``values`` as a 1-D object array (lists among them stay elements)."""
    return np.fromiter(values, dtype=object, count=len(values))
