"""What every report says of a diagnosis, whatever renders it (the terminal's ``render``, Markdown,
HTML): the caveats, the evidence the default view shows and the share lines that stand for the
rest, why a device figure may look impossible, and whether a trace's steps speak of graph replay.
Plain strings from the JSON contract; no rendering library."""
from __future__ import annotations

from typing import Any

from srtscope.analyzers.model.units import clean_text, fmt_ns


def caveat_lines(d: dict[str, Any]) -> list[str]:
    """The capture's warnings and the verdict's own caveats, each once (``code: message``)."""
    out, codes = [], set()
    for w in (d.get("capture") or {}).get("warnings") or []:
        if isinstance(w, dict):
            codes.add(str(w.get("code")))
            out.append(f"{w.get('code')}: {w.get('message', '')}")
        else:
            out.append(str(w))
    for c in (d.get("verdict") or {}).get("caveats") or []:
        if str(c).split(":", 1)[0] not in codes:
            out.append(str(c))
    return [clean_text(x, 400) for x in out]


#: evidence kinds the default view leaves to its tables (device, bubbles, kernels, what-if) or
#: folds into the two share lines; ``--full`` prints them all
_TABLED = ("device_split", "sub_threshold", "comm.exposed", "top_kernel", "steps", "what_if")
MINOR = 0.05       # evidence of a range/stage under this share of bubble time: --full only


def _shares(evidence: list[dict], prefix: str, what: str) -> str:
    items = [e for e in evidence if str(e.get("kind", "")).startswith(prefix)]
    parts = [clean_text(e.get("text", ""), 80).replace(f" of {what}", "").replace(": ", " ") for e in items]
    return f"% of {what}: " + " · ".join(parts) if parts else ""


def default_evidence(d: dict[str, Any]) -> tuple[list[dict], list[str], list[dict]]:
    """The verdict's evidence as the default view shows it: (the findings shown, the share lines
    that stand for the per-cause and per-class findings, the findings left to ``--full``)."""
    v = d.get("verdict", {})
    evidence = [e if isinstance(e, dict) else {"kind": "", "text": e} for e in v.get("evidence") or []]
    idle = int((d.get("bubbles") or {}).get("total_ns") or 0)

    def minor(e: dict) -> bool:     # a range or stage holding under MINOR of the bubble time
        k = str(e.get("kind"))
        return (k == "user_range" or k.startswith("stage.")) and e.get("unit") == "ns" and \
            float(e.get("value") or 0) < MINOR * idle

    def folded(e: dict) -> bool:
        return str(e.get("kind")).startswith(("cause.", "class.")) or e.get("kind") in _TABLED or minor(e)

    shares = [_shares(evidence, "class.", "bubble time")]
    if not v.get("alternatives"):       # the alternatives line gives the other causes' shares
        shares.insert(0, _shares(evidence, "cause.", "lost time"))
    return [e for e in evidence if not folded(e)], [s for s in shares if s], [e for e in evidence if folded(e)]


def busy_note(d: dict[str, Any]) -> str:
    """Why a device figure may look impossible: busy time summed over devices (more than the
    window), and parts that overlap (collectives beside kernels: shares past 100%)."""
    dv = d.get("device") or {}
    busy = int(dv.get("busy_ns") or 0)
    devices = len((d.get("capture") or {}).get("devices") or [])
    parts = int(dv.get("kernel_ns") or 0) + int(dv.get("comm_ns") or 0) + int(dv.get("memset_ns") or 0) \
        + sum(int(c.get("ns") or 0) for c in (dv.get("memcpy") or {}).values())
    why = [f"summed over {devices} devices"] if devices > 1 else []
    if busy and parts > busy * 1.001:
        why.append("parts overlap: shares add past 100%")
    return f" ({'; '.join(why)})" if why else ""


#: step sources that are an inference engine's own steps (graph replay or eager means something there)
ENGINE_SOURCES = ("loop.step", "sglang", "vllm")


def graph_split(s: dict[str, Any]) -> str:
    """``" (3 graph replay, 2 eager)"`` where that split means something: some step replayed a CUDA
    graph, or the steps are an engine's; "" for other programs (a solver's loop is neither)."""
    if not s.get("graph") and s.get("source") not in ENGINE_SOURCES:
        return ""
    return f" ({s.get('graph', 0)} graph replay, {s.get('eager', 0)} eager)"




def copy_memory(c: dict[str, Any]) -> str:
    """What host memory one direction's copies used, as the export says per copy: all pageable, or
    how much of it ("" when none was: pinned or device memory)."""
    page, ns = int(c.get("pageable_ns") or 0), int(c.get("ns") or 0)
    if not page:
        return ""
    return " (pageable)" if page >= ns else f" ({fmt_ns(page)} of it pageable)"
