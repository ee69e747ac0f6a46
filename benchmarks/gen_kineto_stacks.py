"""Generate a PyTorch-profiler (Kineto) trace with Python stacks, shaped like a vLLM server capture.

    .venv/bin/python benchmarks/gen_kineto_stacks.py --events 6800000 OUT.json.gz [--frames 30] [--seed 0]

What ``torch.profiler`` with ``with_stack=True`` writes for a decode loop (the layout of a real
export: one event over several indented lines, ``args`` last): per engine step a ``ProfilerStep#N``
user annotation and an ``execute_model`` stage range; per layer and op a stack of ``--frames``
nested ``python_function`` frames (``file.py(line): func``, ``Python id`` / ``Python parent id``),
the ``aten::*`` ``cpu_op`` inside it, its ``cudaLaunchKernel`` (``args.correlation``), the
``ac2g`` flow pair and the kernel on stream 7. Timestamps are epoch microseconds with nanosecond
decimals (``1700000000000123.456``), as torch >= 2.3 writes them. With the default 30 frames an op,
~94% of the events are ``python_function`` (a real vLLM capture: 97%). Steps now and then stall on
the host (a scheduler stall), so the diagnosis has something to find.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

PID, TID, DEV, STREAM = 1617, 1617, 0, 7
KERNELS = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
           "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
           "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u>",
           "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, float, int, int)"]
OPS = ["aten::add", "aten::mm", "vllm::unified_attention", "vllm::rms_norm"]
FILES = ["vllm/v1/engine/core.py", "vllm/v1/worker/gpu_model_runner.py", "vllm/model_executor/models/llama.py",
         "torch/nn/modules/module.py", "vllm/model_executor/layers/linear.py", "vllm/attention/layer.py",
         "torch/_ops.py", "vllm/model_executor/layers/layernorm.py"]
FUNCS = ["step", "execute_model", "forward", "_call_impl", "_wrapped_call_impl", "apply", "__call__",
         "unified_attention", "forward_cuda", "run_engine_core", "_process_engine_step"]

_X = ('  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
      '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      %s\n    }\n  }')
_FLOW = ('  {\n    "ph": "%s", "id": %d, "pid": %d, "tid": %d, "ts": %.3f,\n'
         '    "cat": "ac2g", "name": "ac2g"%s\n  }')


def generate(out: Path, events: int, frames: int = 30, layers: int = 32, seed: int = 0) -> dict:
    """Write the trace; returns what it holds (events, steps, bytes, seconds)."""
    from isal import igzip  # fast to write 20 M events; any gzip reader reads it

    rng = np.random.default_rng(seed)
    names = [f"{FILES[i % len(FILES)]}({100 + 7 * i}): {FUNCS[i % len(FUNCS)]}" for i in range(4 * frames)]
    per_op = frames + 5
    per_step = 2 + layers * len(OPS) * per_op
    steps = max(1, events // per_step)
    t = 1_700_000_000_000_000.0          # epoch µs
    corr = ext = pyid = 1
    n = 0
    t0 = time.perf_counter()
    with igzip.open(out, "wb", compresslevel=1) as fh:
        fh.write(b'{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": 0, "name": '
                 b'"NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,\n      "computeMajor": 9, '
                 b'"computeMinor": 0, "numSms": 132\n    }\n  ],\n  "cuda_runtime_version": 12040,\n'
                 b'  "with_stack": 1,\n  "traceEvents": [\n')
        first = True
        for step in range(steps):
            evs: list[str] = []
            stall = rng.uniform(60, 150) * (10 if step % 23 == 7 else 1)
            step_start = t
            h = t + stall
            g = h + 20.0
            ex_start = h
            for _layer in range(layers):
                for k, (op, kn) in enumerate(zip(OPS, KERNELS)):
                    op_dur = rng.uniform(8, 20)
                    base = (k * frames) % (len(names) - frames)
                    for f in range(frames):        # the Python stack around the op, outermost first
                        evs.append(_X % ("python_function", names[base + f], PID, TID, h + 0.01 * f,
                                         op_dur + 2.0 - 0.02 * f,
                                         f'"Python parent id": {pyid - 1 if f else 0}, "Python id": {pyid}, '
                                         f'"Ev Idx": {n + len(evs)}'))
                        pyid += 1
                    oh = h + 0.01 * frames + 0.2
                    evs.append(_X % ("cpu_op", op, PID, TID, oh, op_dur,
                                     f'"External id": {ext}, "Record function id": 0, "Ev Idx": {n + len(evs)}'))
                    ls = oh + rng.uniform(1, 2)
                    ld = rng.uniform(3, 6)
                    evs.append(_X % ("cuda_runtime", "cudaLaunchKernel", PID, TID, ls, ld,
                                     f'"External id": {ext}, "cbid": 211, "correlation": {corr}'))
                    kd = rng.uniform(10, 60) if k in (1, 2) else rng.uniform(2, 8)
                    ks = max(g + rng.uniform(0.8, 1.5), ls + 2.5)
                    evs.append(_FLOW % ("s", corr, PID, TID, ls, ""))
                    evs.append(_X % ("kernel", kn, DEV, STREAM, ks, kd,
                                     f'"External id": {ext}, "queued": 0, "device": {DEV}, "context": 1, '
                                     f'"stream": {STREAM}, "correlation": {corr}, "registers per thread": 64, '
                                     f'"shared memory": 0, "grid": [132, 1, 1], "block": [256, 1, 1]'))
                    evs.append(_FLOW % ("f", corr, DEV, STREAM, ks, ', "bp": "e"'))
                    g = ks + kd
                    h += op_dur + 2.5
                    corr += 1
                    ext += 1
            end = max(h, g) + rng.uniform(5, 15)
            evs.append(_X % ("user_annotation", "execute_model", PID, TID, ex_start, end - ex_start - 1,
                             f'"External id": {ext}'))
            evs.append(_X % ("user_annotation", f"ProfilerStep#{step}", PID, TID, step_start, end - step_start,
                             f'"External id": {ext + 1}'))
            ext += 2
            t = end + rng.uniform(5, 15)
            fh.write((("" if first else ",\n") + ",\n".join(evs)).encode())
            first = False
            n += len(evs)
        fh.write(b'\n  ],\n  "traceName": "gen_kineto_stacks",\n  "displayTimeUnit": "ms",\n'
                 b'  "baseTimeNanoseconds": 0\n}\n')
    return {"path": str(out), "events": n, "steps": steps, "bytes": out.stat().st_size,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--frames", type=int, default=30, help="python_function frames around each op")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    print(generate(args.out, args.events, args.frames, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
