"""Name classification — the one home for telling what a CUDA API call or a kernel is.

``api_kind``: launch / sync / memcpy / graph launch / other, from an API name (version suffix and
``hip`` prefix tolerated), allocation and start-up calls too; ``os_kind`` for OS runtime calls.
``is_comm_kernel``: NCCL/RCCL and known custom all-reduce kernels. ``host_work`` tells, from a range
or frame name, the host work it stands for (framework operator, I/O or data loading, compilation).
"""
from __future__ import annotations

import re
from enum import Enum

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


class HostWork(str, Enum):
    """What a range or Python frame name says the host was doing (``host_work``)."""

    MODEL_OP = "model_op"      # a framework operator or module: model code launching kernels
    IO = "io"                  # file, network or data-loader work
    COMPILE = "compile"        # JIT compilation, autotuning, warm-up
    NONE = ""


_OP_NAME = re.compile(r"^[A-Za-z_][\w.]*::\w|^nn\.Module:|^autograd::|^Optimizer\.")
_IO_NAME = re.compile(r"(?i)(\bi/?o\b|dataloader|data_loader|__next__|\bdataset\b|"
                      r"\b(read|write|save|load|dump|fetch|prefetch|checkpoint|serializ\w*|pickle|"
                      r"recv|send|socket|file|disk|print)\b)")
_COMPILE_NAME = re.compile(r"(?i)(compil|nvrtc|\bjit\b|autotun|warm_?up|cudnn_?find|"
                           r"benchmark_?algo|lowering|codegen|inductor)")


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
