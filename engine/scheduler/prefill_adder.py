"""Prefill admission: which waiting requests join the next prefill batch, under three budgets.

- total KV: free slots + evictable cached slots, minus what the running requests are still
  expected to need (remaining new tokens x ``new_token_ratio``); a new request needs its new
  prompt tokens plus its own remaining new tokens;
- ``max_prefill_tokens`` new tokens per batch (the first request always fits, chunked if needed);
- ``chunked_prefill_size``: a request whose new tokens exceed what is left becomes the (single)
  chunked request: only a chunk is prefilled now, and that chunk emits no token.

With mixed chunks (``mixed_decode_tokens`` > 0) the running decode requests ride along in the same
forward, one token each: those tokens come off the prefill-token and chunk budgets, and their
slots off the KV budget.
"""
from __future__ import annotations

from enum import Enum

from srtscope.engine.request import Req

#: cap on max_new_tokens when reserving KV for it (SGLang's CLIP_MAX_NEW_TOKENS)
CLIP_MAX_NEW_TOKENS = 4096


class AddResult(Enum):
    CONTINUE = "continue"      # admitted; try the next one
    NO_TOKEN = "no_token"      # KV budget exhausted: stop admitting
    OTHER = "other"            # prefill-token or chunk budget exhausted: stop admitting


class PrefillAdder:
    def __init__(self, tree_cache, allocator, running_reqs: list[Req], new_token_ratio: float,
                 max_prefill_tokens: int, chunked_prefill_size: int,
                 mixed_decode_tokens: int = 0) -> None:
        self.tree_cache = tree_cache
        reserve = sum(min(r.remaining_new_tokens(), CLIP_MAX_NEW_TOKENS) for r in running_reqs)
        self.rem_total_tokens = (allocator.available_size() + tree_cache.evictable_size()
                                 - int(reserve * new_token_ratio) - mixed_decode_tokens)
        self.rem_input_tokens = max_prefill_tokens - mixed_decode_tokens
        self.rem_chunk_tokens = (chunked_prefill_size - mixed_decode_tokens
                                 if chunked_prefill_size > 0 else None)
        self.can_run: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.cached_tokens = 0

    def _lock(self, req: Req) -> None:
        """Lock the request's matched prefix; the budget loses what stops being evictable."""
        before = self.tree_cache.evictable_size()
        self.tree_cache.inc_lock_ref(req.last_node)
        self.rem_total_tokens -= before - self.tree_cache.evictable_size()

    def _room(self) -> int:
        room = self.rem_input_tokens
        if self.rem_chunk_tokens is not None:
            room = min(room, self.rem_chunk_tokens)
        return room

    def _take(self, req: Req, n: int, reserve: int) -> None:
        req.extend_input_len = n
        self.can_run.append(req)
        self.rem_total_tokens -= n + reserve
        self.rem_input_tokens -= n
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= n

    def add_chunked_req(self, req: Req, max_tokens: int) -> None:
        """The next chunk of the request already being prefilled (admitted first), at most
        ``max_tokens`` new tokens (what free + evictable slots allow)."""
        remaining = req.seq_len - req.kv_len
        n = min(remaining, max(self._room(), 1), max_tokens)
        self._take(req, n, 0)
        self.rem_total_tokens -= remaining - n + min(req.remaining_new_tokens(),
                                                     CLIP_MAX_NEW_TOKENS)
        if n < remaining:
            self.new_chunked_req = req

    def add_one_req(self, req: Req) -> AddResult:
        """Match the request's prefix and admit it (whole, or as the chunked request)."""
        fill = req.fill_ids
        match = self.tree_cache.match_prefix(fill[:-1])   # at least one token is computed
        extend = len(fill) - match.length
        reserve = min(req.remaining_new_tokens(), CLIP_MAX_NEW_TOKENS)
        room = self._room()
        chunked = self.rem_chunk_tokens is not None
        if room <= 0 or (extend > room and self.can_run and
                         (not chunked or self.new_chunked_req is not None)):
            return AddResult.OTHER
        take = extend if (extend <= room or not chunked) else room
        # lock first: the matched prefix stops being evictable and the budget shrinks by that
        req.last_node = match.last_node
        self._lock(req)
        need = extend + reserve       # the whole request must fit, even when chunked
        if need > self.rem_total_tokens:
            before = self.tree_cache.evictable_size()
            self.tree_cache.dec_lock_ref(req.last_node)
            self.rem_total_tokens += self.tree_cache.evictable_size() - before
            req.last_node = None
            return AddResult.NO_TOKEN
        req.prefix_len = match.length
        req.prefix_indices = match.indices
        req.cached_tokens += match.length
        self.cached_tokens += match.length
        if take == extend:
            self._take(req, extend, reserve)
            return AddResult.CONTINUE if self._room() > 0 else AddResult.OTHER
        self._take(req, take, extend - take + reserve)   # the chunked request: first chunk now
        self.new_chunked_req = req
        return AddResult.OTHER
