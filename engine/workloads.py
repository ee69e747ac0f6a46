"""Workload generators (shared prefix, multi-turn chat, agent tree, random lengths) and a runner
that drives an Engine through one and reports throughput, TTFT, inter-token latency and the
prefix-cache hit rate.

Prompts are token-id lists over byte ids (0..255), valid for the byte tokenizer and any vocab of
at least 256 — or, given ``vocab`` (``text_vocab(tokenizer)``: the ids of an English passage through
a checkpoint's own tokenizer), over those ids, so a real model reads words it knows. Multi-turn and
agent-tree requests depend on earlier outputs: a finished request's
``followups`` build the next prompts from its prompt + output, as a real client would. Follow-ups
are small frozen dataclasses (module-level, picklable), so these workloads also reach the ranks
that ``run_tp_workload`` spawns.
"""
from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from srtscope.engine.request import FinishKind, Req, SamplingParams

Followups = Callable[["WorkItem", list[int]], list["WorkItem"]]


@dataclass
class WorkItem:
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float = 0.0                 # offset from the run's start
    followups: Followups | None = None     # requests this one spawns when it finishes
    tag: str = ""


@dataclass
class Workload:
    name: str
    items: list[WorkItem]


# words a prompt is drawn from under a real tokenizer (common English, tokenised once)
SAMPLE_TEXT = ("the model reads a long system prompt and then each user asks a short question about "
               "time water people words and the way they find work in the city or at home when it is "
               "cold or warm one two three many more little first long after before other each about "
               "how what which where who can could would will make made see know use called said")


def text_vocab(tokenizer: Any) -> tuple[int, ...]:
    """The distinct ids of ``SAMPLE_TEXT`` through ``tokenizer`` (its ``encode``), sorted."""
    ids = tuple(sorted(set(tokenizer.encode(SAMPLE_TEXT))))
    if not ids:
        raise ValueError("tokenizer: encodes the sample text to no tokens")
    return ids


def _tokens(rng: random.Random, n: int, vocab: tuple[int, ...] = ()) -> list[int]:
    """``n`` random ids: bytes 0..255, or drawn from ``vocab`` when given."""
    if vocab:
        return [vocab[rng.randrange(len(vocab))] for _ in range(n)]
    return [rng.randrange(256) for _ in range(n)]


def _params(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)


def shared_prefix(num_requests: int = 64, system_len: int = 256, user_len: tuple[int, int] = (16, 64),
                  max_new_tokens: int = 32, seed: int = 0, vocab: tuple[int, ...] = ()) -> Workload:
    """One system prompt shared by many users, each with their own question."""
    rng = random.Random(seed)
    system = _tokens(rng, system_len, vocab)
    items = [WorkItem(system + _tokens(rng, rng.randint(*user_len), vocab), _params(max_new_tokens),
                      tag=f"user{i}") for i in range(num_requests)]
    return Workload("shared-prefix", items)


def multi_turn(num_sessions: int = 8, turns: int = 4, system_len: int = 64,
               user_len: tuple[int, int] = (8, 32), max_new_tokens: int = 16,
               seed: int = 0, vocab: tuple[int, ...] = ()) -> Workload:
    """Chat sessions: turn k+1's prompt is turn k's prompt + reply + a new user message."""
    rng = random.Random(seed)
    system = _tokens(rng, system_len, vocab)
    first = NextTurn(turn=1, turns=turns, user_len=(user_len[0], user_len[1]), seed=seed, vocab=tuple(vocab))
    items = [WorkItem(system + _tokens(rng, rng.randint(*user_len), vocab), _params(max_new_tokens),
                      followups=first, tag=f"s{i}/turn0") for i in range(num_sessions)]
    return Workload("multi-turn", items)


@dataclass(frozen=True)
class NextTurn:
    """Multi-turn follow-up: turn ``turn`` of the session (none once ``turns`` are done)."""

    turn: int
    turns: int
    user_len: tuple[int, int]
    seed: int
    vocab: tuple[int, ...] = ()

    def __call__(self, item: WorkItem, output: list[int]) -> list[WorkItem]:
        if self.turn >= self.turns:
            return []
        tag = f"{item.tag.split('/')[0]}/turn{self.turn}"
        r = random.Random(f"{self.seed}/{tag}")     # independent of completion order
        prompt = item.prompt_ids + output + _tokens(r, r.randint(*self.user_len), self.vocab)
        nxt = dataclasses.replace(self, turn=self.turn + 1)
        return [WorkItem(prompt, item.params, followups=nxt, tag=tag)]


def agent_tree(num_roots: int = 2, depth: int = 3, branching: int = 2, root_len: int = 96,
               step_len: tuple[int, int] = (4, 16), max_new_tokens: int = 16,
               seed: int = 0, vocab: tuple[int, ...] = ()) -> Workload:
    """Tree-of-thought branching: each finished node spawns ``branching`` children whose prompts
    extend the node's prompt + output with a different continuation."""
    rng = random.Random(seed)
    first = Branches(level=1, depth=depth, branching=branching, step_len=(step_len[0], step_len[1]),
                     seed=seed, vocab=tuple(vocab))
    items = [WorkItem(_tokens(rng, root_len, vocab), _params(max_new_tokens), followups=first,
                      tag=f"root{i}") for i in range(num_roots)]
    return Workload("agent-tree", items)


@dataclass(frozen=True)
class Branches:
    """Agent-tree follow-up: the ``branching`` children of a node at ``level`` (none past
    ``depth``), each continuing the node's prompt + output differently."""

    level: int
    depth: int
    branching: int
    step_len: tuple[int, int]
    seed: int
    vocab: tuple[int, ...] = ()

    def __call__(self, item: WorkItem, output: list[int]) -> list[WorkItem]:
        if self.level > self.depth:
            return []
        base = item.prompt_ids + output
        nxt = dataclasses.replace(self, level=self.level + 1)
        out = []
        for b in range(self.branching):
            tag = f"{item.tag}.{b}"
            r = random.Random(f"{self.seed}/{tag}")  # independent of completion order
            out.append(WorkItem(base + _tokens(r, r.randint(*self.step_len), self.vocab), item.params,
                                followups=nxt, tag=tag))
        return out


def random_lengths(num_requests: int = 64, prompt_len: tuple[int, int] = (4, 256),
                   output_len: tuple[int, int] = (1, 64), rate_per_s: float = 0.0,
                   seed: int = 0, vocab: tuple[int, ...] = ()) -> Workload:
    """Independent requests of random lengths; Poisson arrivals when ``rate_per_s`` > 0."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(num_requests):
        if rate_per_s > 0:
            t += rng.expovariate(rate_per_s)
        items.append(WorkItem(_tokens(rng, rng.randint(*prompt_len), vocab),
                              _params(rng.randint(*output_len)), arrival_s=t, tag=f"r{i}"))
    return Workload("random", items)


GENERATORS: dict[str, Callable[..., Workload]] = {
    "shared-prefix": shared_prefix, "multi-turn": multi_turn, "agent-tree": agent_tree,
    "random": random_lengths,
}


def make_workload(name: str, **kwargs: Any) -> Workload:
    try:
        gen = GENERATORS[name]
    except KeyError:
        raise ValueError(f"workload: unknown workload {name!r} ({', '.join(GENERATORS)})") from None
    return gen(**kwargs)


@dataclass
class WorkloadReport:
    workload: str
    num_requests: int
    wall_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_tokens: int            # tokens actually computed by prefills (after cache hits)
    cache_hit_rate: float          # cached / admitted prompt tokens
    retractions: int
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_mean: float
    itl_ms_p50: float
    itl_ms_p99: float
    outputs: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def output_tok_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def total_tok_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "outputs"}
        d.update(output_tok_per_s=self.output_tok_per_s, total_tok_per_s=self.total_tok_per_s)
        return d


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def run_workload(engine: Any, workload: Workload, max_steps: int = 10_000_000) -> WorkloadReport:
    """Drive ``engine`` until every request of the workload (and its follow-ups) is done."""
    sched = engine.scheduler
    stats0 = (sched.stats.prompt_tokens, sched.stats.cached_tokens, sched.stats.prefill_tokens,
              sched.stats.retractions)
    pending = sorted(workload.items, key=lambda it: it.arrival_s)
    by_rid: dict[str, WorkItem] = {}
    done: list[Req] = []
    spawned: list[WorkItem] = []

    def on_finish(req: Req) -> None:
        item = by_rid.pop(req.rid, None)
        if item is None:
            return
        done.append(req)
        assert req.finished_reason is not None          # on_finish: a finished request
        if item.followups is not None and req.finished_reason.kind is not FinishKind.ABORT:
            spawned.extend(item.followups(item, list(req.output_ids)))

    def submit(item: WorkItem) -> None:
        req = sched.make_req(item.prompt_ids, item.params)
        req.tag = item.tag
        by_rid[req.rid] = item
        sched.submit(req)

    sched.take_finished()
    t0 = time.perf_counter()
    steps = 0
    while pending or spawned or by_rid:
        now = time.perf_counter() - t0
        while pending and pending[0].arrival_s <= now:
            submit(pending.pop(0))
        while spawned:
            submit(spawned.pop(0))
        if sched.is_idle() and pending:
            time.sleep(max(0.0, pending[0].arrival_s - (time.perf_counter() - t0)))
            continue
        engine.step()
        for req in sched.take_finished():      # finished this step (their follow-ups next step)
            on_finish(req)
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"workload not done after {max_steps} steps")
    while not sched.is_idle():
        engine.step()
    wall = time.perf_counter() - t0
    sched.take_finished()
    ttft = np.array([(r.first_token_ns - r.arrival_ns) / 1e6 for r in done if r.first_token_ns])
    itl = np.concatenate([np.diff(np.asarray(r.token_ns, dtype=np.int64)) / 1e6 for r in done]
                         + [np.zeros(0)])
    st = sched.stats
    prompt_adm, cached = st.prompt_tokens - stats0[0], st.cached_tokens - stats0[1]
    return WorkloadReport(
        workload=workload.name, num_requests=len(done), wall_s=wall,
        prompt_tokens=sum(len(r.origin_input_ids) for r in done),
        output_tokens=sum(len(r.output_ids) for r in done),
        prefill_tokens=st.prefill_tokens - stats0[2],
        cache_hit_rate=cached / prompt_adm if prompt_adm else 0.0,
        retractions=st.retractions - stats0[3],
        ttft_ms_mean=float(ttft.mean()) if len(ttft) else 0.0, ttft_ms_p50=_pct(ttft, 50),
        ttft_ms_p99=_pct(ttft, 99), itl_ms_mean=float(itl.mean()) if len(itl) else 0.0,
        itl_ms_p50=_pct(itl, 50), itl_ms_p99=_pct(itl, 99),
        outputs={r.tag or r.rid: list(r.output_ids) for r in done})
