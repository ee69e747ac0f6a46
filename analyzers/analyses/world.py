"""What ran in the trace, so that advice speaks its language: an engine (srtscope's, SGLang, vLLM),
else a PyTorch program, else a native (C++/CUDA, HPC) program.

An engine is named by its own ranges or Python frames (``probes.stages``: ``ENGINE_NAMES``,
``ENGINE_FRAMES``, ``ENGINE_STEP_FRAMES``), by the engine a probe capture instrumented
(``capture --instrument``), srtscope's by its stage ranges; PyTorch by a Kineto
trace, framework operators (``aten::``), torch's annotations or its kernels (``at::native``).
"""
from __future__ import annotations

from collections.abc import Iterable

from srtscope.analyzers.model.columns import str_codes
from srtscope.analyzers.model.timeline import OP_DOMAIN, PYTHON_DOMAIN, SourceFormat, Timeline
from srtscope.analyzers.model.vocab import World
from srtscope.probes.stages import Stage, engine_frame, engine_name, step_frame

_OWN_STAGES = frozenset(s.value for s in Stage)
#: names only PyTorch writes: operators, its profiler's annotations, its kernels' namespaces
_TORCH_MARKS = ("aten::", "ProfilerStep#", "Optimizer.step#", "enumerate(DataLoader)", "at::native::",
                "at::cuda::", "c10::")


def trace_world(tl: Timeline, kernel_names: Iterable[str] = ()) -> World:
    """The world of ``tl`` (module doc). ``kernel_names``: the trace's top kernels (the device rows
    may not be in ``tl``: a streamed read)."""
    rg = tl.host_ranges
    names = [str(n) for n in str_codes(rg["name"])[1]] if len(rg) else []
    engines = {e.engine for n in names if (e := engine_name(n)) is not None}
    frames = tl.domain_names(PYTHON_DOMAIN)
    for f in frames:
        got = step_frame(f) or engine_frame(f)
        if got is not None:
            engines.add(got.engine)
    # a capture of a real engine under ``--instrument`` names its stages as srtscope's own
    probe = tl.meta.extra.get("probe.meta")
    instrumented = probe.get("instrumented") if isinstance(probe, dict) else None
    if instrumented == "vllm":
        return World.VLLM
    if instrumented == "sglang":
        return World.SGLANG
    # NOTE: vLLM's own names before srtscope's stage names: a capture of vLLM under ``--instrument``
    # (torch or nsys backend) holds both, the stages as ranges inside vLLM's trace; srtscope's own
    # engine is SGLang-shaped and writes some of SGLang's names, never vLLM's
    if "vllm" in engines:
        return World.VLLM
    if any(n in _OWN_STAGES for n in names) or "srtscope" in engines:
        return World.SRTSCOPE
    if "sglang" in engines:
        return World.SGLANG
    if tl.meta.format is SourceFormat.KINETO or frames or tl.domain_names(OP_DOMAIN):
        return World.PYTORCH
    if any(m in n for n in [*names, *kernel_names] for m in _TORCH_MARKS):
        return World.PYTORCH
    return World.NATIVE

