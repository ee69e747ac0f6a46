"""Which tool names the right cause? srtscope vs nsys-ai (vs HTA) on the labelled scenarios in sample_traces/.

    .venv/bin/python benchmarks/compare_findings.py [--setup]

Every scenario in sample_traces/expected.json (files, expected bottleneck, summary prefix = the cause,
extra checks) goes through
  srtscope  `srtscope diagnose FILES --json`: yes = right bottleneck AND the summary names the cause
            (prefix) AND the checks hold (straggler rank, eager reason/count, healthy); partial = right
            bottleneck only; no otherwise.
  nsys-ai   `nsys-ai diagnose FILE --format json` (its default skill pack, ranked findings), once per
            rank file (it takes one profile), on copies under $SRTSCOPE_BENCH_CACHE because nsys-ai
            writes a cache next to the file. Judged by the rule table CAUSE_TERMS below, on the findings'
            labels: yes = a warning-or-worse finding names the cause; partial = only an info finding
            names it, or a finding names the right side only (e.g. "CPU-bound" for a scheduler/prep
            problem, "communication-bound" without the straggler); no otherwise. For "healthy", yes =
            no warning-or-worse finding. Its top findings are printed verbatim so the judgement can
            be checked.
  HTA       reads Kineto JSON only; the scenarios are nsys SQLite exports -> not applicable.
  nsys recipes need the nsys binary -> unavailable.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import common as C  # noqa: E402

SCEN = C.ROOT / "sample_traces"
CPU = r"cpu[- ]bound|cpu stall|cpu_stall|host|starv"
# cause (summary prefix) -> (exact pattern, partial pattern) on nsys-ai finding labels (case-insensitive)
CAUSE_TERMS: dict[str, tuple[str, str]] = {
    "scheduler-bound": (r"schedul", CPU),
    "prep-bound": (r"\bprep|batch prep|prepare", CPU),
    "host-sync-bound": (r"synchroni[sz]|\bsync\b|sync stall|blocking", CPU),
    "kernel-bound": (r"dominat|kernel hotspot", r"hotspot|compute[- ]bound"),
    "launch-bound": (r"launch", CPU),
    "communication-bound": (r"straggl|skew|late rank|arriv", r"communication|nccl"),
}
EAGER_TERMS = (r"eager|graph fallback|not captured|cuda graph", r"launch|" + CPU)
SEV = {"critical": 3, "error": 3, "high": 3, "warning": 2, "medium": 2, "info": 1, "low": 1}


def judge_srtscope(exp: dict, out: dict | None) -> tuple[str, str]:
    if not out:
        return "failed", ""
    v = out.get("verdict") or {}
    said = f"{v.get('bottleneck')}: {v.get('summary', '')[:90]}"
    right_b = v.get("bottleneck") == exp["bottleneck"]
    right_cause = str(v.get("summary", "")).startswith(exp["summary_prefix"])
    checks, bad = exp.get("checks", {}), []
    for k, want in checks.items():
        got = {"straggler_rank": (out.get("comm") or {}).get("straggler_rank"),
               "healthy": v.get("healthy"),
               "eager_decode_steps": (out.get("eager") or {}).get("eager_decode_steps"),
               "eager_reason": next(iter(((out.get("eager") or {}).get("reasons") or {}) or {None: 0}))}.get(k)
        if got != want:
            bad.append(f"{k}={got} (want {want})")
    if right_b and right_cause and not bad:
        return "yes", said
    if right_b:
        return "partial", said + (f"; {', '.join(bad)}" if bad else "; cause not named")
    return "no", said


def judge_nsys_ai(exp: dict, findings: list[dict]) -> tuple[str, str]:
    ranked = sorted(findings, key=lambda f: (-SEV.get(str(f.get("severity")).lower(), 0),
                                             -(f.get("confidence") or 0)))
    top = "; ".join(dict.fromkeys(f"{f.get('severity')}: {f.get('label')}" for f in ranked))[:150]
    warn = [f for f in findings if SEV.get(str(f.get("severity")).lower(), 0) >= 2]
    if exp["summary_prefix"] == "healthy":
        return ("yes" if not warn else "no"), top or "(no findings)"
    exact, partial = (EAGER_TERMS if "eager_reason" in exp.get("checks", {})
                      else CAUSE_TERMS.get(exp["summary_prefix"], (r"$^", r"$^")))
    lab = lambda f: str(f.get("label", "")) + " " + str(f.get("category", ""))  # noqa: E731
    if any(re.search(exact, lab(f), re.I) for f in warn):
        return "yes", top
    if any(re.search(exact, lab(f), re.I) or re.search(partial, lab(f), re.I) for f in findings):
        return "partial", top
    return "no", top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="(re)run benchmarks/peers/setup_peers.sh first")
    args = ap.parse_args(argv)
    status = C.start("which tool names the right cause (labelled scenarios in sample_traces/)", args.setup)
    exp_path = SCEN / "expected.json"
    if not exp_path.exists():
        print(f"# {exp_path} missing: generate the scenarios first (python -m sample_traces.generate)")
        return 1
    expected = json.loads(exp_path.read_text())
    work = C.CACHE / "scenarios"
    C.rm_tree(work)
    work.mkdir(parents=True)
    nsys_ai_ok = status.get("nsys-ai", "").startswith("ok")

    rows, results, score = [], [], {"srtscope": 0, "nsys-ai": 0}
    for name, exp in sorted(expected.items()):
        files = [SCEN / f for f in exp["files"]]
        srt = C.run_wait4(C.srtscope_command(files))
        s_ok, s_said = judge_srtscope(exp, srt.out)
        if not srt.ok:
            s_said = srt.stderr.strip().splitlines()[-1][:120] if srt.stderr.strip() else f"rc={srt.rc}"
        n_ok, n_said, findings = "not run", status.get("nsys-ai", ""), []
        if nsys_ai_ok:
            errs = []
            for f in files:
                copy = work / f.name
                shutil.copy(f, copy)
                r = C.run_wait4([str(C.PEER_VENV / "bin" / "nsys-ai"), "diagnose", str(copy), "--format", "json"],
                                env=C.peer_env())
                if r.out is None and r.rc == 0:
                    try:
                        r.out = json.loads(r.stderr) if r.stderr.strip().startswith("{") else None
                    except json.JSONDecodeError:
                        pass
                if r.out is not None:
                    findings += [dict(x, _file=f.name) for x in r.out.get("findings", [])]
                else:
                    last = r.stderr.strip().splitlines()[-1][:100] if r.stderr.strip() else ""
                    errs.append(f"{f.name}: rc={r.rc} {last}")
            if errs and not findings:
                n_ok, n_said = "failed", "; ".join(errs)
            else:
                n_ok, n_said = judge_nsys_ai(exp, findings)
        score["srtscope"] += s_ok == "yes"
        score["nsys-ai"] += n_ok == "yes"
        cause = exp["summary_prefix"] + (f" ({', '.join(f'{k}={v}' for k, v in exp['checks'].items())})"
                                         if exp.get("checks") else "")
        rows.append([name, f"{exp['bottleneck']} / {cause}", s_ok, s_said, n_ok, n_said, "n/a (Kineto only)"])
        results.append({"scenario": name, "expected": exp, "srtscope": {"judged": s_ok, "said": s_said,
                        "wall_s": srt.wall_s}, "nsys_ai": {"judged": n_ok, "said": n_said,
                        "findings": [{k: f.get(k) for k in ("severity", "category", "label", "confidence", "_file")}
                                     for f in findings]}})
    print()
    print(C.table(["scenario", "expected (bottleneck / cause)", "srtscope", "srtscope says",
                   "nsys-ai", "nsys-ai findings (most severe first)", "HTA"], rows))
    print(f"\nright cause named: srtscope {score['srtscope']}/{len(rows)}, nsys-ai {score['nsys-ai']}/{len(rows)}; "
          f"HTA n/a (reads Kineto only); nsys recipes unavailable (no nsys binary)")
    print(f"results: {C.save_results('compare_findings', {'machine': C.cores(), 'score': score, 'results': results})}")
    C.rm_tree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
