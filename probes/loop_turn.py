"""One turn of an engine's scheduler loop under ``--instrument`` (``engine_tables``' module doc):
the spans of a loop that spins when idle (SGLang's) kept only for turns that did work, took
``IDLE_TURN_NS`` or more, or first went idle after work (whose start ends that work's step).
Used by ``instrument``'s wrappers while the recorder alone records (``ranges.recorder_only``)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from srtscope.probes import engine_tables, ranges
from srtscope.probes.engine_tables import Target

_turn = threading.local()


def reset() -> None:
    """This thread's turn afresh: no polls pending, no idle turn before."""
    _turn.__dict__.clear()


def _pending() -> list:
    """This thread's polls waiting for their turn's decision: (name, start_ns, end_ns, attrs)."""
    return _turn.__dict__.setdefault("pending", [])


def call(fn: Callable[..., Any], args: Any, kwargs: Any, target: Target, attrs: dict[str, object],
         mode_of: Callable[[Callable[[Any], str | None] | None, Any], str | None]) -> Any:
    """``fn`` as a part of the engine's loop turn (``engine_tables``' module doc): a poll's span
    waits; the decision records the turn's spans, or drops them when the turn found no work, took
    under ``IDLE_TURN_NS`` and followed another such turn (the first idle turn after work ends that
    work's step); ``mode_of(target.mode_from, result)``: the step mode a kept decision's span gets.
    Results and exceptions pass through unchanged (a call that raises is no idle turn)."""
    name, pending = target.stage.value, _pending()
    result: Any = None
    idle = False
    t0 = perf_counter_ns()
    try:
        result = fn(*args, **kwargs)
        idle = target.turn == "decide" and target.idle_if is not None and _idle(target.idle_if, result)
    finally:
        t1 = perf_counter_ns()
        if target.turn == "poll":
            pending.append((name, t0, t1, attrs))
            if len(pending) > _MAX_PENDING:         # polls with no decision: kept, not held
                _record(pending)
        else:
            quiet = idle and t1 - t0 + sum(e - s for _, s, e, _ in pending) < engine_tables.IDLE_TURN_NS
            # NOTE: the first quiet turn after work is kept: its start ends the last busy turn's step
            # (a step runs to the next turn's start: analyses/steps.py), else that step would run on
            # to the next work, over the whole idle stretch
            if quiet and _turn.__dict__.get("was_quiet", False):
                pending.clear()
            else:
                _record(pending)
                mode = None if idle else mode_of(target.mode_from, result)
                ranges.record_span(name, t0, t1, **({**attrs, "mode": mode} if mode else attrs))
            _turn.was_quiet = quiet
    return result


#: polls held at most before they are recorded undecided (a loop whose decide target never runs)
_MAX_PENDING = 64


def _record(pending: list) -> None:
    for name, s, e, attrs in pending:
        ranges.record_span(name, s, e, **attrs)
    pending.clear()


def _idle(idle_if: Callable[[Any], bool], result: Any) -> bool:
    try:
        return bool(idle_if(result))
    except Exception:
        return False
