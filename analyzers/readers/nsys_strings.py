"""StringIds, the string table of an nsys export: names looked up by id (distinct ids only), cut
to ``MAX_NAME_CHARS`` in SQL (``capped``) or, the huge ones, through blob I/O without loading them;
name columns as categoricals, counting the ids StringIds lacks (a damaged export).
"""
from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd

from srtscope.analyzers.model.units import MAX_NAME_CHARS, NAME_END_CHARS
from srtscope.analyzers.readers.columnar import cat_from_codes, factorize
from srtscope.analyzers.readers.nsys_tables import NsysTables


def capped(expr: str) -> str:
    """SQL for ``expr`` (a text) cut to ``MAX_NAME_CHARS`` in SQLite (``units.name_text``'s cut), so
    that a huge string never reaches Python whole; NULL stays NULL."""
    keep = MAX_NAME_CHARS - NAME_END_CHARS - 1
    return (f"CASE WHEN length({expr}) > {MAX_NAME_CHARS} THEN substr({expr}, 1, {keep}) || '…' || "
            f"substr({expr}, -{NAME_END_CHARS}) ELSE {expr} END")


class NsysStrings(NsysTables):
    """``NsysTables`` with the names of StringIds."""

    def long_string_ids(self) -> set[int]:
        """StringIds ids whose value is over ``4 * MAX_NAME_CHARS`` bytes, found without loading
        any value (``octet_length`` in the ADBC driver's SQLite reads the size only); empty where
        that cannot be asked (then ``capped`` cuts them in SQL, loading each once)."""
        if self._long_ids is None:
            self._long_ids = set()
            try:
                cur = self.arrow.cursor()
                try:
                    cur.execute(f"SELECT id FROM StringIds WHERE octet_length(value) > {4 * MAX_NAME_CHARS}")
                    self._long_ids = {int(r[0]) for r in cur.fetchall()}
                finally:
                    cur.close()
            except Exception:  # noqa: BLE001 - an old driver, a damaged table: the SQL cut remains
                pass
        return self._long_ids

    def long_string(self, sid: int) -> str:
        """The value of StringIds ``sid`` cut as ``capped`` cuts it, read through SQLite's blob I/O:
        its first and last bytes only, never the whole value."""
        row = self.con.execute("SELECT rowid FROM StringIds WHERE id = ?", (sid,)).fetchone()
        with self.con.blobopen("StringIds", "value", row[0], readonly=True) as blob:  # type: ignore[attr-defined,unused-ignore]
            size = len(blob)
            head = blob.read(4 * MAX_NAME_CHARS).decode("utf-8", errors="ignore")
            blob.seek(max(0, size - 4 * NAME_END_CHARS))
            tail = blob.read(4 * NAME_END_CHARS).decode("utf-8", errors="ignore")
        return head[:MAX_NAME_CHARS - NAME_END_CHARS - 1] + "…" + tail[-NAME_END_CHARS:]

    def strings(self, ids: np.ndarray) -> dict[int, str]:
        """StringIds values of ``ids`` (distinct ids only are looked up); values longer than
        ``MAX_NAME_CHARS`` cut (``capped``), the huge ones without loading them (``long_string``)."""
        want = np.unique(ids).tolist()
        out: dict[int, str] = {}
        huge = self.long_string_ids()
        if huge:
            for sid in [w for w in want if int(w) in huge]:
                try:
                    out[int(sid)] = self.long_string(int(sid))
                except (sqlite3.Error, TypeError, AttributeError):     # no blob I/O before Python 3.11
                    continue            # looked up below, cut in SQL
            want = [w for w in want if int(w) not in out]
        for i in range(0, len(want), 900):
            part = want[i:i + 900]
            q = f"SELECT id, {capped('value')} FROM StringIds WHERE id IN ({','.join('?' * len(part))})"
            try:
                rows = self.con.execute(q, part).fetchall()
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc):
                    raise
                raise sqlite3.DatabaseError("malformed values in StringIds: names that are not UTF-8") from None
            for sid, value in rows:
                if not isinstance(value, str):      # NULL, a blob: no name, and no category beside names
                    what = "NULL" if value is None else "binary" if isinstance(value, bytes) else type(value).__name__
                    raise sqlite3.DatabaseError(f"malformed values in StringIds: {what} where names belong")
                out[sid] = value
        return out

    def categorical(self, ids: np.ndarray, transform=None, table: str = "") -> pd.Categorical:
        """ids into StringIds -> categorical of (optionally transformed) strings. In a windowed
        read, the categories and the missing names are those of ``table``'s whole name column."""
        seen = self.window.seen.get(table) if self.window is not None else None
        if seen is not None:
            uniq = seen.values("name")
            inv = np.searchsorted(uniq, ids) if len(uniq) else np.zeros(len(ids), np.int64)
        else:
            inv, uniq = factorize(ids)
        lut = self.strings(uniq)
        vals = [lut.get(int(u), "") for u in uniq.tolist()]
        lost = [i for i, u in enumerate(uniq.tolist()) if int(u) not in lut]
        if seen is not None:
            self.named_rows += seen.rows
            self.missing_strings += sum(seen.count("name", int(uniq[i])) for i in lost)
        else:
            self.named_rows += len(ids)
            if lost:
                self.missing_strings += int(np.isin(inv, lost).sum())
        if transform is not None:
            vals = [transform(v) for v in vals]
        return cat_from_codes(inv, vals)
