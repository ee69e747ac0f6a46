"""Req, SamplingParams and finish reasons: the long-lived, CPU-side state of one request.

A ``Req`` lives from submission to finish and is owned by the scheduler. It never holds device
tensors; its KV slots are recorded in the scheduler's CPU copy of the request's req-to-token row.

Token accounting (page size 1):
- ``fill_ids`` = prompt + outputs; ``kv_len`` = how many leading ``fill_ids`` have a KV slot.
- After a prefill of n tokens, ``kv_len == n`` and one output exists (not yet in the KV cache);
  each decode step gives the last output a slot (``kv_len += 1``) and samples one more token.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol


class SamplingParamsError(ValueError):
    """A request's sampling parameters (or prompt) are invalid; the message names the field."""


class FinishKind(str, Enum):
    LENGTH = "length"          # max_new_tokens reached (or the context is full)
    EOS = "eos"                # the tokenizer's EOS token (unless ignore_eos)
    STOP_TOKEN = "stop_token"  # one of stop_token_ids
    STOP_STR = "stop_str"      # a stop string appeared in the decoded output
    ABORT = "abort"            # aborted by the caller


@dataclass(frozen=True)
class FinishReason:
    kind: FinishKind
    matched: int | str | None = None   # the stop token id or stop string that matched
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind.value, "matched": self.matched, "message": self.message}


_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "ignore_eos",
           "stop_token_ids", "stop", "no_stop_trim")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping. ``temperature == 0`` means greedy (the default)."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1                 # -1: no top-k
    top_p: float = 1.0              # in (0, 1]
    min_p: float = 0.0              # in [0, 1]
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()      # stop strings (matched in the decoded output)
    no_stop_trim: bool = False      # keep a matched stop string in the output text (SGLang's name)

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> None:
            raise SamplingParamsError(f"{name}: {msg}")

        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            bad("max_new_tokens", f"must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            bad("max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        if (not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool)
                or not 0.0 <= self.temperature < float("inf")):
            bad("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        if (not isinstance(self.top_k, int) or isinstance(self.top_k, bool)
                or not (self.top_k == -1 or self.top_k >= 1)):
            bad("top_k", f"must be a positive int or -1 (off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad("seed", f"must be an int or None, got {self.seed!r}")
        stop_ids = self.stop_token_ids
        if isinstance(stop_ids, int):
            stop_ids = (stop_ids,)
        if not all(isinstance(t, int) and t >= 0 for t in stop_ids):
            bad("stop_token_ids", f"must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(stop_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(s, str) and s for s in stop):
            bad("stop", f"must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.no_stop_trim, bool):
            bad("no_stop_trim", f"must be a bool, got {self.no_stop_trim!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @classmethod
    def from_any(cls, value: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
        """Accept a SamplingParams, a dict of its fields (unknown keys rejected) or None."""
        if value is None:
            return cls()
        if isinstance(value, SamplingParams):
            return value
        if not isinstance(value, Mapping):
            raise SamplingParamsError(f"sampling_params: expected a dict or SamplingParams, "
                                      f"got {type(value).__name__}")
        unknown = sorted(set(value) - set(_FIELDS))
        if unknown:
            raise SamplingParamsError(f"{unknown[0]}: unknown sampling option "
                                      f"(known: {', '.join(_FIELDS)})")
        return cls(**dict(value))


class Detokenizer(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


_rid_counter = itertools.count()


@dataclass(eq=False)
class Req:
    """One request: prompt, outputs, stop state, and where its KV lives. Scheduler-owned."""

    origin_input_ids: list[int]
    sampling_params: SamplingParams
    rid: str = ""
    eos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()   # more EOS ids (a checkpoint may have several)
    max_new_tokens: int = 0               # effective limit (clamped by the context); 0 = from params
    output_ids: list[int] = field(default_factory=list)
    finished_reason: FinishReason | None = None
    # memory
    req_pool_idx: int | None = None       # row in ReqToTokenPool; None when not resident
    kv_len: int = 0                       # leading fill_ids that have KV slots
    prefix_len: int = 0                   # of which the first prefix_len are shared via the cache
    last_node: Any = None                 # radix node locked on our behalf
    prefix_indices: Any = None            # matched slots (np.ndarray) until written to our row
    extend_input_len: int = 0             # new tokens in the current extend step
    is_chunked: int = 0                   # > 0 while a chunk of it is being prefilled
    to_abort: bool = False
    future_idx: int = -1                  # overlap loop: where the in-flight next token will be
    order: int = 0                        # arrival order (fcfs key), set by the scheduler
    tag: str = ""                         # free-form label (workload runner)
    # statistics
    cached_tokens: int = 0                # prompt tokens served from the prefix cache (summed)
    prefill_tokens: int = 0               # tokens actually prefilled (summed over chunks/retracts)
    num_retractions: int = 0
    arrival_ns: int = 0
    first_token_ns: int = 0
    finish_ns: int = 0
    token_ns: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.rid:
            self.rid = f"req-{next(_rid_counter)}"
        if self.max_new_tokens <= 0:
            self.max_new_tokens = self.sampling_params.max_new_tokens
        self._stop_ids = frozenset(self.sampling_params.stop_token_ids)
        self._eos_ids = frozenset(self.eos_token_ids) | (
            frozenset() if self.eos_token_id is None else {self.eos_token_id})
        # tokens decoded for the stop-string check: a stop string spans at most its UTF-8 length in
        # tokens (one per byte with the byte tokenizer); 8 more cover a partial character before it
        self._stop_tail = (max(len(s.encode("utf-8")) for s in self.sampling_params.stop) + 8
                           if self.sampling_params.stop else 0)

    # -- views ---------------------------------------------------------------------------------
    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def remaining_new_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids), 0)

    # -- state changes -------------------------------------------------------------------------
    def append_token(self, token_id: int, detok: Detokenizer | None = None, t_ns: int = 0) -> bool:
        """Append one sampled token and run the stop checks. Returns True when this finished it.

        NOTE: a finished request never grows — a token arriving after the finish (the overlap
        loop's one-step-late result) is dropped and False returned.
        """
        if self.finished_reason is not None:
            return False
        self.output_ids.append(token_id)
        if t_ns:
            if not self.first_token_ns:
                self.first_token_ns = t_ns
            self.token_ns.append(t_ns)
        self.check_finished(detok)
        return self.finished_reason is not None

    def check_finished(self, detok: Detokenizer | None = None) -> None:
        if self.finished_reason is not None or not self.output_ids:
            return
        last = self.output_ids[-1]
        if last in self._stop_ids:
            self.finished_reason = FinishReason(FinishKind.STOP_TOKEN, last)
        elif not self.sampling_params.ignore_eos and last in self._eos_ids:
            self.finished_reason = FinishReason(FinishKind.EOS, last)
        elif self._stop_tail and detok is not None:
            tail = detok.decode(self.output_ids[-self._stop_tail:])
            for s in self.sampling_params.stop:
                if s in tail:
                    self.finished_reason = FinishReason(FinishKind.STOP_STR, s)
                    break
        if self.finished_reason is None and len(self.output_ids) >= self.max_new_tokens:
            self.finished_reason = FinishReason(FinishKind.LENGTH, len(self.output_ids))

    def output_text(self, detok: Detokenizer) -> str:
        """The decoded output; a matched stop string and what follows it are cut unless
        ``no_stop_trim`` (the token ids keep it)."""
        text = detok.decode(self.output_ids)
        fr = self.finished_reason
        if fr is not None and fr.kind is FinishKind.STOP_STR and not self.sampling_params.no_stop_trim:
            pos = text.find(str(fr.matched))
            if pos >= 0:
                text = text[:pos]
        return text

    def abort(self, message: str = "aborted") -> None:
        if self.finished_reason is None:
            self.finished_reason = FinishReason(FinishKind.ABORT, None, message)

    def reset_for_retract(self) -> None:
        """Drop residency after a retraction; outputs are kept and re-prefilled on readmission."""
        self.req_pool_idx = None
        self.kv_len = 0
        self.prefix_len = 0
        self.last_node = None
        self.extend_input_len = 0
        self.is_chunked = 0
        self.future_idx = -1
        self.num_retractions += 1


def validate_prompt(ids: Iterable[int], context_length: int, max_total_tokens: int,
                    vocab_size: int) -> list[int]:
    """Check a tokenized prompt; raises SamplingParamsError naming ``prompt``."""
    ids = list(ids)
    if not ids:
        raise SamplingParamsError("prompt: empty prompt")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise SamplingParamsError("prompt: token ids must be ints")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise SamplingParamsError(f"prompt: token ids must be in [0, {vocab_size})")
    limit = min(context_length, max_total_tokens)
    if len(ids) >= limit:
        raise SamplingParamsError(f"prompt: {len(ids)} tokens leave no room for output "
                                  f"(context limit {limit})")
    return ids
