"""Check a saved ``srtscope diagnose --json`` document against the JSON contract
(``docs/json_contract.md``) before ``compare`` trusts its figures.

Checked: ``version`` is 1; the contract's top-level keys are there with their types; the verdict
names a known bottleneck, and a cause of it, with a confidence in 0..1; every value under a key ending in ``_ns`` is
integer nanoseconds or null (lists and maps of them included); no number anywhere is NaN or
infinite; no string (key or value) longer than ``MAX_TEXT_CHARS``; every figure ``compare`` reads
is a non-negative integer (or null). A violation is a
``ContractError`` (ValueError) whose message is one line naming the JSON path.
"""
from __future__ import annotations

import json
import math
from typing import Any

from srtscope.analyzers.model.units import MAX_TEXT_CHARS

CONTRACT_VERSION = 1
MAX_SAVED_BYTES = 64 * 2**20    # larger .json files are read as traces, not saved diagnoses
BOTTLENECKS = ("scheduler", "prep", "kernel", "host")
TOP_LEVEL: dict[str, type] = {"version": int, "verdict": dict, "bubbles": dict, "steps": dict,
                              "eager": dict, "comm": dict, "budget": dict, "top_kernels": list,
                              "device": dict, "capture": dict, "params": dict}


class SavedDiagnosis:
    """A diagnosis as its JSON document (read back from ``diagnose --json`` output or from the
    diagnosis cache): what ``compare`` and the renderers need of a ``Diagnosis``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self._doc = doc

    def to_json(self) -> dict[str, Any]:
        return self._doc


class ContractError(ValueError):
    """A document that is not a diagnosis of the contract; one line naming where."""


class _NonFinite(float):
    """A NaN / Infinity literal as read, so the check can say where it was."""

    def __new__(cls, literal: str) -> _NonFinite:
        obj = super().__new__(cls, float(literal))
        obj.literal = literal
        return obj

    literal: str


def parse(text: str) -> Any:
    """JSON with NaN / Infinity literals kept as markers (``check`` refuses them)."""
    return json.loads(text, parse_constant=_NonFinite)


def looks_like_diagnosis(doc: Any) -> bool:
    """A JSON object that claims to be a saved diagnosis (and is then held to the contract)."""
    return isinstance(doc, dict) and ("verdict" in doc or "bubbles" in doc) and "traceEvents" not in doc


def _number_ok(v: Any) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


class _Bad(Exception):
    """A value the contract refuses; ``where`` collects its JSON path while unwinding."""

    def __init__(self, why: str) -> None:
        self.why = why
        self.where: list[str] = []


def _walk(node: Any, under_ns: bool) -> None:
    """Every number finite; under an ``_ns`` key, integers (or null) only. The path of a refused
    value is only put together once one is found (a cached answer is checked on every look)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if len(k) > MAX_TEXT_CHARS:
                raise _Bad(f"a key of {len(k)} characters, more than the {MAX_TEXT_CHARS} allowed")
            if isinstance(v, (dict, list, float, str)) or (under_ns or str(k).endswith("_ns")):
                try:
                    _walk(v, under_ns or str(k).endswith("_ns"))
                except _Bad as bad:
                    bad.where.append(f".{k}")
                    raise
    elif isinstance(node, list):
        for i, v in enumerate(node):
            try:
                _walk(v, under_ns)
            except _Bad as bad:
                bad.where.append(f"[{i}]")
                raise
    elif isinstance(node, float) and not math.isfinite(node):
        raise _Bad(f"{getattr(node, 'literal', repr(node))} is not a number the contract allows")
    elif under_ns and node is not None and (isinstance(node, bool) or not isinstance(node, int)):
        raise _Bad(f"must be integer nanoseconds, got {node!r}"[:200])
    elif isinstance(node, str) and len(node) > MAX_TEXT_CHARS:
        raise _Bad(f"a string of {len(node)} characters, more than the {MAX_TEXT_CHARS} allowed")


def check(doc: Any) -> dict[str, Any]:
    """``doc`` if it is a diagnosis of contract version 1; else ContractError (one line)."""
    from srtscope.analyzers.analyses.diff import FIGURES

    if not isinstance(doc, dict):
        raise ContractError(f"not a JSON object (got {type(doc).__name__})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ContractError(f"version: missing or not an integer (got {version!r})"[:200])
    if version != CONTRACT_VERSION:
        raise ContractError(f"version: {version} is not supported (this srtscope reads {CONTRACT_VERSION})")
    for key, kind in TOP_LEVEL.items():
        if key not in doc:
            raise ContractError(f"{key}: missing (a saved diagnosis has {', '.join(TOP_LEVEL)})")
        if not isinstance(doc[key], kind):
            raise ContractError(f"{key}: must be a JSON {'object' if kind is dict else kind.__name__}")
    try:
        _walk(doc, False)
    except _Bad as bad:
        raise ContractError(f"{''.join(reversed(bad.where))}: {bad.why}") from None
    verdict = doc["verdict"]
    if verdict.get("bottleneck") not in BOTTLENECKS:
        raise ContractError(f"verdict.bottleneck: must be one of {', '.join(BOTTLENECKS)}, "
                            f"got {verdict.get('bottleneck')!r}"[:200])
    cause = verdict.get("cause")
    if "cause" in verdict:          # written by every srtscope since it was added; older saves lack it
        from srtscope.analyzers.model.vocab import Cause

        try:
            of = Cause(cause).bottleneck.value if isinstance(cause, str) else None
        except ValueError:
            of = None
        if of != verdict["bottleneck"]:
            raise ContractError(f"verdict.cause: {cause!r} is not a cause of bottleneck "
                                f"{verdict['bottleneck']!r}"[:200])
    conf = verdict.get("confidence")
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 <= conf <= 1:
        raise ContractError(f"verdict.confidence: must be a number in 0..1, got {conf!r}"[:200])
    for name, path, _ in FIGURES:
        v: Any = doc
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ContractError(f"{'.'.join(path)}: figure {name} must be a non-negative integer, "
                                f"got {v!r}"[:200])
    return doc
