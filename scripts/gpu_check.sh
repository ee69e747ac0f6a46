#!/usr/bin/env bash
# The one prepared GPU check. On a machine with one CUDA GPU and no network, in a few minutes:
#   1. the `gpu`-marked tests;
#   2. a shared-prefix run with CUDA graphs + overlap, and one with cuda_graph_max_bs below the batch
#      size (forced eager fallback), each under `srtscope capture --backend torch` (and nsys if present);
#   3. `srtscope diagnose` on each capture; prints tokens/s, graph-replay share of decode steps, bubble
#      share and verdicts (scripts/gpu_check_figures.py, also written to OUT_DIR/figures.json);
#   4. the what-if's forced-eager-fallback accuracy (benchmarks/what_if_accuracy.py --parts eager);
#   5. leaves the traces in the folder given as the first argument, and the few worth keeping (figures,
#      the two Kineto traces and the diagnoses, the what-if table; 8 files) in OUT_DIR/bundle.
# Usage: scripts/gpu_check.sh OUT_DIR
#   PYTHON=python3 (default)   SRTSCOPE_CHECK_DEVICE=cuda (default; `cpu` rehearses the same steps
#   without a GPU: the forward spans stand in for device activity, in the Kineto traces too)
#   SRTSCOPE_CHECK_REQUESTS=48 (requests per run)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_out}"
PY="${PYTHON:-python3}"
DEVICE="${SRTSCOPE_CHECK_DEVICE:-cuda}"
REQUESTS="${SRTSCOPE_CHECK_REQUESTS:-48}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
status=0

echo "== environment (device $DEVICE)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" - "$DEVICE" <<'PY' || exit 2
import importlib.util, sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"available={torch.cuda.is_available()}")
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(0))
elif sys.argv[1] == "cuda":
    sys.exit("srtscope: error: no CUDA device; SRTSCOPE_CHECK_DEVICE=cpu rehearses the check on the CPU")
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
timeout 300 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -n 25
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "gpu tests: exit $rc"; status=1; }

SRT=("$PY" -m srtscope)
run_case () {  # name, extra run args...
  local name="$1"; shift
  local run=(-m srtscope run --device "$DEVICE" --workload shared-prefix --requests "$REQUESTS"
             --max-new-tokens 24 --json "$@")
  echo "== run: $name"
  # the engine's own probe trace first, uncaptured: its figures stand even if a capture fails
  timeout 240 "$PY" "${run[@]}" --out "$OUT/$name" > "$OUT/$name.run.json" || status=1
  timeout 240 "${SRT[@]}" capture --backend torch --out "$OUT/$name.kineto.json.gz" -- \
      "$PY" "${run[@]}" --out "$OUT/$name.torchrun" > /dev/null || status=1
  if command -v nsys >/dev/null 2>&1; then
    timeout 240 "${SRT[@]}" capture --backend nsys --out "$OUT/$name.nsys" -- \
        "$PY" "${run[@]}" --out "$OUT/$name.nsysrun" > /dev/null || status=1
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

echo "== what-if accuracy: forced eager fallback (5 alternating pairs)"
timeout 300 "$PY" -m benchmarks.what_if_accuracy --parts eager --repeats 5 --eager-device "$DEVICE" \
    --json "$OUT/what_if_eager.json" > "$OUT/what_if_eager.txt" 2>&1 || status=1
tail -n 8 "$OUT/what_if_eager.txt"

echo "== figures"
"$PY" scripts/gpu_check_figures.py "$OUT" graphs_overlap eager_fallback || status=1
if [ -f "$OUT/eager_fallback/diagnosis.json" ] && [ -f "$OUT/graphs_overlap/diagnosis.json" ]; then
  echo "== compare: eager fallback (before) vs graphs + overlap (after)"
  COLUMNS=100 "${SRT[@]}" compare "$OUT/eager_fallback/diagnosis.json" "$OUT/graphs_overlap/diagnosis.json" \
      || status=1
fi
# the few files worth keeping, flat, for a machine that hands back only a handful (<= 8)
mkdir -p "$OUT/bundle"
cp "$OUT/figures.json" "$OUT"/*.kineto.json.gz "$OUT"/*.kineto.json.gz.diagnosis.json "$OUT/what_if_eager.txt" \
   "$OUT/bundle/" 2>/dev/null
for name in graphs_overlap eager_fallback; do
  [ -f "$OUT/$name/diagnosis.json" ] && cp "$OUT/$name/diagnosis.json" "$OUT/bundle/$name.probe.diagnosis.json"
done
echo "== traces in $OUT (kept in $OUT/bundle)"
ls -la "$OUT" "$OUT/bundle"
exit $status
