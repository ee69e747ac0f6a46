"""TpModelWorker: one tensor-parallel rank's model, KV pool, tokenizer and sampler.

The scheduler (``engine/scheduler``) builds a ``ForwardBatch`` per step and calls
``forward_batch_generation``; the worker writes this step's K/V at ``fb.out_cache_loc``, reads each
request's context through ``fb.req_to_token`` and returns one ``GenerationBatchResult``
(runner/model_runner.py) with the sampled next tokens, one per batch row — on the device, not synced:
the caller decides when to wait for them (``sync.wait``).
"""
from __future__ import annotations

import dataclasses

import torch

from srtscope.engine.config import EngineConfig, ModelConfig
from srtscope.engine.forward_batch import ForwardBatch, ForwardMode
from srtscope.engine.mem.kv_pool import KVPool, resolve_dtype
from srtscope.engine.model.parallel import TPState
from srtscope.engine.model.weights import model_config_from_hf
from srtscope.engine.runner.model_runner import GenerationBatchResult, ModelRunner
from srtscope.engine.runner.sampler import Sampler
from srtscope.engine.tokenizer import get_tokenizer
from srtscope.probes.cuda_timer import DeviceTimer

__all__ = ["GenerationBatchResult", "TpModelWorker", "resolve_model_config"]


def resolve_model_config(config: EngineConfig) -> ModelConfig:
    """The model config in force: ``config.model``, with the architecture of ``weights_path``'s
    ``config.json`` when one is given (checked against the TP size and context length)."""
    mc = config.model
    if mc.weights_path:
        mc = model_config_from_hf(mc.weights_path, mc)
        dataclasses.replace(config, model=mc)   # re-runs EngineConfig validation (ValueError)
    return mc


class TpModelWorker:
    def __init__(self, config: EngineConfig, rank: int = 0, tp_size: int = 1, group=None) -> None:
        self.config = config
        self.rank = rank
        self.tp_size = tp_size
        self.model_config = resolve_model_config(config)
        mc = self.model_config
        if mc.vocab_size % tp_size or mc.num_kv_heads % tp_size or mc.num_heads % tp_size:
            raise ValueError(f"tp_size: {tp_size} must divide vocab_size, num_heads and num_kv_heads")
        dev = config.resolved_device()
        if dev == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("device: cuda requested but CUDA is not available")
            self.device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if tp_size > 1 and group is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                raise ValueError("tp_size: > 1 needs torch.distributed initialised (or a group)")
        inj = config.inject
        self.tp = TPState(rank=rank, size=tp_size, group=group,
                          straggler_rank=inj.straggler_rank, straggler_us=inj.straggler_us,
                          timer=DeviceTimer(enabled=self.device.type == "cuda"))
        self.dtype = resolve_dtype(mc.dtype)
        self.kv_pool = KVPool(config.kv_pool_size, mc.num_layers, mc.num_kv_heads // tp_size,
                              mc.head_dim, self.dtype, self.device)
        self.tokenizer = get_tokenizer(mc)
        with torch.no_grad():
            self.model_runner = ModelRunner(config, mc, self.tp, self.device, self.kv_pool)
        self.sampler = Sampler(seed=config.seed, device=self.device)

    @property
    def attention_backend(self) -> str:
        return self.model_runner.attention_backend_name

    @property
    def attention_backend_reason(self) -> str:
        return self.model_runner.attn_backend_reason

    @property
    def graph_capture_bs(self) -> list[int]:
        gr = self.model_runner.graph_runner
        return sorted(gr.graphs) if gr.graphs else []

    def forward_batch_generation(self, fb: ForwardBatch) -> GenerationBatchResult:
        with torch.no_grad():
            out = self.model_runner.forward(fb)
            if fb.forward_mode == ForwardMode.IDLE or fb.batch_size == 0:
                ids = torch.empty(0, dtype=torch.int64, device=self.device)
            else:
                ids = self.sampler.sample(out.logits, fb.sampling)
        out.next_token_ids = ids
        return out

    def resolve_device_times(self, synchronize: bool = False) -> None:
        self.model_runner.resolve_device_times(synchronize)
