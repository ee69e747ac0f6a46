"""Name classification — the one home for telling what a CUDA API call or a kernel is.

``api_kind``: launch / sync / memcpy / graph launch / other, from an API name (version suffix and
``hip`` prefix tolerated), allocation and start-up calls too; ``os_kind`` for OS runtime calls.
``COMM_FAMILIES`` is the declared table of collective kernels (NCCL, RCCL, DeepEP,
NVSHMEM, vLLM/SGLang custom all-reduce, ...): ``is_comm_kernel``, ``comm_family``, ``comm_op`` and the
device table's ``comm_mask`` read it; ``copy_kind`` tells copies apart by what they move.
``host_work`` tells, from a range or frame name, the host work it stands for (framework operator,
I/O or data loading, compilation).
"""
from __future__ import annotations

import re
from enum import Enum
from functools import lru_cache

import numpy as np
import pandas as pd

from srtscope.analyzers.model.columns import str_map
from srtscope.analyzers.model.timeline import ApiKind

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
_ALLOC_PREFIXES = ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaHostRegister", "cudaHostUnregister",
                   "cuMemAlloc", "cuMemFree", "cuMemHostAlloc", "cuMemHostRegister", "cuMemCreate",
                   "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve", "cuMemSetAccess",
                   "cudaMallocHost", "cudaFreeHost", "cuMemAllocHost", "cuMemFreeHost")
_INIT_PREFIXES = ("cuModuleLoad", "cuModuleGetFunction", "cuModuleUnload", "cuLibraryLoad", "cuLibraryGet",
                  "cuCtxCreate", "cuCtxDestroy", "cuDevicePrimaryCtx", "cuInit", "cudaSetDevice",
                  "cudaDeviceReset", "cudaGetDeviceProperties", "cudaDeviceGetStreamPriorityRange",
                  "cudaStreamCreate", "cudaStreamDestroy", "cudaFuncGetAttributes", "cudaFuncSetAttribute",
                  "cuFuncGetAttribute", "cuFuncSetAttribute", "cudaDeviceSetLimit", "cudaGraphInstantiate",
                  "cuGraphInstantiate", "cudaStreamBeginCapture", "cudaStreamEndCapture",
                  "cuStreamBeginCapture", "cuStreamEndCapture", "nvrtc")


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
    if n.startswith(_ALLOC_PREFIXES):
        return ApiKind.ALLOC
    if n.startswith(_INIT_PREFIXES):
        return ApiKind.INIT
    return ApiKind.OTHER


_OS_IO = re.compile(r"^(p?read|p?write|readv|writev|preadv|pwritev|open|open64|openat|creat|close|"
                    r"fopen|fopen64|fclose|fread|fwrite|fflush|fsync|fdatasync|fgets|fputs|"
                    r"stat|stat64|lstat|lstat64|fstat|fstat64|__xstat|__xstat64|__fxstat|__fxstat64|"
                    r"statx|access|unlink|rename|mkdir|rmdir|getdents|getdents64|opendir|readdir|"
                    r"recv|recvfrom|recvmsg|send|sendto|sendmsg|accept|accept4|connect|sendfile)$")
_OS_WAIT = re.compile(r"^(poll|ppoll|select|pselect|pselect6|epoll_wait|epoll_pwait|pthread_cond_wait|"
                      r"pthread_cond_timedwait|sem_wait|sem_timedwait|futex|nanosleep|usleep|sleep|"
                      r"clock_nanosleep|pthread_join|pthread_mutex_lock|pthread_rwlock_rdlock|"
                      r"pthread_rwlock_wrlock|waitpid|wait|wait4|sched_yield)$")


def os_kind(name: str) -> ApiKind:
    """Classify one OS runtime call (nsys ``OSRT_API``) by name: I/O, a wait, or other."""
    n = name.strip()
    if _OS_IO.match(n):
        return ApiKind.OS_IO
    if _OS_WAIT.match(n):
        return ApiKind.OS_WAIT
    return ApiKind.OS_OTHER


#: Slower than this, a launch or set-up call is start-up cost (lazy module loading, context
#: creation on first use), not steady-state launch overhead (a few µs).
SLOW_CALL_NS = 1_000_000


class CommOp(str, Enum):
    """What a collective kernel does (``comm_kind``)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"        # expert dispatch / combine included
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"
    OTHER = "other"


#: The declared table of collective-communication kernel families: (family, name pattern). The
#: first family whose pattern is found in a kernel name claims it; a name no family claims is no
#: collective. Order matters: library namespaces first, the generic collective words last.
COMM_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("deepep", re.compile(r"deep_?ep::|dpsk::ep::|\bdeepep", re.IGNORECASE)),     # MoE expert dispatch/combine
    ("pplx", re.compile(r"pplx::|pplx_kernels")),                                  # pplx-kernels all-to-all
    ("nvshmem", re.compile(r"nvshmem", re.IGNORECASE)),                            # NVSHMEM device-initiated
    ("rccl", re.compile(r"^rccl|\brccl", re.IGNORECASE)),
    ("nccl", re.compile(r"^nccl|ncclDevKernel|ncclKernel")),
    ("custom_all_reduce", re.compile(                                              # vLLM / SGLang / TRT-LLM
        r"cross_device_reduce|custom_all_reduce|one_shot_all_reduce|two_shot_all_reduce|"
        r"multimem_all_reduce|quickreduce|allreduce_fusion|lamport_?all_?reduce", re.IGNORECASE)),
    ("mscclpp", re.compile(r"mscclpp", re.IGNORECASE)),
    ("collective", re.compile(r"all_?reduce|AllReduce|all_?gather|AllGather|reduce_?scatter|ReduceScatter|"
                              r"all_?to_?all|AllToAll")),
)

_COMM_OPS: tuple[tuple[CommOp, re.Pattern[str]], ...] = (
    (CommOp.ALL_TO_ALL, re.compile(r"(?i)all_?to_?all|dispatch|combine|a2a")),
    (CommOp.REDUCE_SCATTER, re.compile(r"(?i)reduce_?scatter")),
    (CommOp.ALL_GATHER, re.compile(r"(?i)all_?gather")),
    (CommOp.ALL_REDUCE, re.compile(r"(?i)all_?reduce|cross_device_reduce|quickreduce")),
    (CommOp.SEND_RECV, re.compile(r"(?i)send_?recv|\bsend|\brecv|_send|_recv|p2p")),
    (CommOp.BROADCAST, re.compile(r"(?i)broadcast|bcast")),
)


@lru_cache(maxsize=1 << 16)
def comm_family(name: str) -> str | None:
    """The ``COMM_FAMILIES`` family of a kernel name, None for no collective.

    NOTE: cached: every window of a trace in windows classifies the whole trace's kernel names."""
    n = name or ""
    for fam, pat in COMM_FAMILIES:
        if pat.search(n):
            return fam
    return None


def comm_op(name: str) -> CommOp:
    """What a collective kernel does, from its name (``OTHER`` when the name does not say)."""
    for op, pat in _COMM_OPS:
        if pat.search(name or ""):
            return op
    return CommOp.OTHER


def is_comm_kernel(name: str) -> bool:
    """True for collective-communication kernels: any family of ``COMM_FAMILIES``."""
    return comm_family(name) is not None


def comm_mask(device: pd.DataFrame) -> np.ndarray:
    """True for the collective-communication rows of a device table (classified once per distinct
    name). The one collective mask: device sets, comm, device split and attribution take it."""
    if len(device) == 0:
        return np.zeros(0, bool)
    return str_map(device["name"], is_comm_kernel, bool)


class CopyKind(str, Enum):
    """A copy by what it moves, each with its own remedy (``copy_kind``; advice per kind)."""

    HTOD_PAGEABLE = "htod_pageable"    # host -> device from pageable memory: pin it
    HTOD = "htod"                      # host -> device (pinned or unknown): prefetch / overlap
    DTOH = "dtoh"                      # device -> host: read back less, later, asynchronously
    DTOD = "dtod"                      # within a device: fuse or avoid (pinning cannot help)
    PEER = "peer"                      # between devices (PtoP): NVLink / P2P transport
    HTOH = "htoh"
    OTHER = "other"


_DIRECTION = re.compile(r"(HtoD|DtoH|DtoD|HtoH|PtoP|Peer)", re.IGNORECASE)
_CANON = {"htod": "HtoD", "dtoh": "DtoH", "dtod": "DtoD", "htoh": "HtoH", "ptop": "PtoP", "peer": "PtoP"}


@lru_cache(maxsize=1 << 16)
def copy_direction(name: str) -> str:
    """``Memcpy HtoD (Pinned -> Device)`` -> ``HtoD``; unknown -> ``other``. Cached, as
    ``comm_family``."""
    m = _DIRECTION.search(name or "")
    return _CANON[m.group(1).lower()] if m else "other"


def copy_kind(name: str) -> CopyKind:
    """The ``CopyKind`` of a copy row's name (direction, and pageable memory where the name says)."""
    d = copy_direction(name)
    if d == "HtoD":
        return CopyKind.HTOD_PAGEABLE if "pageable" in (name or "").lower() else CopyKind.HTOD
    return {"DtoH": CopyKind.DTOH, "DtoD": CopyKind.DTOD, "PtoP": CopyKind.PEER,
            "HtoH": CopyKind.HTOH}.get(d, CopyKind.OTHER)


_TORCH_OP_IDS = re.compile(r",\s*(seq|op_id)\s*=\s*\d+")
_NUMBER = re.compile(r"\d+")


def range_family(name: str) -> str:
    """A range name without its per-instance numbers, so instances add up as one:
    ``"aten::mm, seq = 12, op_id = 7"`` -> ``"aten::mm"``, ``"Copy 190"`` -> ``"Copy #"``."""
    return _NUMBER.sub("#", _TORCH_OP_IDS.sub("", name)).strip()


class HostWork(str, Enum):
    """What a range or Python frame name says the host was doing (``host_work``)."""

    MODEL_OP = "model_op"      # a framework operator or module: model code launching kernels
    IO = "io"                  # file, network or data-loader work
    COMPILE = "compile"        # JIT compilation, autotuning, warm-up
    NONE = ""


#: a torch.compile graph's steady-state execution (``CompiledFunction``, ``CompiledFunctionBackward``,
#: ``Torch-Compiled Region``, inductor's ``## Call CompiledFxGraph ... ##``) runs the model; it is no compilation
_OP_NAME = re.compile(r"^[A-Za-z_][\w.]*::\w|^nn\.Module:|^autograd::|^Optimizer\.|"
                      r"^CompiledFunction(Backward)?\b|^Torch-Compiled Region|Call CompiledFxGraph")
_IO_NAME = re.compile(r"(?i)(\bi/?o\b|dataloader|data_loader|__next__|\bdataset\b|"
                      r"\b(read|write|save|load|dump|fetch|prefetch|checkpoint|serializ\w*|pickle|"
                      r"recv|send|socket|file|disk|print)\b)")
_COMPILE_NAME = re.compile(r"(?i)(compil(?!ed ?function|ed region|edfxgraph)|nvrtc|\bjit\b|autotun|"
                           r"warm_?up|cudnn_?find|benchmark_?algo|lowering|codegen|inductor)")


def host_work(name: str) -> HostWork:
    """The host work a range/op/frame name stands for. I/O and compilation are recognised first
    (a data loader's ``__next__`` is an operator too); then operators (``ns::op``) and modules."""
    n = name or ""
    if _IO_NAME.search(n):
        return HostWork.IO
    if _COMPILE_NAME.search(n):
        return HostWork.COMPILE
    if _OP_NAME.search(n):
        return HostWork.MODEL_OP
    return HostWork.NONE
