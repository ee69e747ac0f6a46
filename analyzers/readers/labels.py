"""Range labels -> (name, attrs), per distinct label only.

srtscope messages (``"sched.schedule bs=32"``) split through ``probes.stages.parse_message``; any other
label (``"Step 1 to 10"``, ``"aten::mul, op_id = 3"``) keeps its whole text as the name, since a
space in it is not our attribute separator.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from srtscope.probes.stages import parse_message


def split_label(label: str) -> tuple[str, dict[str, str] | None]:
    """One label -> (name, attrs or None)."""
    if " " not in label:
        return label, None
    name, attrs = parse_message(label)
    tokens = label.split(" ")[1:]
    if name and all("=" in t and not t.startswith("=") for t in tokens):
        return name, (attrs or None)
    return label, None


def _shared(parsed: list[tuple[str, dict[str, str] | None]]) -> list[tuple[str, dict[str, str] | None]]:
    """``parsed`` with equal names, keys and values one string each. NOTE: a trace labels each step
    uniquely (``loop.step step=N bs=B``): its names, keys and most values repeat over 100 k labels."""
    one: dict[str, str] = {}
    return [(one.setdefault(name, name),
             {one.setdefault(k, k): one.setdefault(v, v) for k, v in attrs.items()} if attrs else attrs)
            for name, attrs in parsed]


def split_labels(labels: Sequence[Any]) -> tuple[pd.Categorical, np.ndarray]:
    """Vector form: categorical names and an object array of attrs dicts (None when none).

    NOTE: rows with the same label share one attrs dict; treat attrs as read-only."""
    codes, uniq = pd.factorize(pd.Series(labels, dtype=object).fillna(""), sort=False)
    return split_coded_labels(np.asarray(codes, np.int64), [str(u) for u in uniq])


def split_coded_labels(codes: np.ndarray, uniq: Sequence[str]) -> tuple[pd.Categorical, np.ndarray]:
    """``split_labels`` of labels given as codes into their distinct strings ``uniq``: each
    distinct label is parsed once."""
    parsed = _shared([split_label(u) for u in uniq])
    names = [p[0] for p in parsed]
    cats, name_codes = np.unique(np.asarray(names, dtype=object), return_inverse=True) \
        if names else (np.array([], dtype=object), np.zeros(0, np.int64))
    # NOTE: the codes in the narrowest type pandas keeps them in: no wider copy of millions of rows
    small = np.int8 if len(cats) < 127 else np.int16 if len(cats) < 32767 else np.int32
    code_map = np.asarray(name_codes, dtype=small).reshape(-1)
    # pandas-stubs wants an Index for categories; a list works at runtime
    cat = pd.Categorical.from_codes(  # type: ignore[call-overload]
        code_map[codes] if len(codes) else np.zeros(0, np.int64), categories=list(cats))
    attr_lut = np.empty(len(parsed), dtype=object)
    attr_lut[:] = [p[1] for p in parsed]
    attrs = attr_lut[codes] if len(codes) else np.empty(0, dtype=object)
    return cat, attrs
