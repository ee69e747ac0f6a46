#!/usr/bin/env bash
# Makes the rig's own venv with SGLang 0.5.23 on the CPU, from the package index alone, and builds two
# tiny random Llamas offline into VENV/tiny-llama (hidden 256, 4 layers) and VENV/tiny-llama-decode
# (hidden 384, 12 layers). The driver imports nothing of srtscope: the analysis runs in srtscope's venv.
#   usage: benchmarks/engines/setup_sglang.sh [VENV]   (default: $SGLANG_VENV or benchmarks/engines/.venv-sglang)
#
# Why it is not `pip install sglang`: sglang 0.5.23's metadata pins torch 2.14.1 and CUDA-only wheels
# (sglang-kernel, FlashInfer, cutlass-dsl, DeepEP, ...; no sdist, no CPU build). Without AMX (these
# machines have avx512, no AMX) SGLang's CPU path never calls its kernels: every layer takes its
# forward_native torch path. So:
#   1. torch==2.13.0 (the CPU build), then sglang==0.5.23 --no-deps;
#   2. the dependencies its CPU path imports (sglang_shims/requirements-cpu.txt), torch held at 2.13.0;
#   3. torchvision==0.28.0 --no-deps: SGLang imports torchvision.transforms at start-up, and the index's
#      0.28.0 is a CUDA build whose operators do not load: sglang_shims/torchvision_ops_shim.py defines
#      the two operator schemas torchvision needs at import (no kernels), hooked in by a .pth file;
#   4. sglang_shims/sgl_kernel: a stub of the CUDA kernel package, whose few names SGLang imports at
#      start-up under SGLANG_USE_CPU_ENGINE=1; each raises NotImplementedError if ever called (never,
#      on this path).
# Run SGLang with SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 (sglang_driver.py sets both).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-${SGLANG_VENV:-$HERE/.venv-sglang}}"
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
PYTHON="${PYTHON:-python3}"
PIP=(-m pip install -q --disable-pip-version-check)

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
HOLD="$(mktemp)"
trap 'rm -f "$HOLD"' EXIT
echo "torch==$TORCH_VERSION" > "$HOLD"
"$PY" "${PIP[@]}" "torch==$TORCH_VERSION"
"$PY" "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
"$PY" "${PIP[@]}" -c "$HOLD" -r "$HERE/sglang_shims/requirements-cpu.txt"
"$PY" "${PIP[@]}" --no-deps "torchvision==0.28.0"
# the shims, copied into the venv's site-packages (the venv does not read this checkout)
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/sgl_kernel"
cp -r "$HERE/sglang_shims/sgl_kernel" "$SITE/sgl_kernel"
cp "$HERE/sglang_shims/torchvision_ops_shim.py" "$SITE/srtscope_rig_torchvision_ops_shim.py"
echo "import srtscope_rig_torchvision_ops_shim as m; m.install()" > "$SITE/srtscope_rig_torchvision_ops_shim.pth"
SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 "$PY" -c "import sglang, sglang.srt.entrypoints.engine" \
    || { echo "setup_sglang.sh: SGLang $SGLANG_VERSION does not import in $VENV" >&2; exit 1; }
[ -f "$VENV/tiny-llama/config.json" ] || OMP_NUM_THREADS=1 "$PY" "$HERE/build_tiny_llama.py" "$VENV/tiny-llama"
[ -f "$VENV/tiny-llama-decode/config.json" ] || OMP_NUM_THREADS=1 "$PY" "$HERE/build_tiny_llama.py" \
    "$VENV/tiny-llama-decode" --layers 12 --hidden 384 --intermediate 1024
echo "SGLang $SGLANG_VERSION venv ready: $VENV (models: $VENV/tiny-llama, $VENV/tiny-llama-decode)"
