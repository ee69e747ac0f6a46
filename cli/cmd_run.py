"""``srtscope run``: the reference engine (the embedded tiny model or ``--model``'s HF checkpoint),
probes on, then a diagnosis — printed, in ``--out``, and as ``--html`` / ``--markdown`` files."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from srtscope.cli.errors import fail
from srtscope.cli.output import OutputError, check_output_path, ensure_dir, out_dir_lock, settle_mode, write_json
from srtscope.cli.terminal import Console
from srtscope.probes.stages import Stage


class WorkloadName(str, Enum):
    SHARED_PREFIX = "shared-prefix"
    MULTI_TURN = "multi-turn"
    AGENT_TREE = "agent-tree"
    RANDOM = "random"


class DeviceOpt(str, Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


_INJECT_KEYS = {"sched": "sched_us", Stage.SCHED_SCHEDULE.value: "sched_us",
                "prep": "prep_us", Stage.PREP_BATCH.value: "prep_us",
                "result": "result_us", Stage.SCHED_RESULT.value: "result_us",
                "straggler": "straggler_us", "comm": "straggler_us",
                Stage.COMM_ALL_REDUCE.value: "straggler_us"}


def parse_inject(items: list[str]) -> dict[str, int]:
    """``stage=us`` items -> FaultInjection fields; ``straggler=US@RANK`` picks the slow rank.

    Microseconds must be finite, >= 0 and at most ``MAX_INJECT_US`` (1 s per step); fractions are
    rounded to the nearest microsecond. Bad items exit 2 with one line.
    """
    import math

    from srtscope.cli.engine_run import MAX_INJECT_US

    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in _INJECT_KEYS:
            fail(f"--inject {item!r}: expected STAGE=US with STAGE one of sched, prep, result, "
                 f"straggler (straggler=US@RANK)")
        rank = None
        if "@" in value:
            value, _, rank_s = value.partition("@")
            try:
                rank = int(rank_s)
            except ValueError:
                fail(f"--inject {item!r}: rank after '@' must be an integer")
        try:
            us_f = float(value)
        except ValueError:
            fail(f"--inject {item!r}: microseconds must be a number")
        if not math.isfinite(us_f):
            fail(f"--inject {item!r}: microseconds must be finite (at most {MAX_INJECT_US} us per step)")
        if us_f < 0:
            fail(f"--inject {item!r}: microseconds must be >= 0")
        if us_f > MAX_INJECT_US:
            fail(f"--inject {item!r}: at most {MAX_INJECT_US} us (1 s) per step")
        out[_INJECT_KEYS[key]] = round(us_f)
        if _INJECT_KEYS[key] == "straggler_us":
            out["straggler_rank"] = 1 if rank is None else rank
    return out


def _report_table(report: dict, title: str) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [("requests", f"{report['num_requests']}"),
            ("output tokens/s", f"{report['output_tok_per_s']:.1f}"),
            ("total tokens/s", f"{report['total_tok_per_s']:.1f}"),
            ("prefix cache hit rate", f"{report['cache_hit_rate'] * 100:.1f}%"),
            ("TTFT p50 / p99", f"{report['ttft_ms_p50']:.1f} / {report['ttft_ms_p99']:.1f} ms"),
            ("ITL p50 / p99", f"{report['itl_ms_p50']:.2f} / {report['itl_ms_p99']:.2f} ms"),
            ("retractions", f"{report['retractions']}"),
            ("wall", f"{report['wall_s']:.2f} s")]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _engine_line(facts: dict) -> str:
    """``on <device>, <backend> attention, CUDA graphs for bs [..]`` (or why there are none)."""
    graphs = facts.get("graph_capture_bs") or []
    if graphs:
        g = f"CUDA graphs for bs {graphs[0]}..{graphs[-1]} ({len(graphs)} sizes)"
    else:
        g = "no CUDA graphs" + (" (not on CUDA)" if facts.get("device") == "cpu" else "")
    nvtx = facts.get("nvtx") or "off"
    tail = f", NVTX {nvtx}" if facts.get("device") != "cpu" or nvtx == "on" else ""
    return f"on {facts.get('device_name') or facts.get('device')}, " \
           f"{facts.get('attention_backend')} attention, {g}{tail}"


def _model_facts(spec: Any, config: Any) -> dict[str, Any]:
    """What model ran: the checkpoint folder (None: the embedded one), its type, sizes, dtype and
    tokenizer."""
    from srtscope.engine.model.hf_config import hf_model_type
    from srtscope.engine.runner.tp_worker import resolve_model_config

    mc = resolve_model_config(config)
    mtype = hf_model_type(mc.qkv_bias, mc.qk_norm)[0]
    if spec.model is not None:      # as the checkpoint names itself (a mistral loads as a llama)
        mtype = json.loads((Path(spec.model) / "config.json").read_text()).get("model_type") or mtype
    return {"path": spec.model, "type": mtype, "layers": mc.num_layers,
            "hidden_size": mc.hidden_size, "heads": mc.num_heads, "kv_heads": mc.num_kv_heads,
            "head_dim": mc.head_dim, "vocab_size": mc.vocab_size,
            "dtype": "float32" if mc.dtype == "auto" else mc.dtype,     # "auto" without a checkpoint: float32
            "tokenizer": "tokenizer.json" if mc.tokenizer_path else "bytes"}


def _model_line(m: dict[str, Any]) -> str:
    what = m.get("path") or "the embedded tiny random model"
    return (f"model: {what} ({m.get('type')}, {m.get('layers')} layers x {m.get('hidden_size')}, "
            f"{m.get('heads')}/{m.get('kv_heads')} heads of {m.get('head_dim')}, {m.get('dtype')}, "
            f"prompts: {'words through its tokenizer.json' if m.get('tokenizer') != 'bytes' else 'byte ids'})")


@dataclass(frozen=True)
class RunOutcome:
    """What one ``run`` produced: the workload report, what the engine ran on, the diagnosis JSON."""

    report: dict[str, Any]
    engine: dict[str, Any]
    diagnosis: dict[str, Any]


def check_run_outputs(out: Path, tp: int) -> None:
    """Refuse (OutputError) a run whose output files, or the stale rank traces it removes, are not
    regular files: the engine renames over them."""
    names = ["workload_report.json", "diagnosis.json", "report.html"]
    names += [f"{kind}.rank{r}.json" for r in range(tp) for kind in ("probe", "chrome")]
    paths = [out / n for n in names] + sorted(out.glob("probe.rank*.json"))
    for p in paths:
        check_output_path(p)


def _run_and_write(spec: Any, config: Any, work: Any, out: Path, console: Console) -> RunOutcome:
    """Run the engine into ``out`` (its lock held by the caller), diagnose its own traces, and write
    ``workload_report.json`` and ``diagnosis.json``."""
    from srtscope.cli.cmd_diagnose import run_diagnosis
    from srtscope.cli.engine_run import run_engine

    with console.status(f"running {spec.workload} x{spec.requests} on the engine "
                        f"(tp={spec.tp}, overlap={'on' if spec.overlap else 'off'})"):
        try:
            result = run_engine(config, work, out, spec.torch_threads())
        except ValueError as exc:       # a checkpoint the loader refuses (a tensor's name or shape)
            where = f"--model {spec.model}: " if spec.model else ""
            fail(where + str(exc).removeprefix("weights_path: "))
    for p in [*result.probe_traces, *result.chrome_traces]:
        settle_mode(p)                  # the engine's writer creates them 0600
    facts = {**result.engine, "model": _model_facts(spec, config)}
    write_json(out / "workload_report.json", {**result.report, "engine": facts}, allow_nan=True)
    diag = run_diagnosis(result.probe_traces, 5.0, None, console, True)
    doc = diag.to_json()
    write_json(out / "diagnosis.json", doc)
    from srtscope.cli.html import diagnosis_html
    from srtscope.cli.output import write_text

    write_text(out / "report.html", diagnosis_html(doc, f"srtscope run: {out.name}"))
    return RunOutcome(result.report, facts, doc)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        workload: WorkloadName = typer.Option(WorkloadName.SHARED_PREFIX, "--workload", "-w", metavar="NAME",
                                              show_default=False,
                                              help="Request pattern to serve: shared-prefix (the default), "
                                                   "multi-turn, agent-tree or random."),
        requests: int = typer.Option(32, "--requests", "-n", min=1, metavar="N",
                                     help="Number of requests (at most 100000)."),
        max_new_tokens: int = typer.Option(16, "--max-new-tokens", min=1, metavar="N",
                                           help="Output tokens per request (at most 1024)."),
        tp: int = typer.Option(1, "--tp", min=1, metavar="N", help="Tensor-parallel ranks (processes, at most 8)."),
        overlap: bool = typer.Option(False, "--overlap/--no-overlap",
                                     help="Overlap scheduling of step t+1 with the forward of t."),
        mixed_chunk: bool = typer.Option(False, "--mixed-chunk/--no-mixed-chunk",
                                         help="Run decode requests inside prefill chunks."),
        inject: list[str] = typer.Option([], "--inject", metavar="STAGE=US",
                                         help="Fault injection STAGE=US per step (sched, prep, "
                                              "result, straggler=US@RANK; 0..1000000 us). "
                                              "Repeatable."),
        device: DeviceOpt = typer.Option(DeviceOpt.AUTO, "--device", help="auto, cpu or cuda."),
        cuda_graph_max_bs: int = typer.Option(64, "--cuda-graph-max-bs", min=1, metavar="N",
                                              help="Largest batch size captured as a CUDA graph (at most 1024)."),
        out: Path = typer.Option(Path("runs/latest"), "--out", "-o", metavar="DIR",
                                 help="Folder for the probe trace(s), Chrome trace and report; "
                                      "one run at a time (a lock)."),
        as_json: bool = typer.Option(False, "--json", help="Print the diagnosis JSON only."),
        seed: int = typer.Option(0, "--seed", metavar="N", help="Model and workload seed (0..2^32-1)."),
        model: Path | None = typer.Option(None, "--model", metavar="PATH",
                                          help="An HF checkpoint folder (config.json, *.safetensors, "
                                               "tokenizer.json) of a Llama, Mistral, Qwen2 or Qwen3 model "
                                               "instead of the embedded tiny one."),
        html: Path | None = typer.Option(None, "--html", metavar="FILE",
                                         help="Also write the diagnosis as a self-contained HTML report."),
        markdown: Path | None = typer.Option(None, "--markdown", metavar="FILE",
                                             help="Also write the diagnosis as a Markdown report."),
        cpu_threads: int = typer.Option(0, "--cpu-threads", metavar="N",
                                        help="torch CPU threads at --tp 1 (0: 1 for the embedded "
                                             "model, torch's default for --model)."),
    ) -> None:
        """Run the reference engine with probes on, write its traces, and diagnose them.

        Only one run at a time writes into an --out folder: a second one fails at once (exit 2).
        """
        from srtscope.cli.engine_run import EngineRunSpec

        for target in (html, markdown):
            if target is not None:
                try:
                    check_output_path(target)       # refused before the run, not after
                except OutputError as exc:
                    fail(str(exc))
        try:
            spec = EngineRunSpec(workload=workload.value, requests=requests,
                                 max_new_tokens=max_new_tokens, tp=tp, overlap=overlap,
                                 mixed_chunk=mixed_chunk,
                                 inject=parse_inject(list(inject)), device=device.value,
                                 cuda_graph_max_bs=cuda_graph_max_bs, seed=seed,
                                 model=None if model is None else str(model), cpu_threads=cpu_threads)
            config, work = spec.engine_config(), spec.workload_obj()
        except ValueError as exc:
            fail(str(exc))
        console = Console(stderr=as_json)
        if device is DeviceOpt.CUDA:
            import torch

            if not torch.cuda.is_available():
                fail("--device cuda: no CUDA device is available (use --device cpu)")
        try:
            ensure_dir(out, "--out folder")
            with out_dir_lock(out):
                check_run_outputs(out, spec.tp)
                done = _run_and_write(spec, config, work, out, console)
        except OutputError as exc:
            fail(str(exc))
        from srtscope.cli.cmd_diagnose import report_output_errors, write_outputs

        errors = write_outputs(done.diagnosis, None, markdown=markdown, html=html,
                               title=f"srtscope run: {out.name}")
        failed = {line.split(":", 1)[0] for _, line in errors}        # each line starts with its option
        written = [p for opt, p in (("--html", html), ("--markdown", markdown)) if p is not None and opt not in failed]
        if as_json:
            sys.stdout.write(json.dumps(done.diagnosis, indent=2) + "\n")
        else:
            from srtscope.cli.render import render_diagnosis

            console.print(_report_table(done.report, f"engine run: {spec.workload}, "
                                                     f"{spec.requests} requests"))
            console.print(_model_line(done.engine["model"]), style="dim", markup=False)
            if done.report.get("sample"):
                smp = done.report["sample"]
                console.print(f"sample ({smp['request']}): ...{smp['prompt_end']!r} -> {smp['output']!r}",
                              style="dim", markup=False)
            console.print(_engine_line(done.engine), style="dim", markup=False)
            render_diagnosis(done.diagnosis, console)
            console.print(f"traces in {out}/ (probe.rank*.json for srtscope diagnose, chrome.rank*.json for "
                          f"ui.perfetto.dev), report.html{''.join(', ' + str(p) for p in written)}",
                          style="dim", markup=False)
        report_output_errors(errors)     # one line each; 1 when a renderer failed, 2 when a target could not be written
