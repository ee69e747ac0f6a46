"""Engine: the facade — build the worker and scheduler, submit prompts, run the scheduler's loop.

    with Engine(EngineConfig(device="cpu")) as eng:
        outs = eng.generate(["Hello", [72, 105]], {"max_new_tokens": 8})

Prompts are text (byte tokenizer or a local HF tokenizer; no special tokens added) or token-id
lists. Bad input raises a ``ValueError`` naming the field for that request alone: with
``on_error="raise"`` (default) nothing of the call is queued; with ``on_error="return"`` the bad
request's output carries ``error`` and the others are served.
"""
from __future__ import annotations

import dataclasses
import logging
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import torch

from srtscope.engine.config import EngineConfig
from srtscope.engine.request import Req, SamplingParams
from srtscope.engine.scheduler.scheduler import Scheduler

logger = logging.getLogger("srtscope.engine")

Prompt = str | Sequence[int]
ParamsLike = SamplingParams | Mapping[str, Any] | None


@dataclass
class GenerateOutput:
    rid: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict[str, Any] | None = None
    error: str | None = None            # the ValueError message of a rejected request
    cached_tokens: int = 0              # prompt tokens served from the prefix cache
    ttft_ms: float = 0.0
    itl_ms: list[float] = field(default_factory=list)
    num_retractions: int = 0


class Engine:
    """``tp_sync``: this TP rank's control plane (``engine.distributed.sync.TpSync``), handed to the
    scheduler; None with one rank."""

    def __init__(self, config: EngineConfig | None = None, worker: Any = None,
                 req_pool_size: int | None = None, tp_sync: Any = None) -> None:
        self.config = config or EngineConfig()
        if self.config.enable_probes:
            from srtscope.probes.ranges import enable, nvtx_status

            on_cuda = self.config.resolved_device() == "cuda"
            if not enable(nvtx=on_cuda) and on_cuda:
                logger.warning("NVTX ranges off (%s): stages reach the probe trace, not Nsight "
                               "Systems", nvtx_status())
        if worker is None:
            from srtscope.engine.runner.tp_worker import TpModelWorker

            if self.config.tp_size > 1:
                raise ValueError(f"tp_size: Engine runs one rank in this process; for tp_size="
                                 f"{self.config.tp_size} start the ranks with engine.tp_launch "
                                 f"(srtscope run --tp N) or pass each rank's TpModelWorker")
            worker = TpModelWorker(self.config)
        self.worker = worker
        self.tokenizer = worker.tokenizer
        self.scheduler = Scheduler(self.config, worker, req_pool_size=req_pool_size, tp_sync=tp_sync)

    # -- requests ------------------------------------------------------------------------------
    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):
            ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
            try:
                return [operator.index(t) for t in ids]
            except TypeError:
                raise ValueError("prompt: token ids must be ints") from None
        raise ValueError(f"prompt: expected text or a list of token ids, got {type(prompt).__name__}")

    def make_request(self, prompt: Prompt, sampling_params: ParamsLike = None, rid: str = "") -> Req:
        """Validate and build (not submit) a request; ``ValueError`` naming the field."""
        return self.scheduler.make_req(self.tokenize(prompt), sampling_params, rid=rid)

    def submit(self, prompt: Prompt, sampling_params: ParamsLike = None, rid: str = "") -> Req:
        return self.scheduler.submit(self.make_request(prompt, sampling_params, rid))

    def abort(self, rid: str) -> bool:
        return self.scheduler.abort(rid)

    # -- running -------------------------------------------------------------------------------
    def step(self) -> bool:
        """One event-loop iteration of the scheduler (normal or overlap, per config)."""
        return self.scheduler.run_step()

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        return self.scheduler.run_until_idle(max_steps)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: ParamsLike | Sequence[ParamsLike] = None,
                 on_error: Literal["raise", "return"] = "raise") -> list[GenerateOutput]:
        """Run prompts to completion; one output per prompt, in order."""
        if on_error not in ("raise", "return"):
            raise ValueError(f"on_error: expected 'raise' or 'return', got {on_error!r}")
        plist = cast("list[Prompt]", [prompts] if _is_one_prompt(prompts) else list(prompts))
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(plist):
                raise ValueError(f"sampling_params: {len(sampling_params)} given for "
                                 f"{len(plist)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params] * len(plist)
        reqs: list[Req | ValueError] = []
        for i, (p, sp) in enumerate(zip(plist, params)):
            try:
                reqs.append(self.make_request(p, sp))
            except ValueError as exc:
                if on_error == "raise":
                    raise type(exc)(f"request {i}: {exc}") from None
                reqs.append(exc)
        for r in reqs:
            if isinstance(r, Req):
                self.scheduler.submit(r)
        self.scheduler.run_until_idle()
        self.scheduler.take_finished()       # this call's requests are read from `reqs`
        return [self._output(r, p) for r, p in zip(reqs, plist)]

    def _output(self, r: Req | ValueError, prompt: Prompt) -> GenerateOutput:
        if isinstance(r, ValueError):
            ids = prompt if not isinstance(prompt, str) else []
            return GenerateOutput(rid="", prompt_ids=list(ids), error=str(r))
        ttft = (r.first_token_ns - r.arrival_ns) / 1e6 if r.first_token_ns else 0.0
        itl = [(b - a) / 1e6 for a, b in zip(r.token_ns, r.token_ns[1:])]
        return GenerateOutput(
            rid=r.rid, prompt_ids=list(r.origin_input_ids), output_ids=list(r.output_ids),
            text=r.output_text(self.tokenizer),
            finish_reason=r.finished_reason.to_dict() if r.finished_reason else None,
            cached_tokens=r.cached_tokens, ttft_ms=ttft, itl_ms=itl,
            num_retractions=r.num_retractions)

    # -- introspection -------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.scheduler.check_invariants()

    @property
    def stats(self):
        return self.scheduler.stats

    def write_traces(self, out_dir: str | os.PathLike, rank: int = 0) -> dict[str, Path]:
        """Write the probe trace (``probe.rank<r>.json``) and a Chrome trace of what the process
        recorder holds. Requires probes (``config.enable_probes``)."""
        from srtscope.probes.export import probe_trace_name, write_chrome_trace, write_probe_trace
        from srtscope.probes.ranges import is_enabled
        from srtscope.probes.recorder import get_recorder

        if not self.config.enable_probes or not is_enabled():
            raise ValueError("enable_probes: probes are off, there is no trace to write")
        rec = get_recorder()
        from srtscope.probes.ranges import nvtx_status

        rec.meta.update(engine_config=_config_dict(self.config), device=str(self.worker.device),
                        nvtx=nvtx_status(),
                        device_name=_device_name(self.worker.device),
                        attention_backend=getattr(self.worker, "attention_backend", None),
                        graph_capture_bs=getattr(self.worker, "graph_capture_bs", None),
                        source="srtscope-engine")
        resolve = getattr(self.worker, "resolve_device_times", None)
        if resolve is not None:
            resolve(synchronize=True)
        out = Path(out_dir)
        return {"probe": write_probe_trace(rec, out / probe_trace_name(rank)),
                "chrome": write_chrome_trace(rec, out / f"chrome.rank{rank}.json")}

    def close(self) -> None:
        self.scheduler.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_one_prompt(prompts: object) -> bool:
    """Text, or one sequence of token ids (list / tuple of ints, 1-D tensor or array)."""
    if isinstance(prompts, str):
        return True
    ndim = getattr(prompts, "ndim", None)
    if ndim is not None:
        return ndim <= 1               # a 2-D tensor / array is a batch of prompts (rows)
    if isinstance(prompts, (list, tuple)) and prompts:
        try:
            operator.index(prompts[0])
            return True
        except TypeError:
            return False
    return False


def _config_dict(config: EngineConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _device_name(device: Any) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return "cpu"
