"""A fake model worker for scheduler tests: it checks the memory layout it is given.

Each forward writes ``(token, position)`` into the KV "buffer" at ``out_cache_loc``, then, for
every sampled request, reads its whole context back through ``req_to_token`` and fails loudly
if any slot holds the wrong position (a stale, shared or freed slot). The next token is a hash
of the context's tokens, so any wrong slot also changes the output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from srtscope.engine.config import EOS_ID, EngineConfig
from srtscope.engine.tokenizer import ByteTokenizer


@dataclass
class FakeResult:
    next_token_ids: torch.Tensor
    logits: torch.Tensor | None = None
    graph_used: bool = False
    eager_reason: str | None = "no_cuda"
    padded_bs: int = 0


class FakeWorker:
    def __init__(self, config: EngineConfig, delay_s: float = 0.0, vocab: int = 256) -> None:
        self.device = torch.device("cpu")
        self.tokenizer = ByteTokenizer()
        self.kv = torch.full((config.kv_pool_size, 2), -1, dtype=torch.int64)
        self.delay_s = delay_s
        self.vocab = vocab
        self.calls: list[tuple[str, int, int]] = []     # (mode, bs, num_tokens)

    def forward_batch_generation(self, fb) -> FakeResult:
        if self.delay_s:
            time.sleep(self.delay_s)
        loc = fb.out_cache_loc
        if (loc == 0).any():
            raise AssertionError("a real token was written to the dummy slot 0")
        self.kv[loc, 0] = fb.input_ids
        self.kv[loc, 1] = fb.positions
        if (fb.input_ids < 0).any():
            raise AssertionError("unresolved future placeholder reached the model")
        self.calls.append((fb.forward_mode.label, fb.batch_size, fb.num_tokens))
        out = torch.zeros(fb.batch_size, dtype=torch.int64)
        for i in range(fb.batch_size):
            row, n = int(fb.req_pool_indices[i]), int(fb.seq_lens[i])
            slots = fb.req_to_token[row, :n].long()
            ctx = self.kv[slots]
            if not torch.equal(ctx[:, 1], torch.arange(n)):
                raise AssertionError(f"row {row}: KV slots hold positions {ctx[:, 1].tolist()}")
            toks = ctx[:, 0]
            h = int((toks * torch.arange(1, n + 1) * 2654435761).sum()) + int(toks[-1]) * 40503
            out[i] = (h >> 7) % self.vocab
        return FakeResult(out)


def drain(s, max_steps: int = 10_000) -> None:
    """Run event-loop iterations until the scheduler is idle (failing if it never is), then check
    the idle invariant."""
    for _ in range(max_steps):
        if s.is_idle():
            break
        s.run_step()
    else:
        raise AssertionError(f"scheduler not idle after {max_steps} steps")
    s.check_invariants()


def byte_prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


__all__ = ["FakeWorker", "byte_prompt", "drain", "EOS_ID"]
