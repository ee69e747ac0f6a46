"""A stub of ``sgl_kernel`` (SGLang's CUDA kernel package), for the rig's SGLang 0.5.23 venv on the CPU.

WHY: the package index has ``sgl-kernel`` / ``sglang-kernel`` as CUDA-only wheels (no sdist, no CPU
build). Under ``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 imports the eight names below at start-up
(KV-cache moves, request-to-token assignment, speculative-decoding helpers: the CPU kernels of its
AMX build); on a CPU without AMX it never calls them — every layer takes its ``forward_native`` torch
path. Each name raises ``NotImplementedError`` if it ever is called, so a run that needed one fails
loudly instead of computing something else.
"""

_NAMES = (
    "assign_draft_cache_locs_contiguous_cpu",   # sglang/kernels/ops/speculative/cache_locs.py
    "assign_extend_cache_locs_cpu",             # sglang/kernels/ops/speculative/cache_locs.py
    "assign_req_to_token_pool_cpu",             # sglang/srt/mem_cache/allocation.py
    "build_tree_kernel_efficient_cpu",          # sglang/kernels/ops/speculative/spec_tree.py
    "copy_all_layer_kv_cache_cpu",              # sglang/kernels/ops/kvcache/cache_move.py
    "fill_accept_out_cache_loc_cpu",            # sglang/kernels/ops/speculative/eagle.py
    "fill_bonus_tokens_cpu",                    # sglang/kernels/ops/speculative/eagle.py
    "verify_tree_greedy_cpu",                   # sglang/kernels/ops/speculative/spec_tree.py
)


def _missing(name: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: a stub (the rig's SGLang venv has no sgl_kernel build "
                                  "for this CPU; see benchmarks/engines/setup_sglang.sh)")

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


for _name in _NAMES:
    globals()[_name] = _missing(_name)
__all__ = list(_NAMES)
