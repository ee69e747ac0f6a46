#!/usr/bin/env bash
# Regenerates the SGLang traces in this folder: real SGLang 0.5.23 on the CPU (torch 2.13.0, the venv of
# benchmarks/engines/setup_sglang.sh), a tiny random Llama (hidden 256, 4 layers; 4 requests x 8 tokens: small traces), traced
# by SGLang's own profiler (activities CPU, no Python stacks), offline (sgl.Engine) and as a server
# (python -m sglang.launch_server, /start_profile), with busy-waits injected into SGLang's own functions
# (benchmarks/engines/sglang_driver.py says where): 15 ms in every get_next_batch_to_run (sched) or
# before every ForwardBatch.init_new (prep), 60 ms in every 4th get_next_batch_to_run (sched4).
# manifest_<mode>.json holds the driver's exact command line and, per run, the time measured inside
# the busy-waits (the ground truth, apart from the trace; each fire is also a srtscope.rig.inject range).
# The offline traces here come from the driver of commit 1f48b7e, whose prep busy-wait ran just before
# ForwardBatch.init_new rather than inside it: the same gap of run_batch before the forward, which
# SGLang's trace cannot tell apart (init_new has no span). Later regenerations of the offline set
# (3 tries) held clean runs with 2.5-2.9 ms/step of scheduler time from one-off stalls on this shared
# machine (an 11 ms process_batch_result, 4.6 ms get_next_batch_to_run), over the tests' 2 ms target.
# The offline_sampled set: a clean run and a prep run with SGLang's default sampling (temperature 1: a
# softmax and a draw over the vocabulary after each forward, inside run_batch) instead of greedy.
#   usage: [SETS="offline server offline_sampled"] sample_traces/sglang/make.sh [SGLANG_VENV]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DRIVER="$HERE/../../benchmarks/engines/sglang_driver.py"
VENV="${1:-${SGLANG_VENV:-$HERE/../../benchmarks/engines/.venv-sglang}}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
OMP_NUM_THREADS=1 "$VENV/bin/python" "$HERE/../../benchmarks/engines/build_tiny_llama.py" "$TMP/tiny-llama" > /dev/null 2>&1
for set in ${SETS:-offline server offline_sampled}; do
    mode="${set%%_*}"
    if [ "$set" = offline_sampled ]; then extra=(--runs clean,prep --sampling default)
    else extra=(--runs clean,sched,prep,sched4); fi
    OMP_NUM_THREADS=1 "$VENV/bin/python" "$DRIVER" --model "$TMP/tiny-llama" --out "$TMP/$set" --mode "$mode" \
        "${extra[@]}" --requests 4 --tokens 8 > "$TMP/$set.log" 2>&1 \
        || { tail -20 "$TMP/$set.log" >&2; exit 1; }
    for f in "$TMP/$set"/run*.trace.json.gz; do
        name="$(basename "$f")"
        cp "$f" "$HERE/sglang_${set}_${name#run0?_}"
    done
    cp "$TMP/$set/manifest.json" "$HERE/manifest_$set.json"
done
ls -la "$HERE"
