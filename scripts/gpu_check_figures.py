"""Figures of one ``scripts/gpu_check.sh`` folder: printed, and written to ``OUT/figures.json``.

    python scripts/gpu_check_figures.py OUT RUN [RUN ...]

Per run: tokens/s, attention backend, captured graph sizes, share of decode steps replayed from a
CUDA graph, bubble share and verdict from the engine's probe trace, host vs CUDA-event device times
of the forward stages; and, per external capture that
was diagnosed (``RUN.kineto.json.gz``, ``RUN.nsys.sqlite``), its verdict, graph/eager steps and how
many of our stage names it carries. Exit 1 when a run left no report.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

CAPTURES = ("kineto.json.gz", "nsys.sqlite")


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kineto_stages(path: Path) -> int:
    """How many distinct srtscope stage names the Kineto trace's host annotations carry."""
    from srtscope.probes.stages import resolve_stage

    try:
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    except (OSError, ValueError, KeyError):
        return 0
    names = {e.get("name", "").split(" ")[0] for e in events if e.get("cat") == "user_annotation"}
    return sum(resolve_stage(n) is not None for n in names)


def _device_times(probe: dict | None) -> dict[str, dict[str, float]]:
    """Per forward stage: spans, how many carry a CUDA-event ``device_ns``, median host and device
    µs (device times exist on CUDA only)."""
    if not probe:
        return {}
    import statistics

    strings, sp = probe["strings"], probe["spans"]
    out: dict[str, dict[str, float]] = {}
    for stage in ("run.graph_replay", "run.eager", "comm.all_reduce"):
        host, dev = [], []
        for i, n in enumerate(sp["name"]):
            if strings[n] != stage:
                continue
            host.append((sp["end_ns"][i] - sp["start_ns"][i]) / 1e3)
            a = sp["attrs"][i] or {}
            if "device_ns" in a:
                dev.append(float(a["device_ns"]) / 1e3)
        if host:
            out[stage] = {"spans": len(host), "with_device_time": len(dev),
                          "host_us_p50": statistics.median(host),
                          "device_us_p50": statistics.median(dev) if dev else None}
    return out


def _decode_graph_share(diagnosis: dict) -> float | None:
    per = diagnosis["steps"].get("per_step", [])
    dec = [s for s in per if s.get("mode") == "decode"]
    return sum(s.get("exec") == "graph" for s in dec) / len(dec) if dec else None


def run_figures(out: Path, name: str) -> dict | None:
    rep, diag = _load(out / name / "workload_report.json"), _load(out / name / "diagnosis.json")
    probe = _load(out / name / "probe.rank0.json")
    if rep is None or diag is None:
        return None
    meta = (probe or {}).get("meta", {})
    fig: dict[str, Any] = {
        "output_tok_per_s": rep["output_tok_per_s"], "cache_hit_rate": rep["cache_hit_rate"],
        "device_name": meta.get("device_name"), "attention_backend": meta.get("attention_backend"),
        "graph_capture_bs": meta.get("graph_capture_bs"), "nvtx": meta.get("nvtx"),
        "decode_graph_share": _decode_graph_share(diag),
        "steps_graph": diag["steps"]["graph"], "steps_eager": diag["steps"]["eager"],
        "eager_reasons": diag["steps"].get("eager_reasons", {}),
        "bubble_share": diag["bubbles"].get("idle_share", 0.0),
        "verdict": diag["verdict"]["bottleneck"], "confidence": diag["verdict"]["confidence"],
        "summary": diag["verdict"]["summary"], "device_times": _device_times(probe), "captures": {}}
    for kind in CAPTURES:
        trace = out / f"{name}.{kind}"
        if not trace.exists():
            continue
        d = _load(Path(f"{trace}.diagnosis.json"))
        cap: dict[str, Any] = {"diagnosed": d is not None}
        if kind.startswith("kineto"):
            cap["stage_names"] = _kineto_stages(trace)
        if d is not None:
            cap.update(verdict=d["verdict"]["bottleneck"], confidence=d["verdict"]["confidence"],
                       steps_graph=d["steps"]["graph"], steps_eager=d["steps"]["eager"],
                       decode_graph_share=_decode_graph_share(d),
                       bubble_share=d["bubbles"].get("idle_share", 0.0))
        fig["captures"][kind] = cap
    return fig


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: gpu_check_figures.py OUT RUN [RUN ...]", file=sys.stderr)
        return 2
    out, names = Path(argv[0]), argv[1:]
    figures, status = {}, 0
    for name in names:
        f = figures[name] = run_figures(out, name)
        if f is None:
            print(f"{name}: run failed (no report)")
            status = 1
            continue
        print(f"{name}: {f['output_tok_per_s']:.0f} output tok/s on {f['device_name']} "
              f"({f['attention_backend']} attention, graphs for bs {f['graph_capture_bs']}, "
              f"NVTX {f['nvtx']})")
        print(f"  probe trace: decode steps graph-replayed {_pct(f['decode_graph_share'])} "
              f"(graph {f['steps_graph']}, eager {f['steps_eager']} {f['eager_reasons']}), "
              f"bubble share {_pct(f['bubble_share'])}, verdict {f['verdict']} "
              f"({f['confidence']:.2f}): {f['summary']}")
        for stage, t in f["device_times"].items():
            dev = "no device time" if t["device_us_p50"] is None else \
                f"device p50 {t['device_us_p50']:.0f} us ({t['with_device_time']} timed)"
            print(f"  {stage}: {t['spans']} spans, host p50 {t['host_us_p50']:.0f} us, {dev}")
        for kind, c in f["captures"].items():
            stages = f", {c['stage_names']} stage names" if "stage_names" in c else ""
            if not c["diagnosed"]:
                print(f"  {kind}: not diagnosed{stages}")
                continue
            print(f"  {kind}: verdict {c['verdict']} ({c['confidence']:.2f}), graph {c['steps_graph']} "
                  f"eager {c['steps_eager']} steps, decode graph-replayed "
                  f"{_pct(c['decode_graph_share'])}, bubble share {_pct(c['bubble_share'])}{stages}")
    (out / "figures.json").write_text(json.dumps(figures, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
