#!/usr/bin/env bash
# The one prepared GPU check. On a machine with one CUDA GPU and no network, in a few minutes:
#   1. the `gpu`-marked tests;
#   2. a shared-prefix run with CUDA graphs + overlap, and one with cuda_graph_max_bs below the batch
#      size (forced eager fallback), each under `srtscope capture --backend torch` (and nsys if present);
#   3. `srtscope diagnose` on each; prints tokens/s, graph-replay share of decode steps, bubble share,
#      verdicts;
#   4. copies the traces into the folder given as the first argument.
# Usage: scripts/gpu_check.sh OUT_DIR        (PYTHON=python3 by default; runs from the repo root)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_out}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
status=0

echo "== environment"
"$PY" - <<'PY' || exit 2
import importlib, torch
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, available={torch.cuda.is_available()}")
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(0))
missing = [m for m in ("typer", "rich", "pandas", "numpy", "nvtx", "pynvml", "safetensors", "pytest")
           if importlib.util.find_spec(m) is None]
print("missing python packages:", ", ".join(missing) or "none")
try:
    import flashinfer  # noqa: F401
    print("flashinfer: available")
except Exception as exc:
    print(f"flashinfer: not available ({type(exc).__name__}); the torch-native attention backend runs")
PY

echo "== gpu tests"
"$PY" -m pytest -q -m gpu tests 2>&1 | tail -n 25 || status=1

SRT=("$PY" -m cli.app)
run_case () {  # name, extra run args...
  local name="$1"; shift
  echo "== run: $name"
  "${SRT[@]}" capture --backend torch --out "$OUT/$name.kineto.json.gz" -- \
      "$PY" -m cli.app run --device cuda --workload shared-prefix --requests 48 \
      --max-new-tokens 24 --out "$OUT/$name" --json "$@" > "$OUT/$name.run.json" || status=1
  if command -v nsys >/dev/null 2>&1; then
    "${SRT[@]}" capture --backend nsys --out "$OUT/$name.nsys" -- \
        "$PY" -m cli.app run --device cuda --workload shared-prefix --requests 48 \
        --max-new-tokens 24 --out "$OUT/$name.nsysrun" --json "$@" > /dev/null || status=1
  else
    echo "nsys not installed: skipping the Nsight Systems capture"
  fi
  for trace in "$OUT/$name.kineto.json.gz" "$OUT/$name.nsys.sqlite"; do
    [ -f "$trace" ] || continue
    # a failed diagnosis leaves no (empty) JSON behind for the figures step to trip on
    "${SRT[@]}" diagnose "$trace" --json > "$trace.diagnosis.json" \
        || { status=1; rm -f "$trace.diagnosis.json"; }
  done
}
run_case graphs_overlap --overlap --cuda-graph-max-bs 64
run_case eager_fallback --no-overlap --cuda-graph-max-bs 4

echo "== figures"
"$PY" - "$OUT" <<'PY' || status=1
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("graphs_overlap", "eager_fallback"):
    rep = out / name / "workload_report.json"
    probe = out / name / "diagnosis.json"
    if not rep.exists() or not probe.exists():
        print(f"{name}: run failed (no report)"); continue
    r, d = json.loads(rep.read_text()), json.loads(probe.read_text())
    per = d["steps"].get("per_step", [])
    dec = [s for s in per if s.get("mode") == "decode"]
    share = sum(s.get("exec") == "graph" for s in dec) / len(dec) if dec else 0.0
    print(f"{name}: {r['output_tok_per_s']:.0f} output tok/s, decode steps graph-replayed "
          f"{share:.0%}, bubble share {d['bubbles'].get('idle_share', 0):.0%}, "
          f"probe verdict {d['verdict']['bottleneck']} ({d['verdict']['summary']})")
    for kind in ("kineto.json.gz", "nsys.sqlite"):
        p = out / f"{name}.{kind}.diagnosis.json"
        if p.exists():
            try:
                k = json.loads(p.read_text())
            except ValueError as exc:
                print(f"  {kind}: unreadable diagnosis ({exc})"); continue
            print(f"  {kind}: verdict {k['verdict']['bottleneck']}, steps graph={k['steps']['graph']} "
                  f"eager={k['steps']['eager']}, bubble share {k['bubbles'].get('idle_share', 0):.0%}")
PY
echo "== traces in $OUT"
ls -la "$OUT" | head -40
exit $status
