"""Engine and model configuration: frozen dataclasses validated with ValueError."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SchedulePolicy = Literal["fcfs", "lpm"]
AttentionBackendName = Literal["auto", "torch_native", "flashinfer"]
DeviceName = Literal["auto", "cpu", "cuda"]

# Byte-level tokenizer ids: 0..255 are bytes; then the specials.
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258


def _check(cond: bool, field_name: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{field_name}: {message}")


ROPE_TYPES = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling, as HF ``rope_scaling`` / ``rope_parameters`` give it.

    ``linear``: every frequency divided by ``factor``. ``llama3``: wavelengths above
    ``original_max_position_embeddings / low_freq_factor`` (tokens) divided by ``factor``, below
    ``original_max_position_embeddings / high_freq_factor`` kept, smoothly blended in between.
    """

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192    # tokens

    def __post_init__(self) -> None:
        _check(self.rope_type in ROPE_TYPES, "rope_scaling.rope_type",
               f"{self.rope_type!r} is not supported ({', '.join(ROPE_TYPES)})")
        _check(self.factor > 0, "rope_scaling.factor", f"must be > 0, got {self.factor}")
        _check(0 < self.low_freq_factor < self.high_freq_factor, "rope_scaling.low_freq_factor",
               f"need 0 < low_freq_factor < high_freq_factor, got {self.low_freq_factor}, "
               f"{self.high_freq_factor}")
        _check(self.original_max_position_embeddings >= 1, "rope_scaling.original_max_position_embeddings",
               f"must be >= 1, got {self.original_max_position_embeddings}")


DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder (Llama, Qwen2's q/k/v biases, Qwen3's q/k norms and free head size).
    Defaults are a tiny random model small enough for fast CPU runs."""

    vocab_size: int = 320            # >= 259 for the byte tokenizer; divisible by tp sizes 1,2,4,8
    hidden_size: int = 128
    intermediate_size: int = 352
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    head_size: int = 0               # per-head size (HF ``head_dim``); 0 = hidden_size // num_heads
    qkv_bias: bool = False           # biases on q/k/v (Qwen2)
    qk_norm: bool = False            # RMSNorm over each head of q and k before rotary (Qwen3)
    dtype: str = "auto"              # "auto" (the checkpoint's dtype, float32 if random) | DTYPES
    eos_token_ids: tuple[int, ...] = ()  # the checkpoint's EOS ids; () = the tokenizer's
    seed: int = 0                    # random initialisation seed
    weights_path: str | None = None  # local folder with HF-Llama-layout safetensors
    tokenizer_path: str | None = None  # local HF tokenizer folder; None = byte-level

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "max_position"):
            _check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _check(self.head_size >= 0, "head_size", f"must be >= 0 (0: hidden_size // num_heads), got {self.head_size}")
        _check(self.head_size > 0 or self.hidden_size % self.num_heads == 0, "hidden_size",
               f"{self.hidden_size} is not divisible by num_heads={self.num_heads}")
        _check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
               f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}")
        _check(self.dtype == "auto" or self.dtype in DTYPES, "dtype", f"unknown dtype {self.dtype!r}")
        _check(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
        _check(all(0 <= t < self.vocab_size for t in self.eos_token_ids), "eos_token_ids",
               f"{self.eos_token_ids} not all in [0, vocab_size={self.vocab_size})")

    @property
    def head_dim(self) -> int:
        """Per-head size of q, k and v: ``head_size``, or ``hidden_size // num_heads`` when 0."""
        return self.head_size or self.hidden_size // self.num_heads


@dataclass(frozen=True)
class FaultInjection:
    """Extra host delay per step, in microseconds, for demos and ground-truth tests."""

    sched_us: int = 0       # inside sched.schedule
    prep_us: int = 0        # inside prep.batch
    result_us: int = 0      # inside sched.result
    straggler_rank: int = -1  # TP rank that sleeps before each collective (-1: none)
    straggler_us: int = 0

    def __post_init__(self) -> None:
        for name in ("sched_us", "prep_us", "result_us", "straggler_us"):
            _check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")

    @property
    def any(self) -> bool:
        return bool(self.sched_us or self.prep_us or self.result_us or self.straggler_us)


@dataclass(frozen=True)
class EngineConfig:
    """Runtime configuration. KV slots are tokens (page size 1); slot 0 is the reserved dummy."""

    model: ModelConfig = field(default_factory=ModelConfig)
    device: DeviceName = "auto"
    max_running_requests: int = 64
    max_total_tokens: int = 16384        # KV slots usable by requests (the pool has one more)
    max_prefill_tokens: int = 4096       # new tokens per prefill batch
    chunked_prefill_size: int = 512      # <= 0 disables chunking
    context_length: int = 2048           # prompt + output limit per request
    schedule_policy: SchedulePolicy = "lpm"
    disable_radix_cache: bool = False    # True: chunk cache, no prefix reuse
    enable_overlap: bool = False
    enable_mixed_chunk: bool = False     # decode rows ride along with prefill chunks (MIXED)
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 64
    attention_backend: AttentionBackendName = "auto"
    tp_size: int = 1
    init_new_token_ratio: float = 0.7    # expected fraction of max_new_tokens still to come
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    seed: int = 0
    enable_probes: bool = True
    inject: FaultInjection = field(default_factory=FaultInjection)

    def __post_init__(self) -> None:
        _check(self.device in ("auto", "cpu", "cuda"), "device", f"unknown device {self.device!r}")
        for name in ("max_running_requests", "max_total_tokens", "max_prefill_tokens",
                     "context_length", "cuda_graph_max_bs", "tp_size"):
            _check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _check(self.schedule_policy in ("fcfs", "lpm"), "schedule_policy",
               f"unknown policy {self.schedule_policy!r} (fcfs, lpm)")
        _check(self.attention_backend in ("auto", "torch_native", "flashinfer"),
               "attention_backend", f"unknown backend {self.attention_backend!r}")
        _check(0.0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1.0,
               "init_new_token_ratio", "need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1")
        _check(self.context_length <= self.model.max_position, "context_length",
               f"{self.context_length} exceeds model.max_position={self.model.max_position}")
        _check(isinstance(self.enable_mixed_chunk, bool), "enable_mixed_chunk",
               f"must be a bool, got {self.enable_mixed_chunk!r}")
        inj = self.inject
        _check(not inj.straggler_us or 0 <= inj.straggler_rank < self.tp_size, "inject",
               f"straggler_rank={inj.straggler_rank} is not a rank of tp_size={self.tp_size}")
        _check(not self.enable_mixed_chunk or self.chunked_prefill_size > 0, "enable_mixed_chunk",
               "needs chunked prefill (chunked_prefill_size > 0)")
        _check(self.model.vocab_size % self.tp_size == 0, "tp_size",
               f"vocab_size={self.model.vocab_size} is not divisible by tp_size={self.tp_size}")
        _check(self.model.num_kv_heads % self.tp_size == 0, "tp_size",
               f"num_kv_heads={self.model.num_kv_heads} is not divisible by tp_size={self.tp_size}")

    @property
    def chunked_prefill_enabled(self) -> bool:
        return self.chunked_prefill_size > 0

    @property
    def kv_pool_size(self) -> int:
        """Slots in the KV buffers: max_total_tokens usable + slot 0 reserved for padded rows."""
        return self.max_total_tokens + 1

    def resolved_device(self) -> str:
        """'cpu' or 'cuda' for 'auto' (CUDA when available)."""
        if self.device != "auto":
            return self.device
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:
            return "cpu"
