"""Generate a large, realistic PyTorch-profiler (Kineto) trace for the HTA comparison.

    .venv/bin/python benchmarks/peers/gen_kineto.py --kernels 400000 OUT.json.gz

Shape of a tensor-parallel decode loop on rank 0 of 2, schema of a current PyTorch profiler export:
`ProfilerStep#N` user annotations around each engine step; per step a host-only scheduling gap, an H2D
copy of the batch, then per layer `aten::*` cpu_ops each launching one kernel (`cudaLaunchKernel`,
`args.correlation` on both sides) on the compute stream 7 and an NCCL all-reduce on stream 20 that the
compute stream waits for; a D2H copy and a `cudaStreamSynchronize` close the step. Timestamps are
microseconds with nanosecond decimals (like torch >= 2.3), so HTA's ns rounding applies as on real traces.
Some steps are slowed on the host (scheduler stall) so the idle time is not uniform.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

PID, TID, DEV = 4242, 4243, 0
S_COMP, S_NCCL = 7, 20
KNAMES = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
    "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u>",
    "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, float, int, int)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)",
]
OPS = ["aten::add", "aten::mm", "aten::_flash_attention", "aten::rms_norm", "aten::softmax"]
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _x(cat, name, pid, tid, ts, dur, args):
    return json.dumps({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                       "ts": round(float(ts), 3), "dur": round(float(dur), 3), "args": args},
                      separators=(",", ":"))


def generate(out: Path, kernels: int, layers: int = 24, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    per_step = layers * (len(KNAMES) + 1)
    steps = max(1, kernels // per_step)
    t = 1_700_000_000_000.0          # µs (epoch-like, as Kineto writes)
    corr = 1
    ext = 1
    n_ev = 0
    t0 = time.perf_counter()
    with gzip.open(out, "wt", compresslevel=1) as fh:
        head = {"schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,
                                      "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
                "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
                "cuda_runtime_version": 12040, "with_flops": False, "record_shapes": False}
        fh.write(json.dumps(head)[:-1] + ',\n"traceEvents": [\n')
        first = True
        for step in range(steps):
            evs = []
            host_sched = rng.uniform(40, 120) * (8 if step % 37 == 5 else 1)   # scheduler stall now and then
            step_start = t
            h = t + host_sched                      # host clock
            g = t + 2.0                             # compute stream free from
            # H2D batch copy
            evs.append(_x("cuda_runtime", "cudaMemcpyAsync", PID, TID, h, 6.0,
                          {"External id": ext, "cbid": 41, "correlation": corr}))
            cs = max(g, h + 3.0)
            evs.append(_x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", DEV, S_COMP, cs, 3.2,
                          {"External id": ext, "device": DEV, "context": 1, "stream": S_COMP,
                           "correlation": corr, "bytes": 65536, "memory bandwidth (GB/s)": 20.5}))
            g = cs + 3.2
            h += 8.0
            corr += 1
            ext += 1
            for _layer in range(layers):
                for k, (kn, op) in enumerate(zip(KNAMES, OPS)):
                    op_dur = rng.uniform(6, 14)
                    ldur = rng.uniform(3, 6)
                    evs.append(_x("cpu_op", op, PID, TID, h, op_dur, {"External id": ext}))
                    ls = h + rng.uniform(1, 2)
                    evs.append(_x("cuda_runtime", "cudaLaunchKernel", PID, TID, ls, ldur,
                                  {"External id": ext, "cbid": 211, "correlation": corr}))
                    kd = rng.uniform(4, 40) if k in (1, 2) else rng.uniform(2, 8)
                    ks = max(g + rng.uniform(0.8, 1.5), ls + 2.5)
                    evs.append(_x("kernel", kn, DEV, S_COMP, ks, kd,
                                  {"External id": ext, "queued": 0, "device": DEV, "context": 1,
                                   "stream": S_COMP, "correlation": corr, "registers per thread": 64,
                                   "shared memory": 0, "grid": [132, 1, 1], "block": [256, 1, 1]}))
                    g = ks + kd
                    h += op_dur + rng.uniform(0.5, 2)
                    corr += 1
                    ext += 1
                # tensor-parallel all-reduce on the NCCL stream; compute waits for it
                ldur = rng.uniform(4, 7)
                evs.append(_x("cpu_op", "c10d::allreduce_", PID, TID, h, ldur + 4, {"External id": ext}))
                evs.append(_x("cuda_runtime", "cudaLaunchKernel", PID, TID, h + 2, ldur,
                              {"External id": ext, "cbid": 211, "correlation": corr}))
                nd = rng.uniform(8, 30)
                ns = max(g + 0.5, h + 5)
                evs.append(_x("kernel", NCCL, DEV, S_NCCL, ns, nd,
                              {"External id": ext, "queued": 0, "device": DEV, "context": 1,
                               "stream": S_NCCL, "correlation": corr, "grid": [4, 1, 1], "block": [512, 1, 1]}))
                g = ns + nd
                h += ldur + 6
                corr += 1
                ext += 1
            # D2H of the sampled tokens, host syncs
            evs.append(_x("cuda_runtime", "cudaMemcpyAsync", PID, TID, h, 5.0,
                          {"External id": ext, "cbid": 41, "correlation": corr}))
            cs = max(g + 1.0, h + 3.0)
            evs.append(_x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", DEV, S_COMP, cs, 2.1,
                          {"External id": ext, "device": DEV, "context": 1, "stream": S_COMP,
                           "correlation": corr, "bytes": 1024, "memory bandwidth (GB/s)": 0.5}))
            g = cs + 2.1
            corr += 1
            ext += 1
            sync_start = h + 5.5
            sync_end = max(sync_start + 1.0, g + 1.5)
            evs.append(_x("cuda_runtime", "cudaStreamSynchronize", PID, TID, sync_start, sync_end - sync_start,
                          {"External id": ext, "cbid": 131, "correlation": corr}))
            corr += 1
            ext += 1
            t = sync_end + rng.uniform(5, 15)
            evs.append(_x("user_annotation", f"ProfilerStep#{step}", PID, TID, step_start, t - step_start,
                          {"External id": ext}))
            ext += 1
            fh.write(("" if first else ",\n") + ",\n".join(evs))
            first = False
            n_ev += len(evs)
        fh.write('\n],\n"traceName": "gen_kineto", "displayTimeUnit": "ms", '
                 '"baseTimeNanoseconds": 0}\n')
    return {"path": str(out), "steps": steps, "kernels": steps * per_step, "events": n_ev,
            "bytes": out.stat().st_size, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=400_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    print(generate(args.out, args.kernels, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
