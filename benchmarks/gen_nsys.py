"""Generate a realistic nsys-schema SQLite export of about N MB for the reader benchmark.

    python benchmarks/gen_nsys.py --size-mb 100 /tmp/srtscope_100mb.sqlite

Shape of an LLM decode loop on one GPU: engine steps of ~200 kernels (a few hundred distinct,
long template names), each launched by a correlated runtime/driver call from the scheduler
thread, NVTX stage ranges per step (``loop.step``, ``sched.schedule``, ``prep.batch``,
``run.eager``, ``sched.result``) in the ``srtscope`` domain, H2D/D2H copies and a stream sync.
``--gpus N``: a TP node captured into one file: N processes (ranks, in pid order), one GPU each,
running the same steps, rank g ``RANK_SKEW_NS`` x g behind rank 0 (steps back to back and skewed:
no instant with no rank inside a step).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sample_traces.nsys_schema import NsysWriter  # noqa: E402

PID, TID = 4242, 4243
RANK_SKEW_NS = 3_000
KERNELS_PER_STEP = 200
STEPS_PER_BATCH = 500
#: the shape's version, in a cached export's name (``cached_name``): an export of an older shape is
#: made again, not reused (2: each step waits for its kernels, step numbers run on across batches)
SHAPE_VERSION = 2


def cached_name(size_mb: float, gpus: int = 1) -> str:
    """The file name a benchmark keeps the ~``size_mb`` MB export of this shape (of ``gpus`` ranks) under."""
    ranks = "" if gpus == 1 else f"_{gpus}gpu"
    return f"nsys_{size_mb:g}mb{ranks}.v{SHAPE_VERSION}.sqlite"


def kernel_names(rng: np.random.Generator, n: int = 320) -> np.ndarray:
    bases = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>,"
             " std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
             "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
             "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u>",
             "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, float, int, int)",
             "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>"]
    return np.array([f"{bases[i % len(bases)]}_{i}" for i in range(n)], dtype=object)


def write_batch(w: NsysWriter, rng: np.random.Generator, names: np.ndarray, t0: int,
                corr0: int, gpu: int = 0, steps: int = STEPS_PER_BATCH, step0: int = 0) -> tuple[int, int]:
    """One batch of steps (numbered from ``step0``) starting at ``t0`` on ``gpu`` (its own
    process); returns (next t0, next correlation id). Each step ends with a stream sync, so the next
    one starts when the device has run all of its kernels: the steps follow each other, never overlap."""
    pid, tid = _pid(gpu)
    kps = KERNELS_PER_STEP
    n = steps * kps
    launch_dur = rng.integers(3_000, 8_000, n).reshape(steps, kps)
    gap = rng.integers(500, 2_000, n).reshape(steps, kps)
    step_host_ns = 300_000                                   # scheduling + prep before launches
    in_step = np.tile(np.arange(kps), steps)
    # per step, times from its start: the launches back to back after the host's preparation
    per_step_launch = launch_dur + gap
    l_start = step_host_ns + np.cumsum(per_step_launch, axis=1) - per_step_launch
    l_end = l_start + launch_dur
    k_dur = rng.integers(4_000, 60_000, n).reshape(steps, kps)
    # one FIFO stream, idle at the step's start (the last step's sync drained it):
    # end_i = max(ready_i, end_{i-1}) + dur_i, solved in closed form (max-plus)
    ready = l_end + 2_500
    cum = np.cumsum(k_dur, axis=1)
    k_end = np.maximum.accumulate(ready - (cum - k_dur), axis=1) + cum
    d2h = np.maximum(k_end[:, -1], l_end[:, -1]) + 1_000     # the result copy after the last kernel
    step_len = d2h + 20_000
    step_start = t0 + np.concatenate([[0], np.cumsum(step_len)[:-1]])
    at = step_start[:, None]
    l_start, l_end, k_end = (l_start + at).reshape(-1), (l_end + at).reshape(-1), (k_end + at).reshape(-1)
    k_dur = k_dur.reshape(-1)
    k_start = k_end - k_dur
    corr = corr0 + np.arange(n)
    kn = names[rng.integers(0, len(names), n)]
    api_names = np.where(in_step % 9 == 0, "cuLaunchKernel", "cudaLaunchKernel_v7000")
    w.add_runtime(l_start, l_end, api_names, pid=pid, tid=tid, correlation=corr)
    w.add_kernels(k_start, k_end, kn, device=gpu, stream=7, pid=pid, correlation=corr)
    # per step: H2D input copy, D2H result copy, a stream sync
    c_corr = corr0 + n + np.arange(steps * 3).reshape(steps, 3)
    h2d_s = step_start + 250_000
    w.add_runtime(h2d_s, h2d_s + 6_000, ["cudaMemcpyAsync_v3020"] * steps, pid=pid, tid=tid,
                  correlation=c_corr[:, 0])
    w.add_memcpy(h2d_s + 7_000, h2d_s + 9_000, bytes=65_536, copy_kind=1, device=gpu, pid=pid,
                 correlation=c_corr[:, 0])
    d2h_s = step_start + d2h
    w.add_runtime(d2h_s - 500, d2h_s + 5_000, ["cudaMemcpyAsync_v3020"] * steps, pid=pid, tid=tid,
                  correlation=c_corr[:, 1])
    w.add_memcpy(d2h_s, d2h_s + 3_000, bytes=1_024, copy_kind=2, device=gpu, pid=pid, correlation=c_corr[:, 1])
    w.add_runtime(d2h_s + 5_100, d2h_s + 9_000, ["cudaStreamSynchronize_v3020"] * steps, pid=pid,
                  tid=tid, correlation=c_corr[:, 2])
    step_end = step_start + step_len
    bs = rng.integers(1, 256, steps)
    w.add_nvtx(step_start, step_end, [f"loop.step step={i} mode=decode bs={b}"
                                      for i, b in zip(range(step0, step0 + steps), bs.tolist())],
               pid=pid, tid=tid, domain="srtscope")
    w.add_nvtx(step_start + 1_000, step_start + 150_000, [f"sched.schedule bs={b}" for b in bs.tolist()],
               pid=pid, tid=tid, domain="srtscope")
    w.add_nvtx(step_start + 151_000, step_start + 290_000, ["prep.batch"] * steps, pid=pid, tid=tid,
               domain="srtscope")
    first_l = l_start.reshape(steps, kps)[:, 0]
    w.add_nvtx(first_l - 100, d2h_s - 600, ["run.eager reason=bs_over_max"] * steps, pid=pid,
               tid=tid, domain="srtscope")
    w.add_nvtx(d2h_s + 9_500, step_end - 100, ["sched.result"] * steps, pid=pid, tid=tid,
               domain="srtscope")
    return int(max(step_end.max(), k_end.max())) + 100_000, int(c_corr.max()) + 1


def _pid(gpu: int) -> tuple[int, int]:
    """(pid, scheduler tid) of the process driving ``gpu``."""
    return PID + 10 * gpu, TID + 10 * gpu


def generate(out: Path, size_mb: float, seed: int = 0, gpus: int = 1, batch_steps: int = STEPS_PER_BATCH) -> dict:
    rng = np.random.default_rng(seed)
    names = kernel_names(rng)
    t0, corr = 1_000_000_000, 1
    target = size_mb * 1e6
    t_begin = time.perf_counter()
    batches = 0
    with NsysWriter(out, version="2025.3.1") as w:
        for g in range(gpus):
            w.add_gpu(g, "NVIDIA H100 80GB HBM3", sm_count=132)
            w.add_process(_pid(g)[0], "python")
            w.add_thread(*_pid(g), "scheduler")
        while True:
            # every rank runs the same steps (one draw), each a skew behind the one before
            seed_b = int(rng.integers(0, 2**31)) if gpus > 1 else 0
            ends = []
            for g in range(gpus):
                draw = np.random.default_rng(seed_b) if gpus > 1 else rng   # one GPU: the draws as ever
                end, corr = write_batch(w, draw, names, t0 + g * RANK_SKEW_NS, corr, g, batch_steps,
                                        batches * batch_steps)
                ends.append(end)
            t0 = max(ends)
            batches += 1
            w.flush()
            if out.stat().st_size >= target:
                break
    return {"path": str(out), "bytes": out.stat().st_size,
            "kernels": batches * batch_steps * KERNELS_PER_STEP * gpus,
            "seconds": round(time.perf_counter() - t_begin, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, required=True, help="approximate output size (MB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpus", type=int, default=1, help="ranks (one GPU each) in the one file")
    ap.add_argument("--batch-steps", type=int, default=STEPS_PER_BATCH, help="steps written at a time")
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.size_mb <= 0:
        ap.error("--size-mb must be > 0")
    if a.gpus < 1 or a.batch_steps < 1:
        ap.error("--gpus and --batch-steps must be >= 1")
    print(generate(a.out, a.size_mb, a.seed, a.gpus, a.batch_steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
