"""ModelRunner: the model, its attention backend and graph runner; one forward per step.

``forward(fb)`` returns the logits of each request's last new token. Decode batches that fit a
captured size replay a CUDA graph (``run.graph_replay`` with ``bs``/``padded_bs``); everything
else runs eagerly (``run.eager`` with ``reason``). Attention metadata is built inside
``prep.batch`` (``part=attn``). On CUDA with probes on, both run ranges get a ``device_ns``
attribute (ns) from the worker's ``DeviceTimer`` (``tp.timer``, shared with the collectives), filled
in once its events complete (``resolve_device_times``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from srtscope.engine.attention.factory import create_attention_backend
from srtscope.engine.config import EngineConfig, ModelConfig
from srtscope.engine.forward_batch import ForwardBatch, ForwardMode
from srtscope.engine.mem.kv_pool import KVPool, resolve_dtype
from srtscope.engine.model.parallel import TPState
from srtscope.engine.model.weights import build_model
from srtscope.engine.runner.graph_runner import GraphRunner, capture_bs_list
from srtscope.probes.ranges import is_enabled, stage

logger = logging.getLogger("srtscope.engine")


@dataclass
class GenerationBatchResult:
    """One forward's output (the runner fills all but ``next_token_ids``, the worker's sampler
    that). Token layout: row i of each tensor is row i of the ForwardBatch (``reqs[i]`` of the
    launched batch); a row outside ``sample_rows`` (a chunk) carries a token nobody uses."""

    logits: torch.Tensor                          # [bs, vocab] float32: each row's last new token
    graph_used: bool = False
    eager_reason: str | None = None               # an EagerReason value (probes/stages.py)
    padded_bs: int = 0                            # rows the graph ran (>= bs); eager: bs
    next_token_ids: torch.Tensor | None = None    # [bs] int64 on the device, not synced


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, tp: TPState,
                 device: torch.device, kv_pool: KVPool, capture_graphs: bool = True) -> None:
        self.config = config
        self.model_config = model_config
        self.tp = tp
        self.device = device
        self.kv_pool = kv_pool
        self.dtype = resolve_dtype(model_config.dtype)
        self.model = build_model(model_config, tp, device)
        self.attn_backend, self.attn_backend_reason = create_attention_backend(
            config.attention_backend, kv_pool, self.model.num_local_heads,
            self.model.num_local_kv_heads, model_config.head_dim, device, self.dtype,
            graph_width=config.context_length)
        self.attention_backend_name = self.attn_backend.name
        logger.info("rank %d: attention backend %s (%s)", tp.rank, self.attention_backend_name,
                    self.attn_backend_reason)
        self.timer = tp.timer     # one DeviceTimer for the run ranges and the collectives
        self._timed = device.type == "cuda"
        on_cuda = device.type == "cuda"
        self.graph_runner = GraphRunner(
            self, capture_bs_list(config.cuda_graph_max_bs, config.max_running_requests),
            disabled=config.disable_cuda_graph, on_cuda=on_cuda, capture=capture_graphs)

    # ------------------------------------------------------------------ model
    def run_model(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits ``[bs, vocab]`` of each request's last new token (metadata already set)."""
        hidden = self.model(fb.input_ids, fb.positions, fb, self.attn_backend)
        if fb.forward_mode.is_extend_like:
            hidden = hidden[self._last_token_index(fb)]
        return self.model.compute_logits(hidden)

    def _last_token_index(self, fb: ForwardBatch) -> torch.Tensor:
        if len(fb.extend_seq_lens_cpu) == fb.batch_size:
            ends, acc = [], 0
            for n in fb.extend_seq_lens_cpu:
                acc += n
                ends.append(acc - 1)
            return torch.tensor(ends, dtype=torch.int64).to(self.device, non_blocking=True)
        assert fb.extend_seq_lens is not None           # extend/mixed batches carry them
        return torch.cumsum(fb.extend_seq_lens.to(self.device, torch.int64), 0) - 1

    # ------------------------------------------------------------------ one step
    def forward(self, fb: ForwardBatch) -> GenerationBatchResult:
        self.resolve_device_times()
        bs = fb.batch_size
        if fb.forward_mode == ForwardMode.IDLE:
            return self._forward_idle(fb)
        gr = self.graph_runner
        ok, reason = gr.can_run(fb)
        if ok:
            with stage("prep.batch", part="attn", bs=bs):
                pfb = gr.prepare_replay(fb)
            with stage("run.graph_replay", bs=bs, padded_bs=pfb.batch_size) as r:
                with self._device_timed(r.attrs):
                    logits = gr.replay(pfb, bs)
            return GenerationBatchResult(logits, True, None, pfb.batch_size)
        return GenerationBatchResult(self.forward_eager(fb, reason), False, reason, bs)

    def forward_eager(self, fb: ForwardBatch, reason: str | None = None) -> torch.Tensor:
        with stage("prep.batch", part="attn", bs=fb.batch_size):
            self.attn_backend.init_forward_metadata(fb)
        with stage("run.eager", bs=fb.batch_size, reason=reason) as r:
            with self._device_timed(r.attrs):
                return self.run_model(fb)

    def _forward_idle(self, fb: ForwardBatch) -> GenerationBatchResult:
        vocab = self.model_config.vocab_size
        if self.tp.size > 1:
            # every rank joins the same collectives, with zero tokens
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            idle = ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty, empty,
                                fb.req_to_token, empty)
            self.attn_backend.init_forward_metadata(idle)
            hidden = self.model(empty, empty, idle, self.attn_backend)
            logits = self.model.compute_logits(hidden)
        else:
            logits = torch.empty(0, vocab, dtype=torch.float32, device=self.device)
        return GenerationBatchResult(logits, False, None, 0)

    # ------------------------------------------------------------------ device timing
    def _device_timed(self, attrs: dict):
        """The timer's context for a run range's attributes (a no-op off CUDA or with probes off)."""
        return self.timer.measure(attrs=attrs if (self._timed and is_enabled()) else None)

    def resolve_device_times(self, synchronize: bool = False) -> None:
        """Fill ``device_ns`` into finished ranges — run and collectives (never blocks unless
        ``synchronize``)."""
        self.timer.collect(synchronize)
