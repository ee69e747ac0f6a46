"""Engine throughput vs. a naive baseline on the same model, plus host time per decode step.

    python -m benchmarks.engine_throughput [--requests 64] [--system-len 128] [--max-new 16]

1. Tokens/s on a shared-prefix workload (one system prompt, many users): the engine (radix cache,
   continuous batching, chunked prefill; normal and overlap loops) vs. a naive loop on the same
   worker — static batches, no KV reuse: every token recomputes the full sequence. Target >= 3x.
   The greedy outputs of both must agree (printed as a match rate).
2. The engine's prefix-cache hit rate on that workload.
3. Host time per decode step spent in scheduling + preparation + result processing
   (``sched.recv`` + ``sched.schedule`` + ``prep.batch`` + ``sched.result``, main thread) at
   bs 1, 8, 32, from the probe ranges. Target < 0.5 ms at bs 32. Time is exclusive — the
   innermost stage range wins, as in the analyzers: slot allocation (``prep.batch part=alloc``,
   nested in ``sched.schedule``) counts as prep only, never twice.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

from srtscope import probes
from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.req_to_token import ReqToTokenPool
from srtscope.engine.request import Req
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.schedule_batch import ScheduleBatch
from srtscope.engine.workloads import WorkItem, run_workload, shared_prefix
from srtscope.probes.recorder import get_recorder
from srtscope.probes.stages import Stage


def naive_generate(worker: TpModelWorker, items: list[WorkItem], static_bs: int,
                   context_length: int) -> tuple[list[list[int]], float]:
    """Static batches; each new token recomputes every request's full sequence (prefix 0)."""
    pool = ReqToTokenPool(static_bs, context_length, worker.device)
    alloc = TokenSlotAllocator(worker.kv_pool.size - 1)
    outs: list[list[int]] = []
    t0 = time.perf_counter()
    for b in range(0, len(items), static_bs):
        group = items[b:b + static_bs]
        reqs = [Req(list(it.prompt_ids), it.params) for it in group]
        steps = max(r.max_new_tokens for r in reqs)
        for _ in range(steps):
            batch = ScheduleBatch(list(reqs), ForwardMode.EXTEND)
            for i, r in enumerate(reqs):
                r.req_pool_idx, r.prefix_len, r.kv_len = i, 0, 0
                r.prefix_indices = None
                r.extend_input_len = r.seq_len
            pool._free = list(range(static_bs))[::-1]
            for _ in reqs:
                pool.alloc()
            total = sum(r.seq_len for r in reqs)
            slots = alloc.alloc(total)
            batch.out_cache_loc = slots
            batch.prefix_lens = [0] * len(reqs)
            batch.extend_lens = [r.seq_len for r in reqs]
            off = 0
            for r in reqs:
                pool.write(r.req_pool_idx, 0, slots[off:off + r.seq_len])
                r.kv_len = r.seq_len
                off += r.seq_len
            fb, writes, _ = batch.to_forward_batch(pool, worker.device, step=0)
            pool.write_device(writes)
            ids = worker.forward_batch_generation(fb).next_token_ids.tolist()
            for r, t in zip(reqs, ids):
                if len(r.output_ids) < r.max_new_tokens:   # static batch: finished rows idle
                    r.output_ids.append(t)
            alloc.free(slots)
        outs += [r.output_ids for r in reqs]
    return outs, time.perf_counter() - t0


def exclusive_ns(spans: list) -> list[int]:
    """Each span's own time (ns): its duration less its direct children's, for spans of one thread
    ordered by start (a child starts and ends inside its parent)."""
    own = [s.dur_ns for s in spans]
    stack: list[int] = []
    for k, s in enumerate(spans):
        while stack and spans[stack[-1]].end_ns <= s.start_ns:
            stack.pop()
        if stack:
            own[stack[-1]] -= s.dur_ns
        stack.append(k)
    return own


def host_per_decode_step(cfg: EngineConfig, worker: TpModelWorker, bs: int,
                         steps: int = 40) -> dict[str, float]:
    """Median µs per decode step at batch size ``bs`` in the scheduler-side stages."""
    c = dataclasses.replace(cfg, max_running_requests=bs, enable_probes=True, enable_overlap=False)
    probes.enable(nvtx=False)
    rec = get_recorder()
    rec.clear()
    with Engine(c, worker=worker) as eng:
        eng.generate([[(7 * i + j) % 256 for j in range(16)] for i in range(bs)],
                     {"max_new_tokens": steps, "ignore_eos": True})
    spans = rec.spans()
    probes.disable()
    rec.clear()
    loops = [s for s in spans if s.name == Stage.LOOP_STEP.value and s.attrs.get("mode") == "decode"
             and s.attrs.get("bs") == bs]
    part_of = {Stage.SCHED_RECV.value: "sched", Stage.SCHED_SCHEDULE.value: "sched",
               Stage.SCHED_RESULT.value: "result"}
    starts = np.array([s.start_ns for s in spans])
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    cols: dict[str, list[float]] = {"sched": [], "prep": [], "result": [], "attn_prep": []}
    for lp in loops:
        lo, hi = np.searchsorted(starts, [lp.start_ns, lp.end_ns])
        inner = [spans[k] for k in order[lo:hi] if spans[k].tid == lp.tid and spans[k] is not lp]
        inner.sort(key=lambda s: (s.start_ns, -s.end_ns))
        acc = dict.fromkeys(cols, 0)
        for s, own in zip(inner, exclusive_ns(inner)):
            if s.name in part_of:
                acc[part_of[s.name]] += own
            elif s.name == Stage.PREP_BATCH.value:
                acc["attn_prep" if s.attrs.get("part") == "attn" else "prep"] += own
        for key in cols:
            cols[key].append(acc[key] / 1000)
    med = {k: statistics.median(v) if v else float("nan") for k, v in cols.items()}
    return {"bs": bs, "steps": len(loops), **{f"{k}_us_p50": v for k, v in med.items()},
            "host_us_p50": statistics.median(
                [a + b + c for a, b, c in zip(cols["sched"], cols["prep"], cols["result"])])
            if loops else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--system-len", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--static-bs", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = EngineConfig(device=args.device, max_running_requests=64, max_total_tokens=16384,
                       enable_probes=False)
    worker = TpModelWorker(cfg)
    spec = dict(num_requests=args.requests, system_len=args.system_len, user_len=(8, 32),
                max_new_tokens=args.max_new, seed=0)

    # warm-up (allocator caches, first-call overheads) on a few requests
    with Engine(cfg, worker=worker) as eng:
        run_workload(eng, shared_prefix(**{**spec, "num_requests": 4}))
    reports = {}
    for name, over in (("engine (normal loop)", False), ("engine (overlap loop)", True)):
        with Engine(dataclasses.replace(cfg, enable_overlap=over), worker=worker) as eng:
            reports[name] = run_workload(eng, shared_prefix(**spec))
            eng.check_invariants()
    items = shared_prefix(**spec).items
    naive_out, naive_s = naive_generate(worker, items, args.static_bs, cfg.context_length)
    naive_tok = sum(len(o) for o in naive_out)
    naive_tps = naive_tok / naive_s
    base = reports["engine (normal loop)"]
    want = [base.outputs[it.tag] for it in items]
    match = sum(a == b for a, b in zip(want, naive_out)) / len(items)

    print(f"\nshared-prefix workload: {args.requests} requests, system prompt {args.system_len} "
          f"tokens, {args.max_new} new tokens each, device={worker.device}")
    print(f"{'run':<26}{'wall_s':>9}{'out_tok/s':>11}{'vs naive':>10}{'hit_rate':>10}"
          f"{'prefill_tok':>13}")
    for name, rep in reports.items():
        print(f"{name:<26}{rep.wall_s:>9.2f}{rep.output_tok_per_s:>11.1f}"
              f"{rep.output_tok_per_s / naive_tps:>9.1f}x{rep.cache_hit_rate:>10.2f}"
              f"{rep.prefill_tokens:>13}")
    print(f"{f'naive (static bs={args.static_bs})':<26}{naive_s:>9.2f}{naive_tps:>11.1f}"
          f"{1.0:>9.1f}x{0.0:>10.2f}{'all, per token':>15}")
    print(f"greedy outputs engine == naive: {match:.0%} of requests")

    print("\nhost time per decode step (sched.recv + sched.schedule + prep.batch + sched.result)")
    print(f"{'bs':>4}{'steps':>7}{'host_us':>9}{'sched_us':>10}{'prep_us':>9}{'result_us':>11}"
          f"{'  (worker attn prep_us)':>24}   medians")
    for bs in (1, 8, 32):
        r = host_per_decode_step(cfg, worker, bs)
        print(f"{r['bs']:>4}{r['steps']:>7}{r['host_us_p50']:>9.1f}{r['sched_us_p50']:>10.1f}"
              f"{r['prep_us_p50']:>9.1f}{r['result_us_p50']:>11.1f}{r['attn_prep_us_p50']:>24.1f}")


if __name__ == "__main__":
    main()
