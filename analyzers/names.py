"""Name classification — the one home for telling what a CUDA API call or a kernel is.

``api_kind``: launch / sync / memcpy / graph launch / other, from an API name (version suffix and
``hip`` prefix tolerated). ``is_comm_kernel``: NCCL/RCCL and known custom all-reduce kernels.
"""
from __future__ import annotations

import re

from srtscope.analyzers.timeline import ApiKind

_VERSION_SUFFIX = re.compile(r"_v\d+$")
_PTSZ_SUFFIX = re.compile(r"_(ptsz|ptds)$")


def strip_api_suffix(name: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``; ``cuLaunchKernel_ptsz`` -> ``cuLaunchKernel``."""
    name = _VERSION_SUFFIX.sub("", name)
    return _PTSZ_SUFFIX.sub("", name)


def hip_to_cuda(name: str) -> str:
    """Map ROCm HIP API names to their CUDA equivalents (``hipLaunchKernel`` -> ``cudaLaunchKernel``)."""
    if name.startswith("hipExtLaunchKernel") or name.startswith("hipExtModuleLaunchKernel"):
        return "cudaLaunchKernel"
    if name.startswith("hipModuleLaunchKernel"):
        return "cuLaunchKernel"
    if name.startswith("hip"):
        return "cuda" + name[3:]
    return name


_GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch"}
_LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                    "cuLaunchCooperativeKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                    "cudaLaunch", "cuLaunch")
_SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
               "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
               "cudaStreamWaitEvent", "cuStreamWaitEvent", "cudaStreamQuery")
_MEMCPY_PREFIXES = ("cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset")


def api_kind(name: str) -> ApiKind:
    """Classify one host API call by name."""
    n = strip_api_suffix(hip_to_cuda(name))
    if n in _GRAPH_LAUNCH:
        return ApiKind.GRAPH_LAUNCH
    if n.startswith(_LAUNCH_PREFIXES):
        return ApiKind.LAUNCH
    if n in _SYNC_NAMES and n not in ("cudaStreamWaitEvent", "cuStreamWaitEvent", "cudaStreamQuery"):
        return ApiKind.SYNC
    if n.startswith(_MEMCPY_PREFIXES):
        return ApiKind.MEMCPY
    return ApiKind.OTHER


_COMM_PATTERNS = re.compile(
    r"^(nccl|rccl)|ncclDevKernel|ncclKernel|cross_device_reduce|custom_all_reduce|"
    r"all_reduce|allreduce|AllReduce|all_gather|allgather|reduce_scatter|one_shot_all_reduce|"
    r"two_shot_all_reduce|multimem_all_reduce|quickreduce|mscclpp",
)


def is_comm_kernel(name: str) -> bool:
    """True for collective-communication kernels (NCCL/RCCL and known custom all-reduce)."""
    return bool(_COMM_PATTERNS.search(name or ""))


_TORCH_OP_IDS = re.compile(r",\s*(seq|op_id)\s*=\s*\d+")
_NUMBER = re.compile(r"\d+")


def range_family(name: str) -> str:
    """A range name without its per-instance numbers, so instances add up as one:
    ``"aten::mm, seq = 12, op_id = 7"`` -> ``"aten::mm"``, ``"Copy 190"`` -> ``"Copy #"``."""
    return _NUMBER.sub("#", _TORCH_OP_IDS.sub("", name)).strip()
