"""Drive the reference engine for ``srtscope run`` (and ``capture`` of it): config, workload,
traces. One rank in-process; several ranks through the engine's TP launcher.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from srtscope.cli.values import check_int

MAX_REQUESTS = 100_000            # a workload is built in memory up front
MAX_NEW_TOKENS = 1024             # per request; prompt + output fit the 2048-token context
MAX_TP = 8                        # ranks are processes on this machine
MAX_CUDA_GRAPH_BS = 1024
MAX_SEED = 2**32 - 1              # seeds are 0..2^32-1 (numpy's and torch's common range)
MAX_INJECT_US = 1_000_000         # an injected host delay: at most 1 s per step
MAX_CONTEXT = 2048                # prompt + output per request (less when a checkpoint's positions are fewer)
MAX_CPU_THREADS = 256
INJECT_FIELDS = ("sched_us", "prep_us", "result_us", "straggler_us")


@dataclass(frozen=True)
class EngineRunSpec:
    workload: str = "shared-prefix"
    requests: int = 32
    max_new_tokens: int = 16
    tp: int = 1
    overlap: bool = False
    mixed_chunk: bool = False
    inject: dict[str, int] = field(default_factory=dict)
    device: str = "auto"
    cuda_graph_max_bs: int = 64
    seed: int = 0
    model: str | None = None      # an HF checkpoint folder (config.json + *.safetensors); None: embedded
    cpu_threads: int = 0          # torch's CPU threads at tp=1; 0: 1 (embedded model) / torch's default (--model)

    def __post_init__(self) -> None:
        """Bounds with a stated maximum (ValueError naming the option): work that can finish."""
        check_int("--cpu-threads", self.cpu_threads, 0, MAX_CPU_THREADS)
        if self.model is not None:
            folder = Path(self.model)
            if not folder.is_dir():
                raise ValueError(f"--model {self.model}: not a folder (an HF checkpoint folder: config.json "
                                 f"and *.safetensors)")
            for need, what in (("config.json", "config.json"), ("*.safetensors", "*.safetensors files")):
                if not any(folder.glob(need)):
                    raise ValueError(f"--model {self.model}: no {what} in the folder")
        check_int("--requests", self.requests, 1, MAX_REQUESTS)
        check_int("--max-new-tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS, "tokens")
        check_int("--tp", self.tp, 1, MAX_TP)
        check_int("--cuda-graph-max-bs", self.cuda_graph_max_bs, 1, MAX_CUDA_GRAPH_BS)
        check_int("--seed", self.seed, 0, MAX_SEED)
        for key, value in self.inject.items():
            if key in INJECT_FIELDS:
                check_int(f"--inject {key.removesuffix('_us')}", value, 0, MAX_INJECT_US, "us")
            elif key == "straggler_rank":
                if not 0 <= value < self.tp:
                    raise ValueError(f"--inject straggler=US@RANK: straggler_rank={value} is not a rank "
                                     f"of --tp {self.tp} (0..{self.tp - 1})")
            else:
                raise ValueError(f"--inject: unknown field {key!r}")

    @property
    def tokenizer_path(self) -> str | None:
        """The checkpoint folder when it holds a ``tokenizer.json`` (prompts are then words)."""
        if self.model is None or not (Path(self.model) / "tokenizer.json").is_file():
            return None
        return self.model

    def model_config(self) -> Any:
        """The ModelConfig of the run: the embedded tiny model, or ``--model``'s checkpoint (its
        config.json read and checked: ValueError ``--model PATH: ...`` naming what is refused)."""
        from srtscope.engine.config import ModelConfig

        if self.model is None:
            return ModelConfig(seed=self.seed)
        return ModelConfig(seed=self.seed, weights_path=self.model, tokenizer_path=self.tokenizer_path)

    def engine_config(self) -> Any:
        from srtscope.engine.config import EngineConfig, FaultInjection
        from srtscope.engine.model.weights import model_config_from_hf

        device = cast(Any, self.device)                 # a str; EngineConfig validates it
        mc = self.model_config()
        resolved, context = mc, MAX_CONTEXT
        if self.model is not None:
            try:
                resolved = model_config_from_hf(self.model, mc)
            except ValueError as exc:
                raise ValueError(f"--model {self.model}: {str(exc).removeprefix('weights_path: ')}") from None
            context = min(context, resolved.max_position)
        kw = dict(device=device, context_length=context, enable_overlap=self.overlap,
                  enable_mixed_chunk=self.mixed_chunk, cuda_graph_max_bs=self.cuda_graph_max_bs,
                  tp_size=self.tp, seed=self.seed, inject=FaultInjection(**self.inject))
        if resolved is not mc:        # the checkpoint's sizes against --tp etc., before any rank starts
            try:
                EngineConfig(model=resolved, **kw)
            except ValueError as exc:
                raise ValueError(f"--model {self.model}: {exc}") from None
        return EngineConfig(model=mc, **kw)

    def workload_obj(self) -> Any:
        from srtscope.engine.workloads import make_workload, text_vocab

        vocab: tuple[int, ...] = ()
        if self.tokenizer_path is not None:
            from srtscope.engine.tokenizer import HFTokenizer

            vocab = text_vocab(HFTokenizer(self.tokenizer_path))
        n, m = self.requests, self.max_new_tokens
        by_workload: dict[str, dict[str, Any]] = {
            "shared-prefix": dict(num_requests=n, max_new_tokens=m),
            "multi-turn": dict(num_sessions=max(1, n // 4), turns=4, max_new_tokens=m),
            # depth 3, branching 2: 15 requests per root
            "agent-tree": dict(num_roots=max(1, round(n / 15)), max_new_tokens=m),
            "random": dict(num_requests=n, output_len=(1, m)),
        }
        return make_workload(self.workload, seed=self.seed, vocab=vocab, **by_workload[self.workload])

    def torch_threads(self) -> int:
        """torch's CPU threads for a one-rank run (0: leave torch's default). The embedded model's
        ops are too small to split: on a loaded 2-core machine two threads made its forward 3-8x
        slower (8 ms -> 67-200 ms a decode step) and the demo's verdict flip with the load."""
        return self.cpu_threads or (1 if self.model is None else 0)


@dataclass
class EngineRunResult:
    report: dict[str, Any]
    probe_traces: list[Path]
    chrome_traces: list[Path]

    @property
    def engine(self) -> dict[str, Any]:
        """What the engine ran on, from rank 0's probe trace: device, device_name,
        attention_backend, graph_capture_bs (empty: no CUDA graphs), nvtx (on / off /
        unavailable: why)."""
        import json

        if not self.probe_traces:
            return {}
        meta = json.loads(self.probe_traces[0].read_text()).get("meta", {})
        return {k: meta.get(k) for k in ("device", "device_name", "attention_backend",
                                         "graph_capture_bs", "nvtx")}


def run_engine(config: Any, workload: Any, out: Path, threads: int = 0) -> EngineRunResult:
    """Run ``workload`` (engine.workloads.Workload) on an engine of ``config`` with probes on and
    write probe + Chrome traces into ``out``. ``threads``: torch's CPU threads at tp=1 (0: as is;
    each rank of a TP run takes its share of the cores)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("probe.rank*.json"):
        old.unlink()
    if config.tp_size > 1:
        from srtscope.engine.tp_launch import run_tp_workload

        # each rank captures itself (probes.torch_capture.from_env): they are separate processes
        report, paths = run_tp_workload(config, workload, out)
        return EngineRunResult(report, sorted(out.glob("probe.rank*.json")),
                               sorted(out.glob("chrome.rank*.json")))
    from srtscope.engine.engine import Engine
    from srtscope.engine.workloads import run_workload
    from srtscope.probes.nvml import NvmlSampler
    from srtscope.probes.recorder import Recorder, set_recorder
    from srtscope.probes.torch_capture import from_env

    if threads:
        import torch

        torch.set_num_threads(threads)
    rec = Recorder()
    set_recorder(rec)
    with Engine(config) as engine, from_env(), \
            NvmlSampler(rec, interval_s=0.05) as nvml:
        wreport = run_workload(engine, workload)
        rec.meta["nvml"] = "sampled" if nvml.available else nvml.reason
        engine.check_invariants()
        paths = engine.write_traces(out)
        report = wreport.as_dict()
        sample = text_sample(engine.tokenizer, workload, wreport.outputs)
        if sample:
            report["sample"] = sample
    return EngineRunResult(report, [paths["probe"]], [paths["chrome"]])


def text_sample(tokenizer: Any, workload: Any, outputs: dict[str, list[int]]) -> dict[str, str] | None:
    """The first request's prompt end (16 tokens) and its output as text, when the model has a real
    tokenizer (``--model`` with tokenizer.json): the user sees what the checkpoint answered."""
    if getattr(tokenizer, "kind", "") != "hf" or not workload.items:
        return None
    item = workload.items[0]
    if item.tag not in outputs:
        return None
    return {"request": item.tag, "prompt_end": tokenizer.decode(item.prompt_ids[-16:]),
            "output": tokenizer.decode(outputs[item.tag])}
