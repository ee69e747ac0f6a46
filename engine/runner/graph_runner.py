"""CUDA graph runner for decode batches.

Capture sizes follow SGLang's default — 1, 2, 4, 8, then every 8 up to 256 — capped by
``cuda_graph_max_bs`` (and trimmed past the first size that holds ``max_running_requests``).
A decode batch of ``bs`` requests replays the graph of the next captured size: padded rows read
token 0 at position 0 with ``seq_len`` 1 and write their K/V into the reserved dummy slot 0; the
logits are sliced back to ``bs`` rows. Everything else runs eagerly, with the reason:

- ``no_cuda``: not on a CUDA device (nothing is captured; every step on the CPU);
- ``disabled``: ``disable_cuda_graph``;
- ``extend``: an extend or mixed batch (graphs are decode-only);
- ``bs_over_max``: more requests than the largest captured size.
"""
from __future__ import annotations

import bisect
from typing import Any

import torch

from srtscope.engine.forward_batch import ForwardBatch, ForwardMode
from srtscope.probes.stages import EagerReason

DEFAULT_CAPTURE_BS: list[int] = [1, 2, 4, 8] + list(range(16, 257, 8))


def capture_bs_list(cuda_graph_max_bs: int, max_running_requests: int | None = None) -> list[int]:
    sizes = [b for b in DEFAULT_CAPTURE_BS if b <= cuda_graph_max_bs]
    if max_running_requests is not None:
        trimmed = []
        for b in sizes:
            trimmed.append(b)
            if b >= max_running_requests:
                break
        sizes = trimmed
    return sizes


class GraphRunner:
    def __init__(self, model_runner: Any, capture_bs: list[int], disabled: bool, on_cuda: bool,
                 capture: bool = True) -> None:
        self.mr = model_runner
        self.capture_bs = sorted(capture_bs)
        self.max_bs = self.capture_bs[-1] if self.capture_bs else 0
        self.disabled = disabled
        self.on_cuda = on_cuda
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool: Any = None                  # the graphs' shared memory pool, after the first capture
        if on_cuda and not disabled and self.capture_bs and capture:
            self.capture()

    # ------------------------------------------------------------------ decisions (pure)
    def classify(self, mode: ForwardMode, bs: int) -> tuple[bool, str | None]:
        """Whether a batch could replay a graph, ignoring whether CUDA exists."""
        if self.disabled:
            return False, EagerReason.DISABLED.value
        if mode != ForwardMode.DECODE:
            return False, EagerReason.EXTEND.value
        if not self.capture_bs or bs > self.max_bs:
            return False, EagerReason.BS_OVER_MAX.value
        return True, None

    def can_run(self, fb: ForwardBatch) -> tuple[bool, str | None]:
        if not self.on_cuda:
            return False, EagerReason.NO_CUDA.value
        ok, reason = self.classify(fb.forward_mode, fb.batch_size)
        if ok and fb.batch_size not in self.graphs and self.padded_size(fb.batch_size) not in self.graphs:
            return False, EagerReason.DISABLED.value   # capture failed or skipped
        return ok, reason

    def padded_size(self, bs: int) -> int:
        """The smallest captured size >= bs."""
        i = bisect.bisect_left(self.capture_bs, bs)
        if i >= len(self.capture_bs):
            raise ValueError(f"bs: {bs} is above the largest captured size {self.max_bs}")
        return self.capture_bs[i]

    # ------------------------------------------------------------------ CUDA capture / replay
    def capture(self) -> None:
        mr = self.mr
        self.alloc_static()
        mr.tp.in_graph_capture = True
        try:
            with torch.no_grad():
                for bs in reversed(self.capture_bs):   # largest first: later ones reuse its pool
                    fb = self._static_batch(bs, self.dummy_req_to_token)
                    mr.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
                    self.graphs[bs], self.outputs[bs] = self._capture_one(fb)
            self._finish_capture()
        finally:
            mr.tp.in_graph_capture = False

    def alloc_static(self) -> None:
        """The static inputs every graph reads (``max_bs`` rows, sliced per size) and the attention
        backend's graph state; ``prepare_replay`` refills them before each replay."""
        mr = self.mr
        dev = mr.device
        max_bs = self.max_bs
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.dummy_req_to_token = torch.zeros(1, 1, dtype=torch.int32, device=dev)
        mr.attn_backend.init_cuda_graph_state(max_bs)

    def _capture_one(self, fb: ForwardBatch) -> tuple[Any, torch.Tensor]:
        """Warm up, then capture ``run_model`` on the static batch; (graph, static output)."""
        mr = self.mr
        dev = mr.device
        if getattr(self, "_stream", None) is None:
            self._stream = torch.cuda.Stream(device=dev)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):   # kernels' lazy init / autotuning outside the graph
                mr.run_model(fb)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = mr.run_model(fb)
        if self.pool is None:
            self.pool = graph.pool()
        return graph, out

    def _finish_capture(self) -> None:
        torch.cuda.synchronize(self.mr.device)

    def _static_batch(self, bs: int, req_to_token: torch.Tensor) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=self.input_ids[:bs],
            positions=self.positions[:bs], seq_lens=self.seq_lens[:bs],
            req_pool_indices=self.req_pool_indices[:bs], req_to_token=req_to_token,
            out_cache_loc=self.out_cache_loc[:bs], seq_lens_cpu=[1] * bs)

    def prepare_replay(self, fb: ForwardBatch) -> ForwardBatch:
        """Copy ``fb`` into the static buffers, pad to the next captured size, and refresh the
        attention metadata. Padding rows read token 0 at position 0 with ``seq_len`` 1, request row
        0, and write their K/V into the dummy slot 0 — whatever a larger earlier batch left there."""
        bs = fb.batch_size
        if fb.forward_mode != ForwardMode.DECODE:
            raise ValueError("forward_mode: only decode batches replay a graph")
        pbs = self.padded_size(bs)
        self.input_ids[:bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:bs].copy_(fb.positions, non_blocking=True)
        self.seq_lens[:bs].copy_(fb.seq_lens, non_blocking=True)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices, non_blocking=True)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc, non_blocking=True)
        if pbs > bs:
            self.input_ids[bs:pbs].zero_()
            self.positions[bs:pbs].zero_()
            self.seq_lens[bs:pbs].fill_(1)
            self.req_pool_indices[bs:pbs].zero_()
            self.out_cache_loc[bs:pbs].zero_()
        pfb = self._static_batch(pbs, fb.req_to_token)
        pfb.seq_lens_cpu = (list(fb.seq_lens_cpu) + [1] * (pbs - bs)) if fb.seq_lens_cpu else []
        self.mr.attn_backend.init_forward_metadata_replay_cuda_graph(pbs, pfb)
        return pfb

    def replay(self, pfb: ForwardBatch, bs: int) -> torch.Tensor:
        pbs = pfb.batch_size
        self.graphs[pbs].replay()
        return self.outputs[pbs][:bs].clone()
